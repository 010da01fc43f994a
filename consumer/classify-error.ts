/**
 * Sorting the failures of a handler transaction: pure logic, no I/O.
 *
 * An attempt only counts towards `maxAttempts` (and so towards the dead-letter topic) when the
 * failure belongs to the message. A lost or refused database connection says nothing about the
 * message: dead-lettering on it would empty a topic into its DLQ during a PostgreSQL outage, so
 * such failures are retried with backoff for as long as they last, holding only their partition.
 */
import { isOutboxkitError, NotInTransactionError } from '../src/errors.js';
import { CONNECTION_EXCEPTION_CLASS, CONNECTION_LOST_SQLSTATES } from '../src/postgres.js';

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
    if (code.length === 5 && (code.startsWith(CONNECTION_EXCEPTION_CLASS) || CONNECTION_LOST_SQLSTATES.has(code)))
      return true;
    if (SOCKET_ERROR_CODES.has(code)) return true;
  }
  return false;
}

/** True when a handler declared its message unusable: dead-letter now, retrying cannot help. */
export function isInvalidMessage(err: unknown): boolean {
  return isOutboxkitError(err, 'OUTBOXKIT_INVALID_MESSAGE');
}

/**
 * An error of the application's handler, as opposed to one of the consumer's own statements: what
 * the handler threw (`error`), or a failed statement it swallowed ({@link swallowedFailure}). Only
 * these count as attempts. Internal: the consumer unwraps it (its `error` is what users see, in
 * `consumer:failed` events, logs and dead-letter reasons); it never leaves the consumer.
 */
export class HandlerFailure extends Error {
  constructor(readonly error: unknown) {
    super('The handler failed', { cause: error });
  }
}

/** The handler returned normally although one of its statements had failed and aborted the transaction. */
export function swallowedFailure(cause: unknown): HandlerFailure {
  return new HandlerFailure(
    new NotInTransactionError(
      'The handler returned normally, but its transaction had failed (a failed statement was caught and ignored); ' +
        'its effects were rolled back. Let statement errors propagate out of the handler.',
      { cause },
    ),
  );
}
