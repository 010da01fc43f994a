/**
 * @platformatic/kafka's errors in outboxkit's terms (see src/kafka/kafkajs/errors.ts for the same
 * distinction over kafkajs). Recognised by the client's error `code` (`PLT_KFK_*`) and, for the
 * broker's answers, by the Kafka protocol error name it carries as `apiId`; never by message text.
 * No run-time import of the package.
 */
import { RECORD_ERROR_TYPES } from '../kafkajs/errors.js';
import { isOutboxkitError } from '../../errors.js';
import { TOPIC_REFUSAL_CODES } from '../topic-refused.js';
import type { KafkaFailure } from '../types.js';
import { brokersUnreachableError, UNREACHABLE_SOCKET_CODES } from '../unreachable.js';

/** Protocol error names by which the cluster says a partition cannot take writes now. */
const PARTITION_UNAVAILABLE = new Set([
  'LEADER_NOT_AVAILABLE',
  'NOT_LEADER_OR_FOLLOWER',
  'NOT_ENOUGH_REPLICAS',
  'NOT_ENOUGH_REPLICAS_AFTER_APPEND',
]);

interface PlatformaticErrorShape {
  code?: unknown;
  hasStaleMetadata?: unknown;
  apiId?: unknown;
  canRetry?: unknown;
  cause?: unknown;
  errors?: unknown;
}

/** Every error of `err`'s tree (causes and aggregated errors), `err` first. */
function* errorTree(err: unknown): Generator<PlatformaticErrorShape> {
  const seen = new Set<unknown>();
  const queue: unknown[] = [err];
  while (queue.length > 0) {
    const current = queue.shift();
    if (!current || typeof current !== 'object' || seen.has(current)) continue;
    seen.add(current);
    const e = current as PlatformaticErrorShape;
    yield e;
    if (Array.isArray(e.errors)) queue.push(...(e.errors as unknown[]));
    if (e.cause !== undefined) queue.push(e.cause);
  }
}

/** The first Kafka protocol error name (`apiId`) in `err`'s tree, if any. */
export function protocolErrorName(err: unknown): string | undefined {
  for (const e of errorTree(err)) if (typeof e.apiId === 'string') return e.apiId;
  return undefined;
}

/**
 * The broker's refusal of a CreateTopics request for what it asks (a protocol error whose code is
 * one of {@link TOPIC_REFUSAL_CODES}) in `err`'s tree: its name (`apiId`) and the broker's own
 * message (`serverErrorMessage`, for example `Unknown topic config name: retention.msx`), else the
 * client's text for the error.
 */
export function topicRefusalOf(err: unknown): { name: string; message: string } | undefined {
  for (const e of errorTree(err)) {
    const x = e as PlatformaticErrorShape & { apiCode?: unknown; serverErrorMessage?: unknown; message?: unknown };
    if (typeof x.apiId === 'string' && typeof x.apiCode === 'number' && TOPIC_REFUSAL_CODES.has(x.apiCode)) {
      const message =
        typeof x.serverErrorMessage === 'string' && x.serverErrorMessage !== ''
          ? x.serverErrorMessage
          : typeof x.message === 'string'
            ? x.message
            : '';
      return { name: x.apiId, message };
    }
  }
  return undefined;
}

/**
 * True when `err` is about the records sent: a protocol error of {@link RECORD_ERROR_TYPES} (too
 * large, topic missing or forbidden, invalid record), or the client's own `PLT_KFK_USER` error of a
 * record it could not serialise ("Failed to serialize a message.").
 */
export function isPlatformaticRecordError(err: unknown): boolean {
  for (const e of errorTree(err)) {
    if (typeof e.apiId === 'string' && RECORD_ERROR_TYPES.has(e.apiId)) return true;
  }
  return (err as PlatformaticErrorShape | null)?.code === 'PLT_KFK_USER';
}

/**
 * True when `err`'s tree holds an authentication failure: the client's `PLT_KFK_AUTHENTICATION`
 * error or the broker's SASL_AUTHENTICATION_FAILED (wrong credentials, an unknown user, a mechanism
 * the broker does not enable). The client wraps it in a retriable network error ("Connection to
 * host:port failed.") inside "Cannot connect to any broker.", and so retries it.
 */
export function isPlatformaticAuthenticationFailure(err: unknown): boolean {
  for (const e of errorTree(err)) {
    if (e.code === 'PLT_KFK_AUTHENTICATION' || e.apiId === 'SASL_AUTHENTICATION_FAILED') return true;
  }
  return false;
}

/**
 * `err` itself, or for an authentication failure (see {@link isPlatformaticAuthenticationFailure})
 * an error that says so first: `SASL <mechanism> authentication failed: <the broker's message>`,
 * worded as kafkajs words it (`SASL SCRAM SHA256 authentication failed: ...`, `SASL PLAIN ...`), so
 * that an alert or a log search on a wrong password finds it whichever client the relay runs on.
 * The client says only "metadata failed 6 times." at the top of its error. The new error keeps the
 * client's as `cause`, its `code` (`PLT_KFK_AUTHENTICATION`) and `canRetry: false`.
 *
 * @param mechanism - the SASL mechanism of the connection (`PLAIN`, `SCRAM-SHA-256`...), if any.
 */
