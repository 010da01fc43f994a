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
import { InvalidOptionsError } from '../errors.js';
import type { ExecutionContext } from '../idempotency/execute.js';
import { fingerprintAndParse, type FingerprintInput } from '../idempotency/fingerprint.js';
import { IDEMPOTENCY_KEY_HEADER, parseIdempotencyKey } from '../idempotency/key.js';
import { assertValidOperation, assertValidTenant } from '../idempotency/text.js';
import { executeLeased, type LeaseContext } from '../idempotency/lease.js';
import { resolveLeaseOptions, type LeaseOptions } from '../idempotency/lease-options.js';
import { serveOperation } from '../idempotency/reconcile.js';
import type { HandlerResponse, IdempotentResponse, IdempotentResult } from '../idempotency/state-machine.js';
import { isProblemError, toProblem } from './problem.js';
import {
  DEFAULT_MAX_BODY_BYTES,
  pickHeaders,
  resolveRoute,
  runIdempotentRoute,
  type RouteIdempotencyOptions,
} from './route-options.js';

export { DEFAULT_MAX_BODY_BYTES } from './route-options.js';

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
 * The body must reach the handler as raw bytes: call {@link registerRawJsonBody} in the plugin
 * scope of the route. Errors the handler throws go to Fastify's error handler, after the rollback.
 * Fastify body schemas (`schema.body`) would see the raw Buffer: validate in the handler instead.
 *
 * @throws {@link InvalidOptionsError} at once on invalid options.
 */
