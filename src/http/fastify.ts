/**
 * A Fastify adapter for idempotent routes.
 *
 * Only types are imported from fastify: this module has no run-time dependency on it (declare
 * `fastify` >= 5 as an optional peer dependency).
 *
 * @example
 * ```ts
 * import Fastify from 'fastify';
 * import { idempotentHandler, registerRawJsonBody } from 'outboxkit/fastify';
 *
 * const app = Fastify();
 * await app.register(async (scope) => {
 *   // The fingerprint is computed over the raw bytes: keep them (only in this scope).
 *   registerRawJsonBody(scope);
 *   scope.post(
 *     '/orders',
 *     idempotentHandler(
 *       { db: pool, operation: 'create-order', resolveTenant: (req) => req.user?.accountId },
 *       async (req, tx) => {
 *         const input = req.body as { sku: string }; // parsed once, exactly the fingerprinted JSON
 *         const { rows } = await tx.query('INSERT INTO orders (sku) VALUES ($1) RETURNING id', [input.sku]);
 *         return { status: 201, headers: { location: `/orders/${rows[0].id}` }, body: { id: rows[0].id } };
 *       },
 *     ),
 *   );
 * });
 * ```
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { DatabaseHandle, TransactionOf } from '../database.js';
import { crashPoint } from '../crash-point.js';
import { InvalidOptionsError, optionNames, refuseUnknownOptions } from '../errors.js';
import type { ExecutionContext } from '../idempotency/execute.js';
import type { LeaseContext } from '../idempotency/lease.js';
import type { HandlerResponse } from '../idempotency/state-machine.js';
import { answerIdempotentRoute, answerLeaseRoute, answerOperation, decodedBodyError } from './route-flow.js';
import type { RouteAnswer, RouteRequest } from './route-flow.js';
import { DEFAULT_MAX_BODY_BYTES, operationRoute, resolveLeaseRoute, resolveRoute } from './route-options.js';
import type { RouteIdempotencyOptions, RouteLeaseOptions, RouteOperationOptions } from './route-options.js';

export { DEFAULT_MAX_BODY_BYTES };

/** Options of {@link idempotentHandler}: see {@link RouteIdempotencyOptions}. */
export type FastifyIdempotencyOptions<D extends DatabaseHandle> = RouteIdempotencyOptions<D, FastifyRequest>;

/**
 * Builds a Fastify route handler that runs `handler` idempotently:
 * 1. parses `Idempotency-Key` (400 `key-missing` / `key-invalid`);
 * 2. resolves the tenant (400 `tenant-unresolved`);
 * 3. fingerprints the raw body and the semantic headers (413 `body-too-large`, 400 `body-invalid`),
 *    then sets `req.body` to the parsed JSON, so the handler sees exactly what was fingerprinted;
 * 4. runs `executeIdempotent()` and sends the status, headers and body bytes, with
 *    `Idempotent-Replayed: true` on a replay; outboxkit's errors become RFC 9457 problems (409 and
 *    503 with `Retry-After`, 422 on a key reused with another body).
 *
 * A replay carries the stored representation headers (`content-encoding`, `content-language`,
 * `content-disposition`, `vary`, ...), so a body the handler compressed passes through a
 * compression middleware unchanged; a retry whose `Accept-Encoding` refuses the stored coding gets
 * it decoded, or 406 `replay-not-acceptable` (docs/http-contract.md, "Replayed representation").
 *
 * The body must reach the handler as raw bytes: call {@link registerRawJsonBody} in the plugin
 * scope of the route. A body Fastify's default `text/plain` parser decoded (its invalid UTF-8
 * replaced) gets 400 `body-invalid`, and so does a `__proto__` or `constructor.prototype` member
 * (docs/http-contract.md, "Request bodies"). Fastify body schemas (`schema.body`) would see the
 * raw Buffer: validate in the handler instead.
 *
 * Errors the handler throws, and {@link InvalidOptionsError}, go to Fastify's error handler, after
 * the rollback. Any other error (thrown by `resolveTenant`, an unexpected database error) is
 * logged through `logger` and answered with the generic 500 problem `internal`, its message
 * withheld.
 *
 * @throws {@link InvalidOptionsError} at once on invalid options or an unknown option name.
 */
