/**
 * Sorting the failures of a handler transaction: pure logic, no I/O.
 *
 * An attempt only counts towards `maxAttempts` (and so towards the dead-letter topic) when the
 * failure belongs to the message. A lost or refused database connection says nothing about the
 * message: dead-lettering on it would empty a topic into its DLQ during a PostgreSQL outage, so
 * such failures are retried with backoff for as long as they last, holding only their partition.
 */
import { isOutboxkitError } from '../src/errors.js';

/** SQLSTATE values and classes (PostgreSQL, Appendix A) that mean the connection, not the data. */
const CONNECTION_SQLSTATE_CLASS = '08'; // connection_exception
const CONNECTION_SQLSTATES = new Set([
  '57P01', // admin_shutdown
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now
  '53300', // too_many_connections
]);
/** Node.js socket errors (errno codes) seen when the database is unreachable. */
const SOCKET_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
]);

/** Error codes along the `cause` chain (drizzle wraps driver errors in a `DrizzleQueryError`). */
export function* codesOf(err: unknown): Generator<string> {
  for (let e = err, depth = 0; typeof e === 'object' && e !== null && depth < 8; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string') yield code;
    e = (e as { cause?: unknown }).cause;
  }
}

/** True when `err` (or its cause) says the database connection failed, not the statement. */
export function isConnectionError(err: unknown): boolean {
  for (const code of codesOf(err)) {
    if (code.length === 5 && (code.startsWith(CONNECTION_SQLSTATE_CLASS) || CONNECTION_SQLSTATES.has(code)))
      return true;
    if (SOCKET_ERROR_CODES.has(code)) return true;
  }
  return false;
}

/** True when a handler declared its message unusable: dead-letter now, retrying cannot help. */
export function isInvalidMessage(err: unknown): boolean {
  return isOutboxkitError(err, 'OUTBOXKIT_INVALID_MESSAGE');
}
