/**
 * kafkajs's errors in outboxkit's terms. Errors are recognised by kafkajs's protocol error `type`
 * (the Kafka protocol's error name) and class `name`, never by message text. No run-time import of
 * kafkajs: the package root re-exports {@link isRetriableKafkaError} without loading it.
 *
 * A record's fault (the record is too large, its topic is missing or forbidden) is told from the
 * connection's or the cluster's (broker down, leader moving, timeouts): in the relay only the first
 * kind counts against a row's attempts and can park it, since a broker outage must never park
 * healthy events. The dedup consumer reads the same distinction for its dead-letter sends.
 */
import type { KafkaFailure } from '../types.js';
import { brokersUnreachableError, UNREACHABLE_SOCKET_CODES } from '../unreachable.js';

/** Kafka protocol error types that are a property of the record or its topic. */
export const RECORD_ERROR_TYPES = new Set([
  'MESSAGE_TOO_LARGE',
  'RECORD_LIST_TOO_LARGE',
  'INVALID_RECORD',
  'CORRUPT_MESSAGE',
  'UNKNOWN_TOPIC_OR_PARTITION',
  'TOPIC_AUTHORIZATION_FAILED',
  'INVALID_TOPIC_EXCEPTION',
  'POLICY_VIOLATION',
  'INVALID_REQUIRED_ACKS',
]);

/**
 * Kafka protocol error types (and kafkajs error names) by which the cluster says that a partition
 * cannot take writes now: no leader, a leader that moved, too few in-sync replicas. kafkajs names
 * KafkaJSBrokerNotFound when a partition's leader is -1 (none) in its metadata.
 */
const PARTITION_UNAVAILABLE = new Set([
  'LEADER_NOT_AVAILABLE',
  'NOT_LEADER_FOR_PARTITION',
  'NOT_LEADER_OR_FOLLOWER',
  'NOT_ENOUGH_REPLICAS',
  'NOT_ENOUGH_REPLICAS_AFTER_APPEND',
  'KafkaJSBrokerNotFound',
]);

/** Whether `err`, or an error it wraps, has a protocol type or an error name in `names`. */
function chainHas(err: unknown, names: ReadonlySet<string>): boolean {
  const seen = new Set<unknown>();
  let current: unknown = err;
  while (current && typeof current === 'object' && !seen.has(current)) {
    seen.add(current);
    const { type, name } = current as { type?: unknown; name?: unknown };
    if ((typeof type === 'string' && names.has(type)) || (typeof name === 'string' && names.has(name))) return true;
    const next = current as { cause?: unknown; originalError?: unknown; errors?: unknown[] };
    current = next.cause ?? next.originalError ?? next.errors?.[0];
  }
  return false;
}

/** The protocol error type of `err` or of an error it wraps, if any. */
export function kafkaErrorType(err: unknown): string | undefined {
  const seen = new Set<unknown>();
  let current: unknown = err;
  while (current && typeof current === 'object' && !seen.has(current)) {
    seen.add(current);
    const type = (current as { type?: unknown }).type;
    if (typeof type === 'string') return type;
    const next = current as { cause?: unknown; originalError?: unknown; errors?: unknown[] };
    current = next.cause ?? next.originalError ?? next.errors?.[0];
  }
  return undefined;
}

/**
 * True when `err` is about the records sent, not the connection. kafkajs wraps some of these (a
 * missing topic comes as KafkaJSNumberOfRetriesExceeded whose `cause` has the type), so the
 * chain of causes is followed.
 */
export function isRecordError(err: unknown): boolean {
  const type = kafkaErrorType(err);
  return type !== undefined && RECORD_ERROR_TYPES.has(type);
}

