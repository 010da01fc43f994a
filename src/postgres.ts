/**
 * What outboxkit's SQL shares: the SQLSTATE codes it reacts to (PostgreSQL documentation,
 * Appendix A "PostgreSQL Error Codes"), reading them through wrappers, the names of its prepared
 * statements, and the shape of a built statement. Pure logic, no dependencies.
 */
import { createHash } from 'node:crypto';
import { UNREACHABLE_SOCKET_CODES } from './socket-codes.js';

/** A statement built by one of outboxkit's SQL builders: its text, its values, and its name when prepared. */
export interface SqlStatement {
  text: string;
  values: unknown[];
  /** The prepared statement's name (see {@link statementName}); absent for a one-off statement. */
  name?: string;
}

/** SQLSTATE values outboxkit reacts to. */
export const SQLSTATE = Object.freeze({
  /** `read_only_sql_transaction`: connected to a standby (after a failover, for example). */
  READ_ONLY_SQL_TRANSACTION: '25006',
  /** `no_active_sql_transaction`: a statement that needs a transaction block ran outside one. */
  NO_ACTIVE_SQL_TRANSACTION: '25P01',
  /** `in_failed_sql_transaction`: the transaction already failed and must be rolled back. */
  IN_FAILED_SQL_TRANSACTION: '25P02',
  /** `invalid_authorization_specification`: the role may not log in (or pg_hba.conf refuses it). */
  INVALID_AUTHORIZATION_SPECIFICATION: '28000',
  /** `invalid_password`. */
  INVALID_PASSWORD: '28P01',
  /** `invalid_catalog_name`: the database does not exist. */
  INVALID_CATALOG_NAME: '3D000',
  /** `invalid_schema_name`: the schema does not exist. */
  INVALID_SCHEMA_NAME: '3F000',
  /** `serialization_failure`: under REPEATABLE READ/SERIALIZABLE, a concurrent transaction won. */
  SERIALIZATION_FAILURE: '40001',
  /**
   * `insufficient_privilege`: the role lacks a privilege the statement needs (USAGE on a schema,
   * SELECT on a table, ownership of a table, `REPLICATION`, signalling another role's backend without
   * `pg_signal_backend`...).
   */
  INSUFFICIENT_PRIVILEGE: '42501',
  /** `undefined_table`: the table does not exist. */
  UNDEFINED_TABLE: '42P01',
  /** `undefined_column`: a column that does not exist (a migration not run yet). */
  UNDEFINED_COLUMN: '42703',
  /** `undefined_object`: for example a replication slot or publication that does not exist. */
  UNDEFINED_OBJECT: '42704',
  /** `duplicate_object`: for example a replication slot or publication that already exists. */
  DUPLICATE_OBJECT: '42710',
  /** `object_in_use`: for example a replication slot another walsender holds. */
  OBJECT_IN_USE: '55006',
  /** `too_many_connections`. */
  TOO_MANY_CONNECTIONS: '53300',
  /** `lock_not_available`: `lock_timeout` expired while waiting for a lock. */
  LOCK_NOT_AVAILABLE: '55P03',
  /** `query_canceled`: `statement_timeout` (or a cancel request). */
  QUERY_CANCELED: '57014',
  /** `admin_shutdown`: the server is shutting down or the backend was terminated. */
  ADMIN_SHUTDOWN: '57P01',
  /** `crash_shutdown`. */
  CRASH_SHUTDOWN: '57P02',
  /** `cannot_connect_now`: the server is starting up or in recovery. */
  CANNOT_CONNECT_NOW: '57P03',
});

/** A table or schema of outboxkit's does not exist: `outboxkit migrate` was not run (or another schema was given). */
export const MISSING_RELATION_SQLSTATES: ReadonlySet<string> = new Set([
  SQLSTATE.UNDEFINED_TABLE,
  SQLSTATE.INVALID_SCHEMA_NAME,
]);

/** The connection string names a database or a role the server refuses. */
export const CONNECTION_SETTING_SQLSTATES: ReadonlySet<string> = new Set([
  SQLSTATE.INVALID_CATALOG_NAME,
  SQLSTATE.INVALID_PASSWORD,
  SQLSTATE.INVALID_AUTHORIZATION_SPECIFICATION,
]);

