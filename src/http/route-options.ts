/**
 * What the framework adapters (Fastify, Express) share: the options of an idempotent route, of a
 * lease-mode route and of the operation resource, each validated once when the route is built (the
 * request flows that run them are in ./route-flow.ts), and the flow of the operation resource's
 * `GET`.
 */
import type { DatabaseHandle, TransactionOf } from '../database.js';
import { InvalidOptionsError, optionNames, refuseUnknownOptions } from '../errors.js';
import { noopLogger, type Logger } from '../logger.js';
import type { ExecutionContext } from '../idempotency/execute.js';
import type { LeaseContext } from '../idempotency/lease.js';
import {
  LEASE_OPTION_KEYS,
  resolveCheckedLeaseOptions,
  type LeaseOptions,
  type ResolvedLeaseOptions,
} from '../idempotency/lease-options.js';
import {
  IDEMPOTENCY_OPTION_KEYS,
  resolveCheckedIdempotencyOptions,
  type IdempotencyOptions,
  type ResolvedIdempotencyOptions,
} from '../idempotency/options.js';
import { serveOperation } from '../idempotency/reconcile.js';
import type { HandlerResponse, IdempotentResponse } from '../idempotency/state-machine.js';
import { assertValidOperation, assertValidTenant } from '../idempotency/text.js';

/** Default `maxBodyBytes`, in bytes: 1 MiB, the default body limit of Fastify and of `express.raw`. */
export const DEFAULT_MAX_BODY_BYTES = 1_048_576;

/**
 * Options of an idempotent route: where, what, who, plus {@link IdempotencyOptions}.
 * `Req` is the framework's request type.
 */
export interface RouteIdempotencyOptions<D extends DatabaseHandle, Req> extends IdempotencyOptions {
  /** A `pg.Pool` or a drizzle database: outboxkit opens one transaction per request on it. */
  db: D;
  /** The operation name, scoping keys: the same key on two operations never collides. */
  operation: string;
  /**
   * The authenticated caller's scope (account or tenant id). Return `undefined` (or `''`) when it
   * cannot be determined: the request is then refused with 400 (`tenant-unresolved`) rather than
   * put in a shared scope (test/idempotency/http-contract.test.ts, "keys are not shared between callers"). Called only for requests that carry a key. Authenticate
   * before the route (a hook or middleware that answers 401): an error it throws is logged
   * (`logger.error`) and answered with the generic 500 problem `internal`, its message withheld.
   */
  resolveTenant(req: Req): string | undefined | Promise<string | undefined>;
  /**
   * Request headers that change the meaning of the request (for example `accept-language`), part
   * of the fingerprint. Never tracing or transport headers. @defaultValue []
   */
  semanticHeaders?: readonly string[];
  /** Whether a request without `Idempotency-Key` is refused (400) or runs without protection. @defaultValue true */
  required?: boolean;
  /**
   * Largest body accepted on this route, in bytes: larger bodies get 413 `body-too-large`, nothing
   * recorded. Keep the framework's raw-body limit (`registerRawJsonBody({ bodyLimit })`,
   * `express.raw({ limit })`) above it: bodies over that limit get the framework's own 413
   * before this handler runs (`registerRawJsonBody` defaults to max(2 MiB, Fastify's `bodyLimit`)).
   * @defaultValue 1_048_576
   */
  maxBodyBytes?: number;
}

/**
 * Every option name of {@link RouteIdempotencyOptions}; the compiler keeps it in step with the
 * interface.
 */
const ROUTE_OPTION_NAMES = optionNames<RouteIdempotencyOptions<DatabaseHandle, unknown>>({
  ...IDEMPOTENCY_OPTION_KEYS,
  db: true,
  operation: true,
  resolveTenant: true,
  semanticHeaders: true,
  required: true,
  maxBodyBytes: true,
});

/**
 * Refuses a non-object and unknown option names of an adapter's options, at the adapter (the
 * outermost entry point), against the full option list of its options type.
 */
function refuseUnknownRouteOptions(options: unknown, known: readonly string[], what: string): void {
  if (typeof options !== 'object' || options === null)
    throw new InvalidOptionsError(`${what} needs an options object.`);
  refuseUnknownOptions(options, known, what);
}

/** An idempotent route's options and handler, validated once, as both adapters run them. */
export interface ResolvedRoute<D extends DatabaseHandle, Req> extends RouteScope<D, Req> {
  opts: ResolvedIdempotencyOptions;
  required: boolean;
  handler(req: Req, tx: TransactionOf<D>, ctx: ExecutionContext): Promise<HandlerResponse>;
}

