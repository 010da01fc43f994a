/**
 * Options of lease mode ({@link executeLeased}), their defaults and their validation.
 */
import { InvalidOptionsError } from '../errors.js';
import { leaseChannel, operationIdFor } from './lease-store.js';
import type { KeyScope } from './store.js';
import {
  IDEMPOTENCY_OPTION_KEYS,
  integerIn,
  optionsResolver,
  resolveCheckedIdempotencyOptions,
  type IdempotencyOptions,
  type ResolvedIdempotencyOptions,
} from './options.js';

/** What a duplicate gets while a leased execution of its key is live (or its outcome uncertain). */
export type LeasePolicy = 'reject' | 'wait' | 'async';

/** Options of `executeLeased()` (lease mode). Shares retention, headers, logger, ... with one-transaction mode. */
export interface LeaseOptions extends Omit<IdempotencyOptions, 'policy'> {
  /**
   * - `reject`: 409 with `Retry-After` (the seconds left on the lease, at least `retryAfterSeconds`);
   * - `wait`: wait for the owner to finish, woken through LISTEN/NOTIFY on `<schema>_idempotency`
   *   with a poll as the fallback (after 25 ms, then twice as long each time up to
   *   `pollIntervalMs`), at most `waitTimeoutMs` and never past the request's `deadline`, and no
   *   longer than the request's `signal` stays unaborted; then replay, or take over an expired
   *   lease, or 409;
   * - `async`: 202 Accepted with `Location: operationLocation(operationId)` and `Retry-After`;
   *   the caller polls that resource (see `serveOperation()`).
   * @defaultValue 'reject'
   */
  policy?: LeasePolicy;
  /**
   * Length of the lease, in milliseconds, by the database clock. After it, a retry of the same
   * request takes the execution over (new owner token, generation + 1) unless the owner renewed.
   * Keep it well below `retentionMs` and above the handler's usual duration (or renew).
   * @defaultValue 30_000
   */
  leaseMs?: number;
  /**
   * Under `wait`: the longest pause between two looks at the record when no notification comes, in
   * milliseconds. The pauses start at {@link MIN_WAIT_PAUSE_MS} (25 ms) and double up to it: a
   * waiter looks at most 40 times a second, then once per `pollIntervalMs`, plus once per
   * notification of its record. From 25 to 60,000. @defaultValue 500
   */
  pollIntervalMs?: number;
  /**
   * Automatic renewal (opt-in): while the handler runs, the lease is extended by `leaseMs` every
   * `renewEveryMs` milliseconds (one fenced UPDATE in its own short transaction, database clock),
   * so a handler may outlive `leaseMs` without being taken over. Renewal stops when the handler
   * ends. When a renewal finds that another execution took over, renewal stops, `ctx.signal` is
   * aborted with the {@link LeaseLostError}, and the handler's result is not stored (the
   * execution ends with that error). A renewal that fails for another reason (the database
   * unreachable) is logged and tried again at the next interval; the lease may then expire.
   * Must be shorter than `leaseMs`; a third of it leaves room for two missed renewals.
   * @defaultValue none (no automatic renewal; the handler may call `ctx.renew()`)
   */
  renewEveryMs?: number;
  /**
   * Under `async` (required) and for uncertain outcomes: the URL of the operation resource of a
   * record, from its opaque `operationId` (never the key), for example
   * `(id) => '/operations/create-order/' + id`.
   */
  operationLocation?: (operationId: string) => string;
  /**
   * The key of the HMAC-SHA256 that derives each new record's public `operationId` from its
   * tenant, operation and idempotency key (see `operationIdFor()`): 32 bytes or more (a string
   * counts its UTF-8 bytes), the same on every instance of the application, kept secret like a
   * session-signing key (for example `openssl rand -base64 32` in a secret store). The id is
   * stored with the record when it is claimed, so changing the secret (rotation) changes the ids
   * of new records only: ids already handed out keep working. See docs/runbooks.md, "Rotating
   * operationIdSecret".
   * @defaultValue none: an unkeyed hash (HMAC with an empty key), and a process warning
   *   `OUTBOXKIT_OPERATION_ID_UNKEYED` once per process; anyone who sees an operation id (a
   *   `Location` header, a 202 body) and knows the tenant and operation can then test guesses of a
   *   short or predictable key against it. Set it whenever `operationLocation` is, or a 202 body
   *   may reach a client.
   */
  operationIdSecret?: string | Uint8Array;
}

/**
 * Every option name of {@link LeaseOptions}, as the keys of a record so that the compiler keeps it
 * in step with the interface (the lease route's list spreads it). @internal
 */
export const LEASE_OPTION_KEYS = Object.freeze({
  ...IDEMPOTENCY_OPTION_KEYS,
  policy: true,
  leaseMs: true,
  pollIntervalMs: true,
  renewEveryMs: true,
  operationLocation: true,
  operationIdSecret: true,
} satisfies Record<keyof LeaseOptions, true>);

/** {@link LeaseOptions} with every default applied, validated and frozen. */
export interface ResolvedLeaseOptions {
  readonly base: ResolvedIdempotencyOptions;
  readonly policy: LeasePolicy;
  readonly leaseMs: number;
  readonly pollIntervalMs: number;
  /** Automatic renewal interval in ms, or `undefined` (off). */
  readonly renewEveryMs: number | undefined;
  readonly operationLocation: ((operationId: string) => string) | undefined;
  /** The public id a new record of `scope` gets (HMAC-SHA256 under `operationIdSecret`). */
  readonly operationIdOf: (scope: KeyScope) => string;
  readonly channel: string;
}

