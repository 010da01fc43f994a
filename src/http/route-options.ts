/**
 * What the framework adapters (Fastify, Express) share: the options of an idempotent route and
 * the request flows of both modes (one-transaction, lease) and of the operation resource.
 */
import type { ServerResponse } from 'node:http';
import type { DatabaseHandle, TransactionOf } from '../database.js';
import { InvalidOptionsError, isOutboxkitError, refuseUnknownOptions } from '../errors.js';
import { noopLogger, type Logger } from '../logger.js';
import { BodyInvalidError } from '../idempotency/errors.js';
import { executeIdempotent, executeWithoutKey, type ExecutionContext } from '../idempotency/execute.js';
import { fingerprintAndParse, parseJsonBody, type Fingerprint } from '../idempotency/fingerprint.js';
import { IDEMPOTENCY_KEY_HEADER, parseIdempotencyKey } from '../idempotency/key.js';
import { executeLeased, type LeaseContext, type LeasedResult } from '../idempotency/lease.js';
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
import type { HandlerResponse, IdempotentResponse, IdempotentResult } from '../idempotency/state-machine.js';
import { assertValidOperation, assertValidTenant } from '../idempotency/text.js';
import { isProblemError, toProblem, type ProblemResponse } from './problem.js';

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
const ROUTE_OPTION_NAMES: readonly string[] = Object.keys({
  ...IDEMPOTENCY_OPTION_KEYS,
  db: true,
  operation: true,
  resolveTenant: true,
  semanticHeaders: true,
  required: true,
  maxBodyBytes: true,
} satisfies Record<keyof RouteIdempotencyOptions<DatabaseHandle, unknown>, true>);

/**
 * Refuses a non-object and unknown option names of an adapter's options, at the adapter (the
 * outermost entry point), against the full option list of its options type.
 */
function refuseUnknownRouteOptions(options: unknown, known: readonly string[], what: string): void {
  if (typeof options !== 'object' || options === null)
    throw new InvalidOptionsError(`${what} needs an options object.`);
  refuseUnknownOptions(options, known, what);
}

/** An idempotent route's options, validated once, as both adapters run them. */
export interface ResolvedRoute<D extends DatabaseHandle, Req> extends RouteScope<D, Req> {
  opts: ResolvedIdempotencyOptions;
  required: boolean;
}

/** What both modes resolve the same way: where, what, who, and the fingerprint's inputs. */
interface RouteScope<D extends DatabaseHandle, Req> {
  db: D;
  operation: string;
  maxBodyBytes: number;
  /** Lower-cased, once per route. */
  semanticHeaders: readonly string[];
  resolveTenant(req: Req): string | undefined | Promise<string | undefined>;
  /** Where the route logs the errors it answers with the generic 500 problem. */
  failures: RouteFailures;
}

function resolveScope<D extends DatabaseHandle, Req>(
  options: Omit<RouteIdempotencyOptions<D, Req>, keyof IdempotencyOptions>,
  handler: unknown,
  what: string,
  failures: RouteFailures,
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
    failures,
  };
}

/**
 * Validates an adapter's options once, when the route is built.
 * @throws {@link InvalidOptionsError} on an unknown option name (naming it and listing the known
 *   ones), an invalid operation, tenant resolver, handler or limit, or invalid
 *   {@link IdempotencyOptions}.
 */
export function resolveRoute<D extends DatabaseHandle, Req>(
  options: RouteIdempotencyOptions<D, Req>,
  handler: unknown,
  what: string,
): ResolvedRoute<D, Req> {
  refuseUnknownRouteOptions(options, ROUTE_OPTION_NAMES, what);
  const opts = resolveCheckedIdempotencyOptions(options);
  const failures = { operation: options.operation, logger: opts.logger, retryAfterSeconds: opts.retryAfterSeconds };
  return { ...resolveScope(options, handler, what, failures), opts, required: options.required ?? true };
}

/** What the flow needs of a framework's request. */
export interface RouteRequest {
  headers: Record<string, string | string[] | undefined>;
  method: string;
  /** The request target as received: path and query (`/orders/111/cancel?notify=1`). */
  target: string;
  /**
   * The raw body bytes (or undefined when there is none). Never text: a body another parser
   * already decoded lost its exact bytes (see {@link decodedBodyError}).
   */
  rawBody: Uint8Array | undefined;
  /** Replaces the request's body with the parsed JSON the fingerprint covered. */
  setBody(body: unknown): void;
  /** Aborted when the client goes away before its response is sent (see {@link abortOnClose}). */
  signal?: AbortSignal;
}