export function withAuthenticationMessage(err: unknown, mechanism: string | undefined): unknown {
  if (!isPlatformaticAuthenticationFailure(err)) return err;
  let detail: string | undefined;
  for (const e of errorTree(err)) {
    const server = (e as { serverErrorMessage?: unknown }).serverErrorMessage;
    if (typeof server === 'string' && server.length > 0) {
      detail = server;
      break;
    }
  }
  const name = mechanism ? mechanism.toUpperCase().replace(/^SCRAM-SHA-(\d+)$/, 'SCRAM SHA$1') : '';
  const message =
    `SASL ${name ? `${name} ` : ''}authentication failed: ${detail ?? 'the broker refused the credentials'}` +
    ' (check the username, password and mechanism: docs/kafka.md).';
  return Object.assign(new Error(message, { cause: err }), {
    name: 'AuthenticationError',
    code: 'PLT_KFK_AUTHENTICATION',
    canRetry: false,
  });
}

/**
 * `err` itself, or, when no broker could be reached at all, a `BrokerUnavailableError` saying so
 * with the addresses and the sockets' reasons (src/kafka/unreachable.ts), as on kafkajs: its
 * `cause` the client's error. The client's own says `metadata failed 6 times.`, with `connect
 * ECONNREFUSED 127.0.0.1:1` four causes down. Recognised when every error at the leaves of `err`'s
 * tree is a socket error of {@link UNREACHABLE_SOCKET_CODES} and no broker answered (no protocol
 * error, no authentication failure).
 *
 * @param brokers - the client's bootstrap brokers.
 */
export function withUnreachableMessage(err: unknown, brokers: readonly string[]): unknown {
  const reasons: string[] = [];
  for (const e of errorTree(err)) {
    if (typeof e.apiId === 'string' || e.code === 'PLT_KFK_AUTHENTICATION') return err;
    const leaf = e.cause === undefined && !(Array.isArray(e.errors) && e.errors.length > 0);
    if (!leaf) continue;
    if (typeof e.code !== 'string' || !UNREACHABLE_SOCKET_CODES.has(e.code)) return err;
    reasons.push(String((e as { message?: unknown }).message));
  }
  return reasons.length === 0 ? err : brokersUnreachableError(brokers, reasons, err);
}

/**
 * The client's error for a leader that is not among the brokers of its metadata (a partition
 * without a leader, leader -1): a `NetworkError` (`PLT_KFK_NETWORK`) with `hasStaleMetadata` and
 * an own `broker` property that is null or undefined (2.12.1's connection pool; 1.35.0's through
 * ./metadata-fix.ts). The same as kafkajs' KafkaJSBrokerNotFound.
 */
function isNoBrokerError(e: PlatformaticErrorShape): boolean {
  return (
    e.code === 'PLT_KFK_NETWORK' &&
    e.hasStaleMetadata === true &&
    Object.hasOwn(e, 'broker') &&
    (e as { broker?: unknown }).broker == null
  );
}

/** The {@link KafkaFailure} of a failed @platformatic/kafka send. */
export function platformaticFailureOf(err: unknown): KafkaFailure {
  const code = protocolErrorName(err);
  const kind = isPlatformaticRecordError(err) ? 'record' : 'broker';
  let partitionUnavailable = false;
  if (kind === 'broker') {
    for (const e of errorTree(err)) {
      if (typeof e.apiId === 'string' && PARTITION_UNAVAILABLE.has(e.apiId)) partitionUnavailable = true;
      if (isNoBrokerError(e)) partitionUnavailable = true;
    }
  }
  return {
    kind,
    ...(code === undefined ? {} : { code }),
    ...(partitionUnavailable ? { partitionUnavailable: true } : {}),
    error: err instanceof Error ? err : new Error(String(err), { cause: err }),
  };
}

/**
 * Whether an error of @platformatic/kafka may pass on a later attempt: its `canRetry` flag (set
 * from the Kafka protocol's error table, true on network errors), on it or, for an aggregate, on
 * every error it holds; for an outboxkit error of the adapter, its `retriable`.
 */
export function isRetriablePlatformaticError(err: unknown): boolean {
  // The adapter's own errors (brokers that could not be reached: withUnreachableMessage) say it themselves.
  if (isOutboxkitError(err)) return err.retriable;
  const e = err as PlatformaticErrorShape | null;
  if (e?.canRetry === true) return true;
  if (e?.canRetry === false) return false;
  return Array.isArray(e?.errors) && e.errors.length > 0 && e.errors.every(isRetriablePlatformaticError);
}
