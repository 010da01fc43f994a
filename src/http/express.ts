/**
 * An Express 5 adapter for idempotent routes: the same contract as the Fastify adapter
 * (./fastify.ts), over `executeIdempotent()` (one-transaction mode) and `executeLeased()` (lease
 * mode, with the operation resource of policy `async`).
 *
 * Only types are imported from express: this module has no run-time dependency on it (declare
 * `express` >= 5 as an optional peer dependency).
 *
 * @example
 * ```ts
 * import express from 'express';
 * import { idempotentHandler } from 'outboxkit/express';
 *
 * const app = express();
 * app.post(
 *   '/orders',
 *   // The fingerprint is computed over the raw bytes: keep them (on this route only), with a limit
 *   // at least `maxBodyBytes` (express.raw's default limit is 100 kB).
 *   express.raw({ type: 'application/json', limit: '1mb' }),
 *   idempotentHandler(
 *     { db: pool, operation: 'create-order', resolveTenant: (req) => req.user?.accountId },
 *     async (req, tx) => {
 *       const input = req.body as { sku: string }; // parsed once, exactly the fingerprinted JSON
 *       const { rows } = await tx.query('INSERT INTO orders (sku) VALUES ($1) RETURNING id', [input.sku]);
 *       return { status: 201, headers: { location: `/orders/${rows[0].id}` }, body: { id: rows[0].id } };
 *     },
 *   ),
 * );
 * ```
 */
import type { NextFunction, Request, RequestHandler, Response } from 'express';
import type { DatabaseHandle, TransactionOf } from '../database.js';
import { InvalidOptionsError } from '../errors.js';
import { BodyInvalidError } from '../idempotency/errors.js';
import type { ExecutionContext } from '../idempotency/execute.js';
import type { LeaseContext } from '../idempotency/lease.js';
import type { HandlerResponse } from '../idempotency/state-machine.js';
import { answerIdempotentRoute, answerLeaseRoute, answerOperation, decodedBodyError } from './route-flow.js';
import type { RouteAnswer, RouteRequest } from './route-flow.js';
import { operationRoute, resolveLeaseRoute, resolveRoute } from './route-options.js';
import type { RouteIdempotencyOptions, RouteLeaseOptions, RouteOperationOptions } from './route-options.js';

export { DEFAULT_MAX_BODY_BYTES } from './route-options.js';

/** Options of {@link idempotentHandler}: see {@link RouteIdempotencyOptions}. */
export type ExpressIdempotencyOptions<D extends DatabaseHandle> = RouteIdempotencyOptions<D, Request>;

/**
 * Builds an Express 5 route handler that runs `handler` idempotently:
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
 * The handler gets the request, the transaction and `ctx` (`return ctx.reject(422, problem)` ends
 * it with a stored business rejection, its writes rolled back to the claim's savepoint). This is
 * the one-transaction mode; see {@link leasedHandler} for lease mode.
 *
 * The body must reach it as raw bytes: put `express.raw({ type: 'application/json' })` before it
 * on the route. A body that a JSON parser (`express.json()`) already parsed is refused with an
 * {@link InvalidOptionsError} (passed to `next`): its fingerprint would not cover the bytes sent.
 * A body that no parser read (a content type `express.raw` was not set up for), or that
 * `express.text()` decoded (its invalid UTF-8 replaced), gets 400 `body-invalid`; so does a
 * `__proto__` or `constructor.prototype` member (docs/http-contract.md, "Request bodies").
 * Responses are written with Node's `res.setHeader()`/`res.end()`, so Express adds neither an ETag
 * nor a charset: a replay is byte for byte the first response.
 *
 * Errors the handler throws, and {@link InvalidOptionsError}, go to `next(err)` (your error
 * middleware), after the rollback. Any other error (thrown by `resolveTenant`, an unexpected
 * database error) is logged through `logger` and answered with the generic 500 problem
 * `internal`, its message withheld.
 *
 * @throws {@link InvalidOptionsError} at once on invalid options or an unknown option name.
 */
export function idempotentHandler<D extends DatabaseHandle>(
  options: ExpressIdempotencyOptions<D>,
  handler: (req: Request, tx: TransactionOf<D>, ctx: ExecutionContext) => Promise<HandlerResponse>,
): RequestHandler {
  const route = resolveRoute(options, handler, 'idempotentHandler()');

  return async function idempotentRoute(req: Request, res: Response, next: NextFunction): Promise<void> {
    send(res, next, await answerIdempotentRoute(route, req, partsOf));
  };
}

/** Options of {@link leasedHandler}: see {@link RouteLeaseOptions}. */
export type ExpressLeaseOptions<D extends DatabaseHandle> = RouteLeaseOptions<D, Request>;