/** The {@link KafkaFailure} of a failed kafkajs send (or of what a `RelayProducer` rejected with). */
export function failureOf(err: unknown): KafkaFailure {
  const code = kafkaErrorType(err);
  const kind = isRecordError(err) ? 'record' : 'broker';
  return {
    kind,
    ...(code === undefined ? {} : { code }),
    ...(kind === 'broker' && chainHas(err, PARTITION_UNAVAILABLE) ? { partitionUnavailable: true } : {}),
    error: err instanceof Error ? err : new Error(String(err), { cause: err }),
  };
}

/**
 * Whether a kafkajs error may pass on a later attempt: its `retriable` flag (kafkajs sets it from
 * the Kafka protocol's error table, and on connection errors), the cause of a
 * KafkaJSNumberOfRetriesExceeded (the client's own retries spent on a retriable error), or every
 * error of a KafkaJSAggregateError being retriable (CreateTopics answers per topic), and
 * KafkaJSGroupCoordinatorNotFound: kafkajs marks it non-retriable once its own lookups are spent,
 * but it is what a broker answers for seconds after a restart, while it loads `__consumer_offsets`
 * (a consumer started then failed its start instead of retrying, test/consumer/start-retry.test.ts).
 */
export function isRetriableKafkaError(err: unknown): boolean {
  const e = err as { retriable?: unknown; name?: unknown; errors?: unknown; cause?: unknown } | null;
  if (e?.retriable === true) return true;
  if (e?.name === 'KafkaJSGroupCoordinatorNotFound') return true;
  if (e?.name === 'KafkaJSNumberOfRetriesExceeded') return isRetriableKafkaError(e.cause);
  return e?.name === 'KafkaJSAggregateError' && Array.isArray(e.errors) && e.errors.every(isRetriableKafkaError);
}

/** kafkajs error types (Kafka protocol errors) that mean this member may lose its partitions. */
const MEMBERSHIP_LOST = new Set([
  'REBALANCE_IN_PROGRESS',
  'ILLEGAL_GENERATION',
  'UNKNOWN_MEMBER_ID',
  'NOT_COORDINATOR_FOR_GROUP',
  'FENCED_INSTANCE_ID',
]);

/** True when a heartbeat error means the group is rebalancing or this member left it. */
export function losesPartitions(err: unknown): boolean {
  const type = (err as { type?: unknown } | null)?.type;
  return typeof type === 'string' && MEMBERSHIP_LOST.has(type);
}

/**
 * `err` itself, or, when it says that no broker could be reached (a KafkaJSConnectionError with a
 * socket code of {@link UNREACHABLE_SOCKET_CODES}, as it comes or as the cause of
 * KafkaJSNumberOfRetriesExceeded, with no protocol answer in the chain), a `BrokerUnavailableError`
 * saying so with the addresses and the socket's reason (src/kafka/unreachable.ts). kafkajs's own
 * message is `Connection error: connect ECONNREFUSED 127.0.0.1:1`, kept as `cause`.
 *
 * @param brokers - the client's bootstrap brokers when known (a client made from a config); else
 *   the broker kafkajs's error names.
 */
export function withUnreachableMessage(err: unknown, brokers?: readonly string[]): unknown {
  const seen = new Set<unknown>();
  let current: unknown = err;
  while (current && typeof current === 'object' && !seen.has(current)) {
    seen.add(current);
    const e = current as { name?: unknown; type?: unknown; code?: unknown; broker?: unknown; message?: unknown };
    // A protocol error: a broker answered.
    if (typeof e.type === 'string') return err;
    if (e.name === 'KafkaJSConnectionError') {
      if (typeof e.code !== 'string' || !UNREACHABLE_SOCKET_CODES.has(e.code)) return err;
      const reason = String(e.message).replace(/^Connection error: /, '');
      const named = brokers?.length ? brokers : typeof e.broker === 'string' ? [e.broker] : [];
      return brokersUnreachableError(named, [reason], err);
    }
    if (e.name !== 'KafkaJSNumberOfRetriesExceeded') return err;
    current =
      (current as { cause?: unknown; originalError?: unknown }).cause ??
      (current as { originalError?: unknown }).originalError;
  }
  return err;
}
