/**
 * The request flows the framework adapters (Fastify, Express) share, for routes whose options
 * ./route-options.ts resolved: one-transaction mode, lease mode, and how an adapter answers what a
 * flow returned or threw (a response, an RFC 9457 problem, or an error for the framework).
 */
import type { ServerResponse } from 'node:http';
import type { DatabaseHandle, TransactionOf } from '../database.js';
import { isOutboxkitError } from '../errors.js';
import { BodyInvalidError } from '../idempotency/errors.js';
import { executeIdempotent, executeWithoutKey, type ExecutionContext } from '../idempotency/execute.js';
import { fingerprintAndParse, parseJsonBody, type Fingerprint } from '../idempotency/fingerprint.js';
import { IDEMPOTENCY_KEY_HEADER, parseIdempotencyKey } from '../idempotency/key.js';
import { executeLeased, type LeaseContext, type LeasedResult } from '../idempotency/lease.js';
import {
  REPLAYED_HEADER,
  type HandlerResponse,
  type IdempotentResponse,
  type IdempotentResult,
} from '../idempotency/state-machine.js';
import { assertValidTenant } from '../idempotency/text.js';
import { isProblemError, toProblem, type ProblemResponse } from './problem.js';
import { negotiateReplayEncoding } from './replay-encoding.js';
import type {
  ResolvedLeaseRoute,
  ResolvedOperationRoute,
  ResolvedRoute,
  RouteFailures,
  RouteScope,
} from './route-options.js';

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
function abortOnClose(res: ServerResponse): { signal: AbortSignal; stop(): void } {
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
 * One request of a one-transaction route, as the adapter answers it (see {@link RouteAnswer}): the
 * flow of {@link runIdempotentRoute}, with the route's handler.
 * @param partsOf - the parts of the framework's request the flow reads (it may throw a problem
 *   error: a body that was not kept raw).
 */
export function answerIdempotentRoute<D extends DatabaseHandle, Req>(
  route: ResolvedRoute<D, Req>,
  req: Req,
  partsOf: (req: Req) => RouteRequest,
): Promise<RouteAnswer<IdempotentResult>> {
  const { handler } = route; // called as a plain function, as the application passed it
  return answerRoute(route.failures, (own) =>
    runIdempotentRoute(
      route,
      req,
      partsOf(req),
      own.wrap((tx, ctx) => handler(req, tx, ctx)),
    ),
  );
}

/**
 * One request of a lease-mode route, as the adapter answers it (see {@link RouteAnswer}): the flow
 * of {@link runLeaseRoute}, with the route's handler; a wait ends when `res` closes before its
 * response is sent (the client went away).
 * @param partsOf - as {@link answerIdempotentRoute}'s.
 */
export async function answerLeaseRoute<D extends DatabaseHandle, Req>(
  route: ResolvedLeaseRoute<D, Req>,
  req: Req,
  partsOf: (req: Req) => RouteRequest,
  res: ServerResponse,
): Promise<RouteAnswer<LeasedResult>> {
  const { handler } = route; // called as a plain function, as the application passed it
  const client = abortOnClose(res);
  try {
    return await answerRoute(route.failures, (own) =>
      runLeaseRoute(
        route,
        req,
        { ...partsOf(req), signal: client.signal },
        own.wrap((ctx) => handler(req, ctx)),
      ),
    );
  } finally {
    client.stop();
  }
}

/**
 * One `GET` of an operation resource, as the adapter answers it (see {@link RouteAnswer}): a
 * stored result is sent for the request's `Accept-Encoding` as a retry's replay is
 * ({@link replayFor}).
 */
export function answerOperation<Req>(
  serve: ResolvedOperationRoute<Req>,
  req: Req,
  operationId: string,
  acceptEncoding: string | string[] | undefined,
): Promise<RouteAnswer<{ response: IdempotentResponse }>> {
  return answerRoute(serve.failures, async () => {
    const response = await serve(req, operationId);
    return {
      response:
        response.headers[REPLAYED_HEADER] === 'true'
          ? await negotiateReplayEncoding(response, acceptEncoding)
          : response,
    };
  });
}