/**
 * An AbortSignal aborted when `res` closes before its response was completely sent: the client
 * closed the connection (Node.js emits `close` on the response then; see Fastify's guide
 * "Detecting When Clients Abort"). `stop()` stops listening (call it once the response is
 * decided).
 */
export function abortOnClose(res: ServerResponse): { signal: AbortSignal; stop(): void } {
  const controller = new AbortController();
  const onClose = () => {
    // The client closed the request before its response was sent: an AbortError (DOMException).
    if (!res.writableFinished) controller.abort();
  };
  if (res.destroyed) onClose();
  else res.once('close', onClose);
  return { signal: controller.signal, stop: () => res.off('close', onClose) };
}

const NO_HEADERS: Readonly<Record<string, string>> = Object.freeze({});

/** The declared semantic headers of a request, lower-cased, repeated values joined by ", ". */
export function pickHeaders(headers: RouteRequest['headers'], names: readonly string[]): Record<string, string> {
  if (names.length === 0) return NO_HEADERS;
  const picked: Record<string, string> = {};
  for (const name of names) {
    const value = headers[name];
    if (value === undefined) continue;
    picked[name] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return picked;
}

/**
 * Resolves the tenant and fingerprints the raw body and the semantic headers of a keyed request,
 * then hands the parsed body to the request (`setBody`).
 */
async function identify<D extends DatabaseHandle, Req>(
  route: RouteScope<D, Req>,
  req: Req,
  parts: RouteRequest,
  key: string,
): Promise<{ tenant: string; operation: string; key: string; fingerprint: Fingerprint }> {
  const tenant = assertValidTenant(await route.resolveTenant(req));
  const { fingerprint, body } = fingerprintAndParse({
    tenant,
    operation: route.operation,
    method: parts.method,
    target: parts.target,
    body: parts.rawBody,
    semanticHeaders: pickHeaders(parts.headers, route.semanticHeaders),
    maxBodyBytes: route.maxBodyBytes,
  });
  parts.setBody(body);
  return { tenant, operation: route.operation, key, fingerprint };
}

/**
 * The one-transaction flow of both adapters: parse the key, resolve the tenant, fingerprint the raw
 * body, then run `handler` through `executeIdempotent()` (or without protection when the key is
 * optional and absent). Throws outboxkit's problem errors for the adapter to answer.
 */
export async function runIdempotentRoute<D extends DatabaseHandle, Req>(
  route: ResolvedRoute<D, Req>,
  req: Req,
  parts: RouteRequest,
  handler: (tx: TransactionOf<D>, ctx: ExecutionContext) => Promise<HandlerResponse>,
): Promise<IdempotentResult> {
  const key = parseIdempotencyKey(parts.headers[IDEMPOTENCY_KEY_HEADER], { required: route.required });
  if (key === undefined) {
    const parsed = parseJsonBody(parts.rawBody, route.maxBodyBytes);
    parts.setBody(parsed.present ? parsed.value : undefined);
    return executeWithoutKey(route.db, handler, route.opts);
  }
  return executeIdempotent(route.db, await identify(route, req, parts, key), handler, route.opts);
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
const LEASE_ROUTE_OPTION_NAMES: readonly string[] = Object.keys({
  ...LEASE_OPTION_KEYS,
  db: true,
  operation: true,
  resolveTenant: true,
  semanticHeaders: true,
  maxBodyBytes: true,
  deadline: true,
} satisfies Record<keyof RouteLeaseOptions<DatabaseHandle, unknown>, true>);

/** A lease-mode route's options, validated once, as both adapters run them. */
export interface ResolvedLeaseRoute<D extends DatabaseHandle, Req> extends RouteScope<D, Req> {
  opts: ResolvedLeaseOptions;
  deadline: ((req: Req) => number | undefined) | undefined;
}

/**
 * Validates a lease-mode adapter's options once, when the route is built.
 * @throws {@link InvalidOptionsError} on an unknown option name (naming it and listing the known
 *   ones) or invalid options (see `resolveLeaseOptions()` too).
 */
export function resolveLeaseRoute<D extends DatabaseHandle, Req>(
  options: RouteLeaseOptions<D, Req>,
  handler: unknown,
  what: string,
): ResolvedLeaseRoute<D, Req> {
  refuseUnknownRouteOptions(options, LEASE_ROUTE_OPTION_NAMES, what);
  const opts = resolveCheckedLeaseOptions(options);
  if (options.deadline !== undefined && typeof options.deadline !== 'function') {
    throw new InvalidOptionsError(`${what}: deadline must be a function (req) => ms since the epoch.`);
  }
  const failures = {
    operation: options.operation,
    logger: opts.base.logger,
    retryAfterSeconds: opts.base.retryAfterSeconds,
  };
  return { ...resolveScope(options, handler, what, failures), opts, deadline: options.deadline?.bind(options) };
}

/**
 * The lease-mode flow of both adapters: parse the key (always required), resolve the tenant,
 * fingerprint the raw body, then run `handler` through `executeLeased()`, with the route's
 * `deadline(req)` and the request's `signal` (a wait ends when the client goes away). Throws
 * outboxkit's problem errors for the adapter to answer.
 */
export async function runLeaseRoute<D extends DatabaseHandle, Req>(
  route: ResolvedLeaseRoute<D, Req>,
  req: Req,
  parts: RouteRequest,
  handler: (ctx: LeaseContext<D>) => Promise<HandlerResponse>,
): Promise<LeasedResult> {
  const key = parseIdempotencyKey(parts.headers[IDEMPOTENCY_KEY_HEADER], { required: true });
  const request = await identify(route, req, parts, key);
  const deadline = route.deadline?.(req);
  return executeLeased(
    route.db,
    {
      ...request,
      ...(deadline === undefined ? {} : { deadline }),
      ...(parts.signal === undefined ? {} : { signal: parts.signal }),
    },
    handler,
    route.opts,
  );
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
const OPERATION_ROUTE_OPTION_NAMES: readonly string[] = Object.keys({
  db: true,
  operation: true,
  schema: true,
  resolveTenant: true,
  logger: true,
} satisfies Record<keyof RouteOperationOptions<DatabaseHandle, unknown>, true>);

/** An operation resource route, validated once: the flow of its `GET`, and where it logs. */
export type ResolvedOperationRoute<Req> = ((req: Req, operationId: string) => Promise<IdempotentResponse>) & {
  readonly failures: RouteFailures;
};

/**
 * Validates an operation resource's options once and returns the flow of its `GET`: the stored
 * result once finished, 202 while pending, 404 for an unknown id or another tenant's (see
 * `serveOperation()`), with the route's `failures` (for {@link problemForRouteError}). The flow
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

/**
 * Tells the errors a route's handler throws from the layer's own, for one request: wrap the
 * handler with `wrap`, then ask `threw(err)` about what the flow threw.
 */
export interface HandlerErrors {
  wrap<A extends unknown[], R>(handler: (...args: A) => Promise<R>): (...args: A) => Promise<R>;
  threw(err: unknown): boolean;
}

/** A {@link HandlerErrors} for one request. */
export function handlerErrors(): HandlerErrors {
  let thrown: { err: unknown } | undefined;
  return {
    wrap:
      (handler) =>
      async (...args) => {
        try {
          return await handler(...args);
        } catch (err) {
          thrown = { err };
          throw err;
        }
      },
    threw: (err) => thrown !== undefined && thrown.err === err,
  };
}

/**
 * What an adapter answers for an error its route's flow threw (docs/http-contract.md, rows 13,
 * 26 and 27):
 * - an outboxkit error with an HTTP mapping: its problem (400, 409, 413, 422, 503, ...);
 * - the handler's own error, or an {@link InvalidOptionsError} (the route or the handler's
 *   response is wrong: a bug in the application, with outboxkit's own message): `undefined`, the
 *   adapter hands it to the framework's error handling unchanged;
 * - anything else (an error thrown by `resolveTenant`, `deadline` or `operationLocation`, an
 *   unexpected PostgreSQL error of outboxkit's own statements, a bug): logged with
 *   `logger.error({ operation, err })` and answered with the generic 500 problem `internal`, whose
 *   body never carries the error's message, SQL or parameters.
 */
export function problemForRouteError(
  err: unknown,
  handler: HandlerErrors,
  failures: RouteFailures,
): ProblemResponse | undefined {
  if (isProblemError(err)) {
    return toProblem(
      err,
      failures.retryAfterSeconds === undefined ? {} : { retryAfterSeconds: failures.retryAfterSeconds },
    );
  }
  if (handler.threw(err) || isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')) return undefined;
  failures.logger.error({ operation: failures.operation, err }, 'idempotent route failed; answered 500 internal');
  return toProblem(err);
}

/**
 * The error of a body that a framework parser already decoded as text (Fastify's default
 * `text/plain` parser, `express.text()`): invalid UTF-8 was replaced on the way, so two different
 * bodies could share a fingerprint. Refused (400 `body-invalid`) instead of fingerprinted.
 */
export function decodedBodyError(headers: RouteRequest['headers']): BodyInvalidError {
  const type = headers['content-type'];
  return new BodyInvalidError(
    `The request body was not kept as raw bytes (content type ${JSON.stringify(typeof type === 'string' ? type.slice(0, 100) : '')}); idempotent routes take JSON bodies sent as application/json.`,
  );
}