/** What both modes resolve the same way: where, what, who, and the fingerprint's inputs. */
export interface RouteScope<D extends DatabaseHandle, Req> {
  db: D;
  operation: string;
  maxBodyBytes: number;
  /** Lower-cased, once per route. */
  semanticHeaders: readonly string[];
  resolveTenant(req: Req): string | undefined | Promise<string | undefined>;
  /** Where the route logs the errors it answers with the generic 500 problem. */
  failures: RouteFailures;
}

/**
 * Validates what both modes resolve the same way; `resolved` gives the logger and `Retry-After` of
 * the route's generic 500 problems (its resolved {@link IdempotencyOptions}).
 */
function resolveScope<D extends DatabaseHandle, Req>(
  options: Omit<RouteIdempotencyOptions<D, Req>, keyof IdempotencyOptions>,
  handler: unknown,
  what: string,
  resolved: Pick<ResolvedIdempotencyOptions, 'logger' | 'retryAfterSeconds'>,
): RouteScope<D, Req> {
  assertValidOperation(options.operation, what);
  if (typeof options.resolveTenant !== 'function') {
    throw new InvalidOptionsError(`${what} needs resolveTenant(req): the caller scope of each key.`);
  }
  if (typeof handler !== 'function') throw new InvalidOptionsError(`${what} needs a handler function.`);
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  if (!Number.isSafeInteger(maxBodyBytes) || maxBodyBytes < 0) {
    throw new InvalidOptionsError(`maxBodyBytes must be a non-negative integer (bytes), got ${String(maxBodyBytes)}.`);
  }
  const semanticHeaders = options.semanticHeaders ?? [];
  if (!Array.isArray(semanticHeaders) || semanticHeaders.some((h) => typeof h !== 'string')) {
    throw new InvalidOptionsError('semanticHeaders must be an array of header names.');
  }
  return {
    db: options.db,
    operation: options.operation,
    maxBodyBytes,
    semanticHeaders: Object.freeze(semanticHeaders.map((h) => h.toLowerCase())),
    resolveTenant: options.resolveTenant.bind(options),
    failures: { operation: options.operation, logger: resolved.logger, retryAfterSeconds: resolved.retryAfterSeconds },
  };
}

/**
 * Validates an adapter's options once, when the route is built, and keeps its handler.
 * @param handler - the application's handler (checked to be a function, for JavaScript callers).
 * @param what - the adapter's entry point, for messages (`'idempotentHandler()'`).
 * @throws {@link InvalidOptionsError} on an unknown option name (naming it and listing the known
 *   ones), an invalid operation, tenant resolver, handler or limit, or invalid
 *   {@link IdempotencyOptions}.
 */
export function resolveRoute<D extends DatabaseHandle, Req>(
  options: RouteIdempotencyOptions<D, Req>,
  handler: (req: Req, tx: TransactionOf<D>, ctx: ExecutionContext) => Promise<HandlerResponse>,
  what: string,
): ResolvedRoute<D, Req> {
  refuseUnknownRouteOptions(options, ROUTE_OPTION_NAMES, what);
  const opts = resolveCheckedIdempotencyOptions(options);
  return { ...resolveScope(options, handler, what, opts), opts, required: options.required ?? true, handler };
}

/** Options of a lease-mode route: {@link RouteIdempotencyOptions} with the lease-mode options. */
export interface RouteLeaseOptions<D extends DatabaseHandle, Req>
  extends Omit<RouteIdempotencyOptions<D, Req>, 'policy' | 'required'>, LeaseOptions {
  /**
   * The caller's deadline for this request, in ms since the epoch (bounds policy `wait`, together
   * with `waitTimeoutMs`: the earlier one ends the wait), for example from a `Request-Timeout`
   * header. Return `undefined` when the request has none. A value that is not a finite number
   * (`NaN` from a malformed header) gets 400 `deadline-invalid` (`DeadlineInvalidError`):
   * parse headers strictly, for example
   * `(req) => { const s = req.headers['request-timeout']; return s === undefined ? undefined : Date.now() + 1000 * Number(s); }`.
   * An error it throws is logged and answered with the generic 500 problem `internal`.
   * @defaultValue none (only `waitTimeoutMs` bounds it)
   */
  deadline?(req: Req): number | undefined;
}

/**
 * Every option name of {@link RouteLeaseOptions} (not `policy: 'reject' | 'wait'` of one-transaction
 * mode's, nor `required`: the key is always required); the compiler keeps it in step with the
 * interface.
 */
