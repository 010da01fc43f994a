/**
 * Options of the idempotency layer, their defaults and their validation.
 */
import { InvalidOptionsError, refuseUnknownOptions } from '../errors.js';
import { noopLogger, type Logger } from '../logger.js';
import { DEFAULT_SCHEMA } from '../constants.js';
import { quoteSchema } from '../schema-name.js';
import type { Registry } from 'prom-client';
import { outcomeCounter, type IdempotencyOutcomeEvent, type OutcomeSinks } from './metrics.js';

/** What a duplicate gets while the first request with its key is still running. */
export type ConcurrencyPolicy = 'reject' | 'wait';

/** Options of `executeIdempotent()` and of the HTTP adapters. */
export interface IdempotencyOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /**
   * (One-transaction mode; lease mode has its own `LeaseOptions.policy`, with `async`.)
   * What a concurrent duplicate gets while the first request holds the key (its claim is not yet
   * committed, so the duplicate meets the first one's row lock):
   * - `reject`: wait at most `lockTimeoutMs`, then {@link KeyInProgressError} (HTTP 409 with
   *   `Retry-After`);
   * - `wait`: wait up to `waitTimeoutMs` for the first to finish, then replay its stored result
   *   (or, if it rolled back, claim the key and execute); 409 after the deadline.
   * @defaultValue 'reject'
   */
  policy?: ConcurrencyPolicy;
  /**
   * Under `reject`: how long a duplicate may wait on the first request's row lock before it gets a
   * 409, in milliseconds (PostgreSQL `lock_timeout` for the claim statement only). Keep it short:
   * every waiting duplicate holds a pooled connection. @defaultValue 100
   */
  lockTimeoutMs?: number;
  /**
   * Under `wait`: the longest a duplicate waits for the first request, in milliseconds. Set it
   * below your clients' timeout and your server's request timeout. Keep the server's
   * `statement_timeout` above it. @defaultValue 10_000
   */
  waitTimeoutMs?: number;
  /**
   * How long a completed (or stored failed) record is kept and replayed, in milliseconds, counted
   * from its completion, by the database clock. After that, the same key starts a new execution
   * (even with a different body), and `cleanupExpiredKeys()` may delete the record. Expiry is
   * decided when the record is read: a retry whose read found it unexpired is replayed even if it
   * expires before the reply is sent. Publish it in your API docs.
   * @defaultValue 86_400_000 (24 hours)
   */
  retentionMs?: number;
  /**
   * Response headers stored with the result and replayed (case-insensitive), besides
   * {@link REPRESENTATION_HEADERS} (`content-type`, `content-encoding`, `content-language`,
   * `content-location`, `content-disposition`, `content-range`, `vary`), which are always kept: a
   * replay needs them to be read as the first response was. Refused: `set-cookie` and
   * credentials, hop-by-hop headers, `content-length` (recomputed on replay). The first response
   * carries every header the handler set.
   * @defaultValue the representation headers plus ['location', 'etag', 'last-modified', 'cache-control', 'expires', 'link']
   */
  replayHeaders?: readonly string[];
  /**
   * Whether a request first looks for a finished record with one plain SELECT, before any
   * transaction. A replay (or a 422) is then answered by that single read, without `BEGIN`, a
   * claim or a row lock. Turn it off for write-mostly routes whose retries are rare: a new key then
   * saves that round trip, and a retry is answered from the claim's conflict inside the claim
   * transaction instead (the same answer: the stored response, a 422 or a 409). Measured in
   * bench/RESULTS.md ("read-first off"). @defaultValue true
   */
  readFirst?: boolean;
  /** `Retry-After` sent with 409 (key in progress) and 503 (store unavailable), in seconds. @defaultValue 1 */
  retryAfterSeconds?: number;
  /** Logger; keys are only ever logged redacted. @defaultValue a no-op logger */
  logger?: Logger;
  /**
   * A prom-client registry: every request increments
   * `outboxkit_idempotency_requests_total{operation,outcome}` in it (outcomes: new, replayed,
   * in_progress, mismatch, takeover, expired, uncertain, store_error). Never labelled by key or
   * tenant. See also `idempotencyGauges()`. @defaultValue none
   */
  registry?: Registry;
  /**
   * Called once per request with its outcome, for any other metrics system. Must not throw (an
   * exception is ignored). @defaultValue none
   */
  onOutcome?: (event: IdempotencyOutcomeEvent) => void;
}

/**
 * Every option name of {@link IdempotencyOptions}, as the keys of a record so that the compiler
 * keeps it in step with the interface (the lease and route option lists spread it). @internal
 */
export const IDEMPOTENCY_OPTION_KEYS = Object.freeze({
  schema: true,
  policy: true,
  lockTimeoutMs: true,
  waitTimeoutMs: true,
  retentionMs: true,
  replayHeaders: true,
  readFirst: true,
  retryAfterSeconds: true,
  logger: true,
  registry: true,
  onOutcome: true,
} satisfies Record<keyof IdempotencyOptions, true>);