/** SQLSTATE class 08, `connection_exception`: the connection failed, not the statement. */
export const CONNECTION_EXCEPTION_CLASS = '08';

/**
 * The server ended the session or refuses new ones (a shutdown, recovery, too many connections):
 * outside class 08, yet the connection failed, not the statement.
 */
export const CONNECTION_LOST_SQLSTATES: ReadonlySet<string> = new Set([
  SQLSTATE.ADMIN_SHUTDOWN,
  SQLSTATE.CRASH_SHUTDOWN,
  SQLSTATE.CANNOT_CONNECT_NOW,
  SQLSTATE.TOO_MANY_CONNECTIONS,
]);

const SQLSTATE_PATTERN = /^[0-9A-Z]{5}$/;

/** Errors, their causes and (for AggregateError) their members, up to a small depth. */
export function* errorChain(err: unknown, depth = 0): Generator<Record<string, unknown>> {
  if (depth > 5 || typeof err !== 'object' || err === null) return;
  const e = err as Record<string, unknown>;
  yield e;
  if ('cause' in e) yield* errorChain(e.cause, depth + 1);
  if (Array.isArray(e.errors)) for (const inner of e.errors) yield* errorChain(inner, depth + 1);
}

/**
 * The SQLSTATE of a PostgreSQL error, looking through wrappers (drizzle's `DrizzleQueryError`
 * keeps the driver's error as `cause`), or undefined.
 */
export function sqlStateOf(err: unknown): string | undefined {
  for (const e of errorChain(err)) {
    if (typeof e.code === 'string' && SQLSTATE_PATTERN.test(e.code)) return e.code;
  }
  return undefined;
}

/**
 * Node.js socket codes of a connection to PostgreSQL that could not be made
 * ({@link UNREACHABLE_SOCKET_CODES}, and a host or network down) or was cut: the one list of
 * {@link isConnectionFailure} and of the idempotency store's classification (pg-errors.ts).
 */
export const CONNECTION_SOCKET_CODES: ReadonlySet<string> = new Set([
  ...UNREACHABLE_SOCKET_CODES,
  'EHOSTDOWN',
  'ENETDOWN',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
]);

/**
 * Whether `err`, or an error it wraps (`cause`, AggregateError's `errors`), says that the
 * connection to PostgreSQL failed rather than a statement: a Node.js socket code (connection
 * refused, reset, no route...), a SQLSTATE of class 08 `connection_exception`, or one of
 * {@link CONNECTION_LOST_SQLSTATES} (a shutdown, recovery, too many connections). pg's own
 * "Connection terminated unexpectedly" carries no code and is not recognised.
 */
export function isConnectionFailure(err: unknown): boolean {
  for (const e of errorChain(err)) {
    if (typeof e.code !== 'string') continue;
    if (CONNECTION_SOCKET_CODES.has(e.code)) return true;
    if (SQLSTATE_PATTERN.test(e.code)) {
      return e.code.startsWith(CONNECTION_EXCEPTION_CLASS) || CONNECTION_LOST_SQLSTATES.has(e.code);
    }
  }
  return false;
}

const statementNames = new Map<string, string>();

/**
 * A stable name for a hot-path statement's text (`outboxkit_<prefix>_<16 hex digits of its SHA-1>`):
 * node-postgres then prepares it once per connection, and PostgreSQL skips the parse and, once it
 * settles on a generic plan, the planning. The name is derived from the text, schema included, so
 * that components of different schemas sharing a pool never give one name two texts. After a
 * session reset on the connection (`DEALLOCATE ALL`, `DISCARD ALL`) node-postgres parses it again,
 * and where outboxkit cannot tell what the session holds it runs unnamed
 * (`preparedStatementName()`, src/prepared-statements.ts). Behind PgBouncer
 * in transaction mode, prepared statements need PgBouncer 1.21 or later with
 * `max_prepared_statements` set.
 */
export function statementName(prefix: string, text: string): string {
  let name = statementNames.get(text);
  if (name === undefined) {
    name = `outboxkit_${prefix}_${createHash('sha1').update(text).digest('hex').slice(0, 16)}`;
    statementNames.set(text, name);
  }
  return name;
}
