/**
 * What the framework adapters (Fastify, Express) share: the options of an idempotent route.
 */
import type { DatabaseHandle } from '../database.js';
import type { IdempotencyOptions } from '../idempotency/options.js';

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
