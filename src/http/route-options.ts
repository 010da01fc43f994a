/**
 * What the framework adapters (Fastify, Express) share: the options of an idempotent route and
 * the one-transaction request flow.
 */
import type { DatabaseHandle, TransactionOf } from '../database.js';
import { InvalidOptionsError } from '../errors.js';
import { executeIdempotent, executeWithoutKey, type ExecutionContext } from '../idempotency/execute.js';
import { fingerprintAndParse, parseJsonBody, type FingerprintInput } from '../idempotency/fingerprint.js';
import { IDEMPOTENCY_KEY_HEADER, parseIdempotencyKey } from '../idempotency/key.js';
import {
  resolveIdempotencyOptions,
  type IdempotencyOptions,
  type ResolvedIdempotencyOptions,
} from '../idempotency/options.js';
import type { HandlerResponse, IdempotentResult } from '../idempotency/state-machine.js';
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
   * put in a shared scope (case C21). Called only for requests that carry a key.
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
   * `express.raw({ limit })`) at or above it: bodies over that limit get the framework's own 413
   * before this handler runs. @defaultValue 1_048_576
   */
  maxBodyBytes?: number;
}

/** An idempotent route's options, validated once, as both adapters run them. */
export interface ResolvedRoute<D extends DatabaseHandle, Req> {
  db: D;
  operation: string;
  opts: ResolvedIdempotencyOptions;
  required: boolean;
  maxBodyBytes: number;
  semanticHeaders: readonly string[];
  resolveTenant(req: Req): string | undefined | Promise<string | undefined>;
}

/**
 * Validates an adapter's options once, when the route is built.
 * @throws {@link InvalidOptionsError} on an invalid operation, tenant resolver, handler or limit.
 */
export function resolveRoute<D extends DatabaseHandle, Req>(
  options: RouteIdempotencyOptions<D, Req>,
  handler: unknown,
  what: string,
): ResolvedRoute<D, Req> {
  const opts = resolveIdempotencyOptions(options);
  assertValidOperation(options.operation, what);
  if (typeof options.resolveTenant !== 'function') {
    throw new InvalidOptionsError(`${what} needs resolveTenant(req): the caller scope of each key.`);
  }
  if (typeof handler !== 'function') throw new InvalidOptionsError(`${what} needs a handler function.`);
  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  if (!Number.isSafeInteger(maxBodyBytes) || maxBodyBytes < 0) {
    throw new InvalidOptionsError(`maxBodyBytes must be a non-negative integer (bytes), got ${String(maxBodyBytes)}.`);
  }
  return {
    db: options.db,
    operation: options.operation,
    opts,
    required: options.required ?? true,
    maxBodyBytes,
    semanticHeaders: (options.semanticHeaders ?? []).map((h) => h.toLowerCase()),
    resolveTenant: (req) => options.resolveTenant(req),
  };
}

/** What the flow needs of a framework's request. */
export interface RouteRequest {
  headers: Record<string, string | string[] | undefined>;
  method: string;
  /** The raw body bytes (or undefined when there is none). */
  rawBody: FingerprintInput['body'];
  /** Replaces the request's body with the parsed JSON the fingerprint covered. */
  setBody(body: unknown): void;
}

/** The declared semantic headers of a request, lower-cased, repeated values joined by ", ". */
export function pickHeaders(headers: RouteRequest['headers'], names: readonly string[]): Record<string, string> {
  const picked: Record<string, string> = {};
  for (const name of names) {
    const value = headers[name];
    if (value === undefined) continue;
    picked[name] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return picked;
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
  const tenant = assertValidTenant(await route.resolveTenant(req));
  const { fingerprint, body } = fingerprintAndParse({
    tenant,
    operation: route.operation,
    method: parts.method,
    body: parts.rawBody,
    semanticHeaders: pickHeaders(parts.headers, route.semanticHeaders),
    maxBodyBytes: route.maxBodyBytes,
  });
  parts.setBody(body);
  return executeIdempotent(route.db, { tenant, operation: route.operation, key, fingerprint }, handler, route.opts);
}