export function idempotentHandler<D extends DatabaseHandle>(
  options: FastifyIdempotencyOptions<D>,
  handler: (req: FastifyRequest, tx: TransactionOf<D>, ctx: ExecutionContext) => Promise<HandlerResponse>,
): (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply> {
  const route = resolveRoute(options, handler, 'idempotentHandler()');

  return async function idempotentRoute(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    const answer = await answerIdempotentRoute(route, req, partsOf);
    if ('result' in answer && answer.result?.replayed === false) {
      await crashPoint('idempotency:after-commit'); // test-only (src/crash-point.ts)
    }
    return send(reply, answer);
  };
}

/** Options of {@link leasedHandler}: see {@link RouteLeaseOptions}. */
export type FastifyLeaseOptions<D extends DatabaseHandle> = RouteLeaseOptions<D, FastifyRequest>;

/**
 * Builds a Fastify route handler in **lease mode** (see `executeLeased()`): the claim commits
 * first, `handler(req, ctx)` runs under a lease with an owner token, and its response is stored
 * fenced by that token. The key is always required. Same parsing, fingerprinting and problem
 * responses as {@link idempotentHandler}; answers 202 (policy `async`, or an uncertain outcome)
 * with the operation's `Location`. Serve that location with {@link operationHandler}. With
 * `renewEveryMs`, the lease is renewed while the handler runs and `ctx.signal` aborts if it is lost.
 * Errors as {@link idempotentHandler}'s: one thrown by `resolveTenant`, `deadline` or
 * `operationLocation` is logged and answered with the generic 500 problem `internal`.
 * Under policy `wait`, a duplicate stops waiting when its client closes the connection.
 *
 * @throws {@link InvalidOptionsError} at once on invalid options or an unknown option name.
 */
export function leasedHandler<D extends DatabaseHandle>(
  options: FastifyLeaseOptions<D>,
  handler: (req: FastifyRequest, ctx: LeaseContext<D>) => Promise<HandlerResponse>,
): (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply> {
  const route = resolveLeaseRoute(options, handler, 'leasedHandler()');

  return async function leasedRoute(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    return send(reply, await answerLeaseRoute(route, req, partsOf, reply.raw));
  };
}

/** Options of {@link operationHandler}: see {@link RouteOperationOptions}. */
export type FastifyOperationOptions<D extends DatabaseHandle> = RouteOperationOptions<D, FastifyRequest>;

/**
 * Builds the `GET` handler of the operation resource that {@link leasedHandler} points to under
 * policy `async`, for a route with an `:operationId` parameter (see `serveOperation()`): the
 * stored result once finished, 202 while pending, 404 for an unknown id or another tenant's. An
 * error thrown by `resolveTenant` is logged through `logger` and answered with the generic 500
 * problem `internal`.
 *
 * @throws {@link InvalidOptionsError} at once on invalid options or an unknown option name.
 */
export function operationHandler<D extends DatabaseHandle>(
  options: FastifyOperationOptions<D>,
): (req: FastifyRequest<{ Params: { operationId: string } }>, reply: FastifyReply) => Promise<FastifyReply> {
  const serve = operationRoute(options, 'operationHandler()');
  return async function operationResource(req, reply) {
    return send(reply, await answerOperation(serve, req, req.params.operationId, req.headers['accept-encoding']));
  };
}

/** The parts of a Fastify request the shared flows read. */
function partsOf(req: FastifyRequest): RouteRequest {
  return {
    headers: req.headers,
    method: req.method,
    target: req.url,
    rawBody: rawBodyOf(req),
    setBody: (body) => (req.body = body),
  };
}

/** Sends the route's response, or throws its error to Fastify's error handler. */
function send(reply: FastifyReply, answer: RouteAnswer<unknown>): FastifyReply {
  if ('error' in answer) throw answer.error;
  const { status, headers, body } = answer.response;
  return reply.code(status).headers(headers).send(body);
}

function rawBodyOf(req: FastifyRequest): Uint8Array | undefined {
  const body: unknown = req.body;
  if (body === undefined || body === null || body === '') return undefined;
  if (body instanceof Uint8Array) return body;
  // Fastify's default text/plain parser decoded it, replacing invalid UTF-8: its bytes are gone.
  if (typeof body === 'string') throw decodedBodyError(req.headers);
  throw new InvalidOptionsError(
    'The idempotent route received an already parsed body; call registerRawJsonBody() in its plugin scope so the fingerprint covers the raw bytes.',
  );
}

/**
 * Smallest default raw-body limit of {@link registerRawJsonBody}, in bytes: 2 MiB, twice the
 * default `maxBodyBytes`. Fastify's own default `bodyLimit` (1 MiB) equals the default
 * `maxBodyBytes`, so with it Fastify would refuse a body just over the limit with its own 413
 * before outboxkit's fingerprint check could answer 413 `body-too-large` (problem+json).
 */
export const DEFAULT_RAW_BODY_LIMIT = 2 * DEFAULT_MAX_BODY_BYTES;

/** Options of {@link registerRawJsonBody}. */
export interface RawJsonBodyOptions {
  /** Content types whose body is kept raw. @defaultValue 'application/json' */
  contentType?: string | RegExp;
  /**
   * Largest body read, in bytes; Fastify answers a larger one with its own 413
   * (`FST_ERR_CTP_BODY_TOO_LARGE`, not problem+json) before the route runs. Keep it above the
   * routes' `maxBodyBytes`, so that outboxkit's 413 `body-too-large` answers the bodies between
   * the two. A route's own Fastify `bodyLimit` option overrides it.
   * @defaultValue the larger of {@link DEFAULT_RAW_BODY_LIMIT} (2 MiB) and the Fastify instance's `bodyLimit`
   */
  bodyLimit?: number;
}

/** Every option name of {@link RawJsonBodyOptions}; the compiler keeps it in step with the interface. */
const RAW_JSON_BODY_OPTION_NAMES = optionNames<RawJsonBodyOptions>({ contentType: true, bodyLimit: true });

/** The part of a Fastify instance {@link registerRawJsonBody} uses. */
export interface ContentTypeParserHost {
  hasContentTypeParser(contentType: string | RegExp): boolean;
  removeContentTypeParser(contentType: string | RegExp | (string | RegExp)[]): void;
  addContentTypeParser(
    contentType: string | string[] | RegExp,
    opts: { parseAs: 'buffer'; bodyLimit?: number },
    parser: (req: FastifyRequest, body: Buffer, done: (err: Error | null, body?: unknown) => void) => void,
  ): void;
  /** The instance's options; its `bodyLimit` raises the default raw-body limit. */
  readonly initialConfig?: { readonly bodyLimit?: number };
}

/**
 * Replaces the JSON body parser of a Fastify instance (or plugin scope) with one that keeps the
 * raw bytes as `req.body` (a Buffer), which {@link idempotentHandler} fingerprints and then
 * replaces with the parsed JSON. Parsers are encapsulated: call it inside the plugin that
 * registers the idempotent routes to leave the app's other routes untouched. Other content types
 * keep Fastify's parsers: a `text/plain` body, decoded by Fastify, gets 400 `body-invalid` on an
 * idempotent route; a content type without a parser gets Fastify's own 415.
 *
 * The parser always has a bounded limit of its own (`bodyLimit`), by default above the default
 * `maxBodyBytes`: a body over `maxBodyBytes` gets outboxkit's 413 `body-too-large` problem, not
 * Fastify's error, whatever the instance's `bodyLimit`.
 *
 * @throws {@link InvalidOptionsError} on an unknown option name or an invalid `bodyLimit`.
 */
export function registerRawJsonBody(app: ContentTypeParserHost, options: RawJsonBodyOptions = {}): void {
  refuseUnknownOptions(options ?? {}, RAW_JSON_BODY_OPTION_NAMES, 'registerRawJsonBody');
  const contentType = options.contentType ?? 'application/json';
  if (options.bodyLimit !== undefined && (!Number.isSafeInteger(options.bodyLimit) || options.bodyLimit <= 0)) {
    throw new InvalidOptionsError(`bodyLimit must be a positive integer (bytes), got ${String(options.bodyLimit)}.`);
  }
  const bodyLimit = options.bodyLimit ?? defaultBodyLimit(app);
  if (app.hasContentTypeParser(contentType)) app.removeContentTypeParser(contentType);
  app.addContentTypeParser(contentType, { parseAs: 'buffer', bodyLimit }, (_req, body, done) => done(null, body));
}

/** The larger of {@link DEFAULT_RAW_BODY_LIMIT} and the instance's `bodyLimit` (when it is a valid one). */
function defaultBodyLimit(app: ContentTypeParserHost): number {
  const instance = app.initialConfig?.bodyLimit;
  return typeof instance === 'number' && Number.isSafeInteger(instance) && instance > DEFAULT_RAW_BODY_LIMIT
    ? instance
    : DEFAULT_RAW_BODY_LIMIT;
}