const LEASE_ROUTE_OPTION_NAMES = optionNames<RouteLeaseOptions<DatabaseHandle, unknown>>({
  ...LEASE_OPTION_KEYS,
  db: true,
  operation: true,
  resolveTenant: true,
  semanticHeaders: true,
  maxBodyBytes: true,
  deadline: true,
});

/** A lease-mode route's options and handler, validated once, as both adapters run them. */
export interface ResolvedLeaseRoute<D extends DatabaseHandle, Req> extends RouteScope<D, Req> {
  opts: ResolvedLeaseOptions;
  deadline: ((req: Req) => number | undefined) | undefined;
  handler(req: Req, ctx: LeaseContext<D>): Promise<HandlerResponse>;
}

/**
 * Validates a lease-mode adapter's options once, when the route is built, and keeps its handler.
 * @param handler - as {@link resolveRoute}'s, with the lease-mode context.
 * @throws {@link InvalidOptionsError} on an unknown option name (naming it and listing the known
 *   ones) or invalid options (see `resolveLeaseOptions()` too).
 */
export function resolveLeaseRoute<D extends DatabaseHandle, Req>(
  options: RouteLeaseOptions<D, Req>,
  handler: (req: Req, ctx: LeaseContext<D>) => Promise<HandlerResponse>,
  what: string,
): ResolvedLeaseRoute<D, Req> {
  refuseUnknownRouteOptions(options, LEASE_ROUTE_OPTION_NAMES, what);
  const opts = resolveCheckedLeaseOptions(options);
  if (options.deadline !== undefined && typeof options.deadline !== 'function') {
    throw new InvalidOptionsError(`${what}: deadline must be a function (req) => ms since the epoch.`);
  }
  return {
    ...resolveScope(options, handler, what, opts.base),
    opts,
    deadline: options.deadline?.bind(options),
    handler,
  };
}

/** Options of an operation resource route (the `Location` of a 202 under policy `async`). */
export interface RouteOperationOptions<D extends DatabaseHandle, Req> {
  /** The database of the lease-mode route. */
  db: D;
  /** The operation of the lease-mode route. */
  operation: string;
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /**
   * The same caller scope as the lease-mode route's: another tenant's id is 404. An error it
   * throws is logged and answered with the generic 500 problem `internal`.
   */
  resolveTenant(req: Req): string | undefined | Promise<string | undefined>;
  /** Logger of the errors answered with the generic 500 problem. @defaultValue a no-op logger */
  logger?: Logger;
}

/** Every option name of {@link RouteOperationOptions}; the compiler keeps it in step with the interface. */
const OPERATION_ROUTE_OPTION_NAMES = optionNames<RouteOperationOptions<DatabaseHandle, unknown>>({
  db: true,
  operation: true,
  schema: true,
  resolveTenant: true,
  logger: true,
});

/** An operation resource route, validated once: the flow of its `GET`, and where it logs. */
export type ResolvedOperationRoute<Req> = ((req: Req, operationId: string) => Promise<IdempotentResponse>) & {
  readonly failures: RouteFailures;
};

/**
 * Validates an operation resource's options once and returns the flow of its `GET`: the stored
 * result once finished, 202 while pending, 404 for an unknown id or another tenant's (see
 * `serveOperation()`), with the route's `failures` (for {@link answerRoute}). The flow
 * throws outboxkit's problem errors for the adapter to answer.
 * @throws {@link InvalidOptionsError} at once on an unknown option name, an invalid operation or
 *   tenant resolver.
 */
export function operationRoute<D extends DatabaseHandle, Req>(
  options: RouteOperationOptions<D, Req>,
  what: string,
): ResolvedOperationRoute<Req> {
  refuseUnknownRouteOptions(options, OPERATION_ROUTE_OPTION_NAMES, what);
  assertValidOperation(options.operation, what);
  if (typeof options.resolveTenant !== 'function') {
    throw new InvalidOptionsError(`${what} needs resolveTenant(req): the caller scope of each key.`);
  }
  const logger = options.logger ?? noopLogger;
  const { db, operation } = options;
  const serveOptions = options.schema === undefined ? {} : { schema: options.schema };
  const serve = async (req: Req, operationId: string): Promise<IdempotentResponse> => {
    const tenant = assertValidTenant(await options.resolveTenant(req));
    return serveOperation(db, { tenant, operation, operationId }, serveOptions);
  };
  return Object.assign(serve, { failures: { operation, logger, retryAfterSeconds: undefined } });
}

/** Where a route logs the errors it answers with the generic 500 problem, and its `Retry-After`. */
export interface RouteFailures {
  operation: string;
  logger: Logger;
  retryAfterSeconds: number | undefined;
}
