/**
 * Classification of errors raised by the idempotency store: by SQLSTATE (PostgreSQL Appendix A)
 * and Node.js system error codes, never by message text. Pure logic.
 */
import { schemaMissingOr } from '../errors.js';
import { CONNECTION_SOCKET_CODES, errorChain, MISSING_RELATION_SQLSTATES, SQLSTATE, sqlStateOf } from '../postgres.js';

export { SQLSTATE, sqlStateOf };

/**
 * SQLSTATE classes meaning "the store cannot serve now": 08 connection exception, 53 insufficient
 * resources (disk full, out of memory, too many connections), 58 system error (I/O).
 */
const UNAVAILABLE_CLASSES: ReadonlySet<string> = new Set(['08', '53', '58']);

const UNAVAILABLE_STATES: ReadonlySet<string> = new Set([
  SQLSTATE.ADMIN_SHUTDOWN,
  SQLSTATE.CRASH_SHUTDOWN,
  SQLSTATE.CANNOT_CONNECT_NOW,
  SQLSTATE.QUERY_CANCELED,
  SQLSTATE.READ_ONLY_SQL_TRANSACTION,
]);

function networkCodeOf(err: unknown): string | undefined {
  for (const e of errorChain(err)) {
    if (typeof e.code === 'string' && CONNECTION_SOCKET_CODES.has(e.code)) return e.code;
  }
  return undefined;
}

/** How an error raised by a store statement (not by the handler) is treated. */
export type StoreErrorKind =
  /** The claim waited longer than `lock_timeout`: another request holds the key. */
  | 'lock-timeout'
  /** A concurrent transaction claimed the key first (non-default isolation levels). */
  | 'serialization'
  /** The store cannot serve now: connection refused or lost, shutdown, resources exhausted. */
  | 'unavailable'
  /** Anything else (a missing table, a bug): propagated as is. */
  | 'other';

/**
 * Classifies an error raised while outboxkit itself talks to PostgreSQL (connect, BEGIN, claim,
 * read, complete, COMMIT).
 *
 * node-postgres reports a lost connection, a pool checkout timeout or an unusable client with a
 * plain `Error` that has no code at all; in this phase such an error can only come from the
 * driver, so it counts as `unavailable`. Programming errors (TypeError and its kin) are `other`.
 */
export function classifyStoreError(err: unknown): StoreErrorKind {
  const state = sqlStateOf(err);
  if (state !== undefined) {
    if (state === SQLSTATE.LOCK_NOT_AVAILABLE) return 'lock-timeout';
    if (state === SQLSTATE.SERIALIZATION_FAILURE) return 'serialization';
    if (UNAVAILABLE_STATES.has(state) || UNAVAILABLE_CLASSES.has(state.slice(0, 2))) return 'unavailable';
    return 'other';
  }
  if (networkCodeOf(err) !== undefined) return 'unavailable';
  if (
    err instanceof TypeError ||
    err instanceof RangeError ||
    err instanceof ReferenceError ||
    err instanceof SyntaxError
  ) {
    return 'other';
  }
  if (typeof err === 'object' && err !== null && typeof (err as { code?: unknown }).code === 'string') {
    // Another coded error (an outboxkit error, a Node.js error we do not know): not a driver failure.
    return 'other';
  }
  return err instanceof Error ? 'unavailable' : 'other';
}

/**
 * Turns "outboxkit's table or schema does not exist" (SQLSTATE 42P01 or 3F000, also when wrapped,
 * as drizzle's `DrizzleQueryError` wraps the driver error) into `SchemaMissingError` through
 * `schemaMissingOr()`; returns any other error unchanged. Only for errors of outboxkit's own
 * statements: a handler's error (its own missing table) is never converted.
 */
export function toSchemaMissing(err: unknown, schema: string): unknown {
  const state = sqlStateOf(err);
  if (state === undefined || !MISSING_RELATION_SQLSTATES.has(state)) return err;
  for (const e of errorChain(err)) if (e.code === state) return schemaMissingOr(e, schema);
  return err;
}

/** The unquoted schema of a table from `idempotencyTable()` (`"schema".idempotency_keys`). */
export function schemaOfTable(table: string): string {
  const match = /^"([^"]+)"\./.exec(table);
  return match?.[1] ?? table;
}