/**
 * Builds an Express 5 route handler in **lease mode** (see `executeLeased()`), the counterpart of
 * the Fastify adapter's `leasedHandler`: the claim commits first, `handler(req, ctx)` runs under
 * a lease with an owner token (its local writes in the fenced `ctx.transaction(fn)`), and its
 * response is stored fenced by that token. The key is always required. Policies:
 * - `reject` (default): 409 with `Retry-After` (the seconds left on the lease);
 * - `wait`: the duplicate waits, woken through LISTEN/NOTIFY with a bounded poll, at most
 *   `waitTimeoutMs`, never past `deadline(req)`, and no longer than the client stays connected,
 *   then replays (or takes over an expired lease);
 * - `async`: 202 with `Location: operationLocation(operationId)`; serve it with
 *   {@link operationHandler}.
 * With `renewEveryMs`, the lease is renewed while the handler runs; `ctx.signal` aborts when the
 * lease is lost, and the handler's result is then not stored (`LeaseLostError`, 409
 * `lease-lost`).
 *
 * Same body rules as {@link idempotentHandler} (`express.raw({ type: 'application/json' })` before
 * it), same problem responses and error handling: errors the handler throws go to `next(err)`;
 * one thrown by `resolveTenant`, `deadline` or `operationLocation` is logged and answered with
 * the generic 500 problem `internal`.
 *
 * @throws {@link InvalidOptionsError} at once on invalid options (policy `async` without
 *   `operationLocation`, a lease not shorter than the retention, an unknown option name, ...).
 */
export function leasedHandler<D extends DatabaseHandle>(
  options: ExpressLeaseOptions<D>,
  handler: (req: Request, ctx: LeaseContext<D>) => Promise<HandlerResponse>,
): RequestHandler {
  const route = resolveLeaseRoute(options, handler, 'leasedHandler()');

  return async function leasedRoute(req: Request, res: Response, next: NextFunction): Promise<void> {
    send(res, next, await answerLeaseRoute(route, req, partsOf, res));
  };
}

/** Options of {@link operationHandler}: see {@link RouteOperationOptions}. */
export type ExpressOperationOptions<D extends DatabaseHandle> = RouteOperationOptions<D, Request>;

/**
 * Builds the `GET` handler of the operation resource that {@link leasedHandler} points to under
 * policy `async`, for a route with an `:operationId` parameter (see `serveOperation()`): the
 * stored result once finished (with `Idempotent-Replayed: true`), 202 with `Retry-After` while
 * pending, 404 for an unknown id or another tenant's. An error thrown by `resolveTenant` is
 * logged through `logger` and answered with the generic 500 problem `internal`.
 *
 * @example
 * ```ts
 * app.get('/operations/payments/:operationId', operationHandler({ db: pool, operation: 'pay', resolveTenant }));
 * ```
 * @throws {@link InvalidOptionsError} at once on invalid options or an unknown option name.
 */
export function operationHandler<D extends DatabaseHandle>(options: ExpressOperationOptions<D>): RequestHandler {
  const serve = operationRoute(options, 'operationHandler()');
  return async function operationResource(req: Request, res: Response, next: NextFunction): Promise<void> {
    const id = req.params.operationId;
    send(
      res,
      next,
      await answerOperation(serve, req, typeof id === 'string' ? id : '', req.headers['accept-encoding']),
    );
  };
}

/** The parts of an Express request the shared flows read. */
function partsOf(req: Request): RouteRequest {
  return {
    headers: req.headers,
    method: req.method,
    // originalUrl: the whole target, also inside a mounted router (where req.url is relative).
    target: req.originalUrl ?? req.url,
    rawBody: rawBodyOf(req),
    setBody: (body) => (req.body = body),
  };
}

/**
 * Writes the route's response as is: no ETag, no charset added to the content type (unlike
 * `res.send`); or hands its error to `next` (the application's error middleware).
 */
function send(res: Response, next: NextFunction, answer: RouteAnswer<unknown>): void {
  if ('error' in answer) return next(answer.error);
  const { status, headers, body } = answer.response;
  res.statusCode = status;
  for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
  res.setHeader('content-length', body.length);
  res.end(body);
}

function hasBody(req: Request): boolean {
  const length = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0');
}

function rawBodyOf(req: Request): Uint8Array | undefined {
  const body: unknown = req.body;
  if (body instanceof Uint8Array) return body;
  if (typeof body === 'string') {
    if (body.length === 0) return undefined;
    // express.text() decoded it, replacing invalid UTF-8: its bytes, which the fingerprint covers, are gone.
    throw decodedBodyError(req.headers);
  }
  if (body === undefined || body === null) {
    if (!hasBody(req)) return undefined;
    // body-parser 2 leaves req.body undefined when the content type is not the one it parses.
    throw new BodyInvalidError(
      `The request body was not read as JSON (content type ${JSON.stringify(req.headers['content-type'] ?? '')}); send it as application/json.`,
    );
  }
  throw new InvalidOptionsError(
    "The idempotent route received an already parsed body; use express.raw({ type: 'application/json' }) on this route (not express.json()) so the fingerprint covers the raw bytes.",
  );
}
