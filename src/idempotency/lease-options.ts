/**
 * Options of lease mode ({@link executeLeased}), their defaults and their validation.
 */
import { InvalidOptionsError, refuseUnknownOptions } from '../errors.js';
import { leaseChannel } from './lease-store.js';
import {
  IDEMPOTENCY_OPTION_KEYS,
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
   *   with a poll every `pollIntervalMs` as the fallback, at most `waitTimeoutMs` and never past
   *   the request's `deadline`; then replay, or take over an expired lease, or 409;
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
  /** Under `wait`: the bounded poll interval between notifications, in milliseconds. @defaultValue 500 */
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
} satisfies Record<keyof LeaseOptions, true>);

const LEASE_OPTION_NAMES: readonly string[] = Object.keys(LEASE_OPTION_KEYS);

/** {@link LeaseOptions} with every default applied, validated and frozen. */
export interface ResolvedLeaseOptions {
  readonly base: ResolvedIdempotencyOptions;
  readonly policy: LeasePolicy;
  readonly leaseMs: number;
  readonly pollIntervalMs: number;
  /** Automatic renewal interval in ms, or `undefined` (off). */
  readonly renewEveryMs: number | undefined;
  readonly operationLocation: ((operationId: string) => string) | undefined;
  readonly channel: string;
}

/** Default lease options (the others are {@link IDEMPOTENCY_DEFAULTS}). */
export const LEASE_DEFAULTS = Object.freeze({ policy: 'reject' as LeasePolicy, leaseMs: 30_000, pollIntervalMs: 500 });

const resolved = new WeakSet<object>();

function ms(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new InvalidOptionsError(`${name} must be an integer from ${min} to ${max} (ms), got ${String(value)}.`);
  }
  return value;
}

/**
 * Applies defaults to `options` and validates them once. An already resolved object is returned
 * as it is.
 * @throws {@link InvalidOptionsError} on an unknown option name (naming it and listing the known
 *   ones), an unknown policy, a duration out of range, `async` without `operationLocation`, a lease
 *   not shorter than the retention, or a `renewEveryMs` not shorter than the lease.
 */
export function resolveLeaseOptions(options: LeaseOptions | ResolvedLeaseOptions = {}): ResolvedLeaseOptions {
  return resolveLeaseOptionsFor(options, 'resolveLeaseOptions');
}

/**
 * {@link resolveLeaseOptions} for the entry point `what` (named in the error of an unknown option
 * name). @internal
 */
export function resolveLeaseOptionsFor(
  options: LeaseOptions | ResolvedLeaseOptions | undefined,
  what: string,
): ResolvedLeaseOptions {
  if (options === undefined) options = {};
  if (resolved.has(options)) return options as ResolvedLeaseOptions;
  if (typeof options !== 'object' || options === null)
    throw new InvalidOptionsError(`${what}: options must be an object.`);
  refuseUnknownOptions(options, LEASE_OPTION_NAMES, what);
  return resolveCheckedLeaseOptions(options);
}

/**
 * {@link resolveLeaseOptions} without the check of the option names, for callers that refused
 * unknown names themselves against a wider options type (the HTTP lease routes). @internal
 */
export function resolveCheckedLeaseOptions(options: LeaseOptions | ResolvedLeaseOptions = {}): ResolvedLeaseOptions {
  if (resolved.has(options)) return options as ResolvedLeaseOptions;
  const o = options as LeaseOptions;
  const policy = o.policy ?? LEASE_DEFAULTS.policy;
  if (policy !== 'reject' && policy !== 'wait' && policy !== 'async') {
    throw new InvalidOptionsError(`policy must be 'reject', 'wait' or 'async', got ${JSON.stringify(policy)}.`);
  }
  const base = resolveCheckedIdempotencyOptions({ ...o, policy: policy === 'wait' ? 'wait' : 'reject' });
  const leaseMs = ms('leaseMs', o.leaseMs ?? LEASE_DEFAULTS.leaseMs, 100, 86_400_000);
  if (leaseMs >= base.retentionMs) {
    throw new InvalidOptionsError(`leaseMs (${leaseMs}) must be shorter than retentionMs (${base.retentionMs}).`);
  }
  const renewEveryMs = o.renewEveryMs === undefined ? undefined : ms('renewEveryMs', o.renewEveryMs, 10, leaseMs - 1);
  if (o.operationLocation !== undefined && typeof o.operationLocation !== 'function') {
    throw new InvalidOptionsError('operationLocation must be a function (operationId) => URL.');
  }
  if (policy === 'async' && o.operationLocation === undefined) {
    throw new InvalidOptionsError("policy 'async' needs operationLocation(operationId): the URL a 202 points to.");
  }
  const result: ResolvedLeaseOptions = Object.freeze({
    base,
    policy,
    leaseMs,
    pollIntervalMs: ms('pollIntervalMs', o.pollIntervalMs ?? LEASE_DEFAULTS.pollIntervalMs, 10, 60_000),
    renewEveryMs,
    operationLocation: o.operationLocation,
    channel: leaseChannel(base.schema),
  });
  resolved.add(result);
  return result;
}