export function idempotentHandler<D extends DatabaseHandle>(
  options: FastifyIdempotencyOptions<D>,
  handler: (req: FastifyRequest, tx: TransactionOf<D>, ctx: ExecutionContext) => Promise<HandlerResponse>,
): (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply> {
  const route = resolveRoute(options, handler, 'idempotentHandler()');
  const opts = route.opts;

  return async function idempotentRoute(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    let result: IdempotentResult;
    try {
      result = await runIdempotentRoute(
        route,
        req,
        {
          headers: req.headers,
          method: req.method,
          rawBody: rawBodyOf(req),
          setBody: (body) => (req.body = body),
        },
        (tx, ctx) => handler(req, tx, ctx),
      );
    } catch (err) {
      if (!isProblemError(err)) throw err;
      return sendProblem(reply, err, opts);
    }
    const { status, headers, body } = result.response;
    if (!result.replayed) await crashPoint('idempotency:after-commit'); // test-only (src/crash-point.ts)
    return reply.code(status).headers(headers).send(body);
  };
}

/** Options of {@link leasedHandler}: {@link FastifyIdempotencyOptions} with the lease-mode options. */
export interface FastifyLeaseOptions<D extends DatabaseHandle>
  extends Omit<FastifyIdempotencyOptions<D>, 'policy' | 'required'>, LeaseOptions {
  /**
   * The caller's deadline for this request, in ms since the epoch (bounds policy `wait`), for
   * example from a `Request-Timeout` header. @defaultValue none (only `waitTimeoutMs` bounds it)
   */
  deadline?(req: FastifyRequest): number | undefined;
}

/**
 * Builds a Fastify route handler in **lease mode** (see `executeLeased()`): the claim commits
 * first, `handler(req, ctx)` runs under a lease with an owner token, and its response is stored
 * fenced by that token. The key is always required. Same parsing, fingerprinting and problem
 * responses as {@link idempotentHandler}; answers 202 (policy `async`, or an uncertain outcome)
 * with the operation's `Location`. Serve that location with {@link operationHandler}.
 *
 * @throws {@link InvalidOptionsError} at once on invalid options.
 */
export function leasedHandler<D extends DatabaseHandle>(
  options: FastifyLeaseOptions<D>,
  handler: (req: FastifyRequest, ctx: LeaseContext<D>) => Promise<HandlerResponse>,
): (req: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply> {
  const opts = resolveLeaseOptions(options);
  const { db, operation } = options;
  assertValidOperation(operation, 'leasedHandler()');
  if (typeof options.resolveTenant !== 'function') {
    throw new InvalidOptionsError('leasedHandler() needs resolveTenant(req): the caller scope of each key.');
  }
  if (typeof handler !== 'function') throw new InvalidOptionsError('leasedHandler() needs a handler function.');
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const semanticHeaders = (options.semanticHeaders ?? []).map((h) => h.toLowerCase());

  return async function leasedRoute(req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
    let response: IdempotentResponse;
    try {
      const key = parseIdempotencyKey(req.headers[IDEMPOTENCY_KEY_HEADER], { required: true });
      const tenant = assertValidTenant(await options.resolveTenant(req));
      const { fingerprint, body } = fingerprintAndParse({
        tenant,
        operation,
        method: req.method,
        body: rawBodyOf(req),
        semanticHeaders: pickHeaders(req.headers, semanticHeaders),
        maxBodyBytes,
      });
      req.body = body;
      const deadline = options.deadline?.(req);
      const result = await executeLeased(
        db,
        { tenant, operation, key, fingerprint, ...(deadline === undefined ? {} : { deadline }) },
        (ctx) => handler(req, ctx),
        opts,
      );
      response = result.response;
    } catch (err) {
      if (!isProblemError(err)) throw err;
      return sendProblem(reply, err, opts.base);
    }
    return reply.code(response.status).headers(response.headers).send(response.body);
  };
}

/**
 * Builds the `GET` handler of the operation resource that {@link leasedHandler} points to under
 * policy `async`, for a route with an `:operationId` parameter (see `serveOperation()`): the
 * stored result once finished, 202 while pending, 404 for an unknown id or another tenant's.
 */
export function operationHandler<D extends DatabaseHandle>(options: {
  db: D;
  operation: string;
  schema?: string;
  resolveTenant(req: FastifyRequest): string | undefined | Promise<string | undefined>;
}): (req: FastifyRequest<{ Params: { operationId: string } }>, reply: FastifyReply) => Promise<FastifyReply> {
  assertValidOperation(options.operation, 'operationHandler()');
  if (typeof options.resolveTenant !== 'function') {
    throw new InvalidOptionsError('operationHandler() needs resolveTenant(req): the caller scope of each key.');
  }
  return async function operationRoute(req, reply) {
    let response: IdempotentResponse;
    try {
      const tenant = assertValidTenant(await options.resolveTenant(req));
      response = await serveOperation(
        options.db,
        { tenant, operation: options.operation, operationId: req.params.operationId },
        options.schema === undefined ? {} : { schema: options.schema },
      );
    } catch (err) {
      if (!isProblemError(err)) throw err;
      return sendProblem(reply, err, {});
    }
    return reply.code(response.status).headers(response.headers).send(response.body);
  };
}

function sendProblem(reply: FastifyReply, err: unknown, opts: { retryAfterSeconds?: number }): FastifyReply {
  const problem = toProblem(err, opts);
  // A Buffer: Fastify would append "; charset=utf-8" to the content type of a string.
  return reply
    .code(problem.status)
    .headers(problem.headers)
    .send(Buffer.from(JSON.stringify(problem.body), 'utf8'));
}

function rawBodyOf(req: FastifyRequest): FingerprintInput['body'] {
  const body: unknown = req.body;
  if (body === undefined || body === null) return undefined;
  if (typeof body === 'string' || body instanceof Uint8Array) return body;
  throw new InvalidOptionsError(
    'The idempotent route received an already parsed body; call registerRawJsonBody() in its plugin scope so the fingerprint covers the raw bytes.',
  );
}

/** Options of {@link registerRawJsonBody}. */
export interface RawJsonBodyOptions {
  /** Content types whose body is kept raw. @defaultValue 'application/json' */
  contentType?: string | RegExp;
  /** Largest body read, in bytes. @defaultValue the Fastify instance's `bodyLimit` (1 MiB by default) */
  bodyLimit?: number;
}

/** The part of a Fastify instance {@link registerRawJsonBody} uses. */
export interface ContentTypeParserHost {
  hasContentTypeParser(contentType: string | RegExp): boolean;
  removeContentTypeParser(contentType: string | RegExp | (string | RegExp)[]): void;
  addContentTypeParser(
    contentType: string | string[] | RegExp,
    opts: { parseAs: 'buffer'; bodyLimit?: number },
    parser: (req: FastifyRequest, body: Buffer, done: (err: Error | null, body?: unknown) => void) => void,
  ): void;
}

/**
 * Replaces the JSON body parser of a Fastify instance (or plugin scope) with one that keeps the
 * raw bytes as `req.body` (a Buffer), which {@link idempotentHandler} fingerprints and then
 * replaces with the parsed JSON. Parsers are encapsulated: call it inside the plugin that
 * registers the idempotent routes to leave the app's other routes untouched.
 */
export function registerRawJsonBody(app: ContentTypeParserHost, options: RawJsonBodyOptions = {}): void {
  const contentType = options.contentType ?? 'application/json';
  if (options.bodyLimit !== undefined && (!Number.isSafeInteger(options.bodyLimit) || options.bodyLimit <= 0)) {
    throw new InvalidOptionsError(`bodyLimit must be a positive integer (bytes), got ${String(options.bodyLimit)}.`);
  }
  if (app.hasContentTypeParser(contentType)) app.removeContentTypeParser(contentType);
  app.addContentTypeParser(
    contentType,
    options.bodyLimit === undefined ? { parseAs: 'buffer' } : { parseAs: 'buffer', bodyLimit: options.bodyLimit },
    (_req, body, done) => done(null, body),
  );
}