/** {@link IdempotencyOptions} with every default applied, validated and frozen. */
export interface ResolvedIdempotencyOptions extends OutcomeSinks {
  readonly schema: string;
  /** `schema` quoted, ready for SQL. */
  readonly quotedSchema: string;
  readonly policy: ConcurrencyPolicy;
  readonly lockTimeoutMs: number;
  readonly waitTimeoutMs: number;
  readonly retentionMs: number;
  readonly readFirst: boolean;
  /** Lower-cased, {@link REPRESENTATION_HEADERS} included. */
  readonly replayHeaders: ReadonlySet<string>;
  readonly retryAfterSeconds: number;
  readonly logger: Logger;
}

/**
 * Response headers always stored and replayed, whatever `replayHeaders` says: those a client needs
 * to read the stored body as it read the first response. The representation metadata of RFC 9110
 * §8 (`content-type`, `content-encoding`, `content-language`, `content-location`; the body of a
 * stored 206 needs its `content-range`, §14.4), `content-disposition` (RFC 6266: how to present
 * the body, its file name) and `vary` (RFC 9110 §12.5.5: which request headers selected this
 * representation, so that caches keep telling them apart). `content-length` is not stored: the
 * adapters compute it for the bytes they send. What a replay whose request refuses the stored
 * `content-encoding` gets: docs/http-contract.md, "Replayed representation".
 */
export const REPRESENTATION_HEADERS: readonly string[] = Object.freeze([
  'content-type',
  'content-encoding',
  'content-language',
  'content-location',
  'content-disposition',
  'content-range',
  'vary',
]);

/** Default idempotency options. */
export const IDEMPOTENCY_DEFAULTS = Object.freeze({
  schema: DEFAULT_SCHEMA,
  policy: 'reject' as ConcurrencyPolicy,
  lockTimeoutMs: 100,
  waitTimeoutMs: 10_000,
  retentionMs: 86_400_000,
  readFirst: true,
  replayHeaders: Object.freeze([
    ...REPRESENTATION_HEADERS,
    'location',
    'etag',
    'last-modified',
    'cache-control',
    'expires',
    'link',
  ]) as readonly string[],
  retryAfterSeconds: 1,
  logger: noopLogger,
});

/**
 * Headers that are never stored nor replayed: credentials and session state (a replay to another
 * connection must not set them), hop-by-hop headers (RFC 9110 §7.6.1) and framing headers that the
 * server recomputes.
 */
export const NEVER_REPLAYED_HEADERS: ReadonlySet<string> = new Set([
  'set-cookie',
  'set-cookie2',
  'authorization',
  'proxy-authenticate',
  'proxy-authorization',
  'www-authenticate',
  'connection',
  'keep-alive',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'content-length',
  'idempotent-replayed',
]);

/** Upper bounds that catch unit mistakes (seconds given as ms and so on). */
const MAX_TIMEOUT_MS = 3_600_000; // 1 h
const MAX_RETENTION_MS = 366 * 86_400_000; // about a year

/**
 * `value` when it is an integer from `min` to `max` (in `unit`, named in the message).
 * @throws {@link InvalidOptionsError} otherwise, naming the option `name`. @internal
 */
export function integerIn(name: string, value: unknown, min: number, max: number, unit: string): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new InvalidOptionsError(`${name} must be an integer from ${min} to ${max} (${unit}), got ${String(value)}.`);
  }
  return value;
}

/**
 * The resolvers of one mode's options (one-transaction mode here, lease mode), over `validate`
 * (which applies the defaults to options whose names are known, validates and freezes them). Both
 * return an options object they made as it is: options are validated once, and may be passed on
 * resolved. @internal
 */
export interface OptionsResolver<O extends object, R extends object> {
  /**
   * For the entry point `what` (named in the errors): refuses a non-object and unknown option
   * names first (naming them and listing the known ones).
   */
  resolveFor(options: O | R | undefined, what: string): R;
  /** For callers that refused unknown names themselves against a wider options type. */
  resolveChecked(options?: O | R): R;
}

/**
 * An {@link OptionsResolver} over `validate`, whose option names are the keys of `keys` (a record
 * such as {@link IDEMPOTENCY_OPTION_KEYS}). @internal
 */
export function optionsResolver<O extends object, R extends object>(
  keys: Readonly<Record<keyof O, true>>,
  validate: (options: O) => R,
): OptionsResolver<O, R> {
  const names = Object.keys(keys);
  const made = new WeakSet<object>();
  const resolveChecked = (options: O | R = {} as O): R => {
    if (made.has(options)) return options as R;
    const resolved = validate(options as O);
    made.add(resolved);
    return resolved;
  };
  return {
    resolveChecked,
    resolveFor(options = {} as O, what) {
      if (made.has(options)) return options as R;
      if (typeof options !== 'object' || options === null)
        throw new InvalidOptionsError(`${what}: options must be an object.`);
      refuseUnknownOptions(options, names, what);
      return resolveChecked(options);
    },
  };
}