/** Default lease options (the others are {@link IDEMPOTENCY_DEFAULTS}). */
export const LEASE_DEFAULTS = Object.freeze({ policy: 'reject' as LeasePolicy, leaseMs: 30_000, pollIntervalMs: 500 });

/**
 * Under `wait`, the shortest pause between two looks at a busy record (the first pause), in
 * milliseconds: however the wait is bounded, a waiter makes at most 40 claim attempts a second,
 * and fewer as its pauses double.
 */
export const MIN_WAIT_PAUSE_MS = 25;

/** Fewest bytes of `operationIdSecret`: the output size of SHA-256 (RFC 2104 §3 advises at least that). */
export const MIN_OPERATION_ID_SECRET_BYTES = 32;

/** The code of the process warning that lease mode runs without `operationIdSecret`. */
export const UNKEYED_OPERATION_ID_WARNING = 'OUTBOXKIT_OPERATION_ID_UNKEYED';

let warnedUnkeyed = false;

/** The secret as bytes (a copy: later changes by the caller do not change the ids), validated. */
function operationIdKey(secret: unknown): Buffer {
  if (secret === undefined) {
    if (!warnedUnkeyed) {
      warnedUnkeyed = true;
      process.emitWarning(
        'outboxkit lease mode runs without operationIdSecret: operation ids (Location URLs, 202 bodies, NOTIFY payloads) ' +
          'are an unkeyed hash of the tenant, operation and idempotency key, so a short or predictable key can be ' +
          'recovered from one. Set operationIdSecret to 32 random bytes or more (docs/configuration.md, "Lease mode").',
        { type: 'SecurityWarning', code: UNKEYED_OPERATION_ID_WARNING },
      );
    }
    return Buffer.alloc(0);
  }
  const bytes =
    typeof secret === 'string'
      ? Buffer.from(secret, 'utf8')
      : secret instanceof Uint8Array
        ? Buffer.from(secret)
        : undefined;
  if (bytes === undefined || bytes.length < MIN_OPERATION_ID_SECRET_BYTES) {
    // Never the value: it is a secret.
    throw new InvalidOptionsError(
      `operationIdSecret must be a string or bytes of at least ${MIN_OPERATION_ID_SECRET_BYTES} bytes, got ` +
        (bytes === undefined ? typeof secret : `${bytes.length} bytes`) +
        '; generate one with `openssl rand -base64 32` and keep it in your secret store.',
    );
  }
  return bytes;
}

const leaseResolver = optionsResolver(LEASE_OPTION_KEYS, validateLeaseOptions);

/**
 * Applies defaults to `options` and validates them once. An already resolved object is returned
 * as it is.
 * @throws {@link InvalidOptionsError} on an unknown option name (naming it and listing the known
 *   ones), an unknown policy, a duration out of range, `async` without `operationLocation`, a lease
 *   not shorter than the retention, a `renewEveryMs` not shorter than the lease, or an
 *   `operationIdSecret` shorter than 32 bytes.
 */
export function resolveLeaseOptions(options: LeaseOptions | ResolvedLeaseOptions = {}): ResolvedLeaseOptions {
  return leaseResolver.resolveFor(options, 'resolveLeaseOptions');
}

/**
 * {@link resolveLeaseOptions} for the entry point `what` (named in the error of an unknown option
 * name). @internal
 */
export const resolveLeaseOptionsFor = leaseResolver.resolveFor;

/**
 * {@link resolveLeaseOptions} without the check of the option names, for callers that refused
 * unknown names themselves against a wider options type (the HTTP lease routes). @internal
 */
export const resolveCheckedLeaseOptions = leaseResolver.resolveChecked;

/** Applies the defaults to options whose names are known, and validates and freezes them. */
function validateLeaseOptions(o: LeaseOptions): ResolvedLeaseOptions {
  const policy = o.policy ?? LEASE_DEFAULTS.policy;
  if (policy !== 'reject' && policy !== 'wait' && policy !== 'async') {
    throw new InvalidOptionsError(`policy must be 'reject', 'wait' or 'async', got ${JSON.stringify(policy)}.`);
  }
  const base = resolveCheckedIdempotencyOptions({ ...o, policy: policy === 'wait' ? 'wait' : 'reject' });
  const leaseMs = integerIn('leaseMs', o.leaseMs ?? LEASE_DEFAULTS.leaseMs, 100, 86_400_000, 'ms');
  if (leaseMs >= base.retentionMs) {
    throw new InvalidOptionsError(`leaseMs (${leaseMs}) must be shorter than retentionMs (${base.retentionMs}).`);
  }
  const renewEveryMs =
    o.renewEveryMs === undefined ? undefined : integerIn('renewEveryMs', o.renewEveryMs, 10, leaseMs - 1, 'ms');
  const pollIntervalMs = integerIn(
    'pollIntervalMs',
    o.pollIntervalMs ?? LEASE_DEFAULTS.pollIntervalMs,
    MIN_WAIT_PAUSE_MS,
    60_000,
    'ms',
  );
  if (o.operationLocation !== undefined && typeof o.operationLocation !== 'function') {
    throw new InvalidOptionsError('operationLocation must be a function (operationId) => URL.');
  }
  if (policy === 'async' && o.operationLocation === undefined) {
    throw new InvalidOptionsError("policy 'async' needs operationLocation(operationId): the URL a 202 points to.");
  }
  const idKey = operationIdKey(o.operationIdSecret);
  return Object.freeze({
    base,
    policy,
    leaseMs,
    pollIntervalMs,
    renewEveryMs,
    operationLocation: o.operationLocation,
    operationIdOf: (scope: KeyScope) => operationIdFor(scope, idKey),
    channel: leaseChannel(base.schema),
  });
}