/**
 * `result` as sent to the request of `parts`: a replay's stored response for the request's
 * `Accept-Encoding` (as stored, decoded, or {@link ReplayNotAcceptableError}: see
 * ./replay-encoding.ts); anything else unchanged.
 */
async function replayFor<R extends { replayed: boolean; response: IdempotentResponse }>(
  parts: RouteRequest,
  result: R,
): Promise<R> {
  if (!result.replayed) return result;
  return { ...result, response: await negotiateReplayEncoding(result.response, parts.headers['accept-encoding']) };
}

/**
 * The one-transaction flow of both adapters: parse the key, resolve the tenant, fingerprint the raw
 * body, then run `handler` through `executeIdempotent()` (or without protection when the key is
 * optional and absent); a replay is sent for the request's `Accept-Encoding` ({@link replayFor}).
 * Throws outboxkit's problem errors for the adapter to answer.
 */
async function runIdempotentRoute<D extends DatabaseHandle, Req>(
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
  return replayFor(
    parts,
    await executeIdempotent(route.db, await identify(route, req, parts, key), handler, route.opts),
  );
}

/**
 * The lease-mode flow of both adapters: parse the key (always required), resolve the tenant,
 * fingerprint the raw body, then run `handler` through `executeLeased()`, with the route's
 * `deadline(req)` and the request's `signal` (a wait ends when the client goes away); a replay is
 * sent for the request's `Accept-Encoding` ({@link replayFor}). Throws outboxkit's problem errors
 * for the adapter to answer.
 */
async function runLeaseRoute<D extends DatabaseHandle, Req>(
  route: ResolvedLeaseRoute<D, Req>,
  req: Req,
  parts: RouteRequest,
  handler: (ctx: LeaseContext<D>) => Promise<HandlerResponse>,
): Promise<LeasedResult> {
  const key = parseIdempotencyKey(parts.headers[IDEMPOTENCY_KEY_HEADER], { required: true });
  const request = await identify(route, req, parts, key);
  const deadline = route.deadline?.(req);
  const result = await executeLeased(
    route.db,
    {
      ...request,
      ...(deadline === undefined ? {} : { deadline }),
      ...(parts.signal === undefined ? {} : { signal: parts.signal }),
    },
    handler,
    route.opts,
  );
  return replayFor(parts, result);
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
function handlerErrors(): HandlerErrors {
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
 * What an adapter does with one request: send `response`, or hand `error` to the framework's error
 * handling unchanged. `result` is what the route's flow returned; it is absent when `response` is
 * a problem.
 */
export type RouteAnswer<R> = { response: IdempotentResponse; result?: R } | { error: unknown };

/**
 * Runs one request's `flow` (given the request's {@link HandlerErrors}, to wrap the application's
 * handler with) and says what the adapter answers: the flow's response, else the problem of the
 * error it threw, or that error itself (see {@link problemForRouteError}).
 */
async function answerRoute<R extends { response: IdempotentResponse }>(
  failures: RouteFailures,
  flow: (handler: HandlerErrors) => Promise<R>,
): Promise<RouteAnswer<R>> {
  const handler = handlerErrors();
  try {
    const result = await flow(handler);
    return { response: result.response, result };
  } catch (err) {
    const problem = problemForRouteError(err, handler, failures);
    return problem === undefined ? { error: err } : { response: problemBytes(problem) };
  }
}

/**
 * A problem response as bytes. A Buffer: a framework would append "; charset=utf-8" to the
 * content type of a string (Fastify does).
 */
function problemBytes(problem: ProblemResponse): IdempotentResponse {
  return { status: problem.status, headers: problem.headers, body: Buffer.from(JSON.stringify(problem.body), 'utf8') };
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
function problemForRouteError(
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