const idempotencyResolver = optionsResolver(IDEMPOTENCY_OPTION_KEYS, validateIdempotencyOptions);

/**
 * Applies defaults to `options` and validates them once. An already resolved object is returned
 * as it is.
 *
 * @throws {@link InvalidOptionsError} on an unknown option name (naming it and listing the known
 *   ones), an unknown policy, a duration out of range, an invalid schema name, or a refused replay
 *   header.
 */
export function resolveIdempotencyOptions(
  options: IdempotencyOptions | ResolvedIdempotencyOptions = {},
): ResolvedIdempotencyOptions {
  return idempotencyResolver.resolveFor(options, 'resolveIdempotencyOptions');
}

/**
 * {@link resolveIdempotencyOptions} for the entry point `what` (named in the error of an unknown
 * option name). @internal
 */
export const resolveIdempotencyOptionsFor = idempotencyResolver.resolveFor;

/**
 * {@link resolveIdempotencyOptions} without the check of the option names, for callers that
 * refused unknown names themselves against a wider options type (lease mode, the HTTP routes),
 * whose own options are passed on here. @internal
 */
export const resolveCheckedIdempotencyOptions = idempotencyResolver.resolveChecked;

/** Applies the defaults to options whose names are known, and validates and freezes them. */
function validateIdempotencyOptions(o: IdempotencyOptions): ResolvedIdempotencyOptions {
  const schema = o.schema ?? IDEMPOTENCY_DEFAULTS.schema;
  const quotedSchema = quoteSchema(schema);
  const policy = o.policy ?? IDEMPOTENCY_DEFAULTS.policy;
  if (policy !== 'reject' && policy !== 'wait') {
    throw new InvalidOptionsError(`policy must be 'reject' or 'wait', got ${JSON.stringify(policy)}.`);
  }
  const replay = new Set<string>(REPRESENTATION_HEADERS);
  for (const name of o.replayHeaders ?? IDEMPOTENCY_DEFAULTS.replayHeaders) {
    if (typeof name !== 'string' || !/^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/.test(name)) {
      throw new InvalidOptionsError(`replayHeaders holds an invalid header name: ${JSON.stringify(name)}.`);
    }
    const lower = name.toLowerCase();
    if (NEVER_REPLAYED_HEADERS.has(lower)) {
      throw new InvalidOptionsError(
        `replayHeaders must not include ${JSON.stringify(lower)}: it is never stored nor replayed.`,
      );
    }
    replay.add(lower);
  }
  const logger = o.logger ?? IDEMPOTENCY_DEFAULTS.logger;
  const readFirst = o.readFirst ?? IDEMPOTENCY_DEFAULTS.readFirst;
  if (typeof readFirst !== 'boolean') {
    throw new InvalidOptionsError(`readFirst must be true or false, got ${JSON.stringify(readFirst)}.`);
  }
  if (o.onOutcome !== undefined && typeof o.onOutcome !== 'function') {
    throw new InvalidOptionsError('onOutcome must be a function ({ operation, outcome }) => void.');
  }
  if (o.registry !== undefined && typeof (o.registry as { getSingleMetric?: unknown }).getSingleMetric !== 'function') {
    throw new InvalidOptionsError('registry must be a prom-client Registry.');
  }
  return Object.freeze({
    schema,
    quotedSchema,
    policy,
    // lock_timeout = 0 would mean "wait forever": at least 1 ms.
    lockTimeoutMs: integerIn(
      'lockTimeoutMs',
      o.lockTimeoutMs ?? IDEMPOTENCY_DEFAULTS.lockTimeoutMs,
      1,
      MAX_TIMEOUT_MS,
      'ms',
    ),
    waitTimeoutMs: integerIn(
      'waitTimeoutMs',
      o.waitTimeoutMs ?? IDEMPOTENCY_DEFAULTS.waitTimeoutMs,
      1,
      MAX_TIMEOUT_MS,
      'ms',
    ),
    retentionMs: integerIn('retentionMs', o.retentionMs ?? IDEMPOTENCY_DEFAULTS.retentionMs, 1, MAX_RETENTION_MS, 'ms'),
    readFirst,
    replayHeaders: replay,
    retryAfterSeconds: integerIn(
      'retryAfterSeconds',
      o.retryAfterSeconds ?? IDEMPOTENCY_DEFAULTS.retryAfterSeconds,
      0,
      86_400,
      's',
    ),
    logger,
    ...(o.registry ? { outcomeCounter: outcomeCounter(o.registry) } : {}),
    ...(o.onOutcome ? { onOutcome: o.onOutcome } : {}),
  });
}
