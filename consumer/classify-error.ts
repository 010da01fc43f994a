/**
 * Sorting the failures of a handler transaction: pure logic, no I/O.
 *
 * An attempt only counts towards `maxAttempts` (and so towards the dead-letter topic) when the
 * failure belongs to the message. A failure of the consumer's own database connection says
 * nothing about the message: dead-lettering on it would empty a topic into its DLQ during a
 * PostgreSQL outage, so such failures are retried with backoff for as long as they last, holding
 * only their partition.
 *
 * Which failures are the consumer's is decided by where they come from, never by an error code:
 * what the handler throws comes out wrapped in a {@link HandlerFailure}, network errors included
 * (`ECONNRESET` from the service it calls, a connection of another pool terminated with SQLSTATE
 * 57P01): an attempt. The consumer's own statements (BEGIN, the inbox claim, COMMIT, a checkout
 * from its pool) fail unwrapped: not an attempt. A handler failure whose rollback fails too (the
 * consumer's connection is gone: the handler's statement on `tx` met a terminated backend) comes
 * out as a {@link ConnectionLostError}: not an attempt either (inbox-transaction.ts).
 */
import { isOutboxkitError, NotInTransactionError } from '../src/errors.js';
import { InboxUnavailableError } from './errors.js';

/** Error codes along the `cause` chain (drizzle wraps driver errors in a `DrizzleQueryError`). */
export function* codesOf(err: unknown): Generator<string> {
  for (let e = err, depth = 0; typeof e === 'object' && e !== null && depth < 8; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string') yield code;
    e = (e as { cause?: unknown }).cause;
  }
}

/** True when a handler declared its message unusable: dead-letter now, retrying cannot help. */
export function isInvalidMessage(err: unknown): boolean {
  return isOutboxkitError(err, 'OUTBOXKIT_INVALID_MESSAGE');
}

/**
 * When a handler threw a `RetryLaterError` (code `OUTBOXKIT_RETRY_LATER`, from any copy of
 * outboxkit), the wait it asked for: `{ delayMs }`, `delayMs` undefined when it named none (or
 * one that is not a finite number ≥ 0). Else undefined.
 */
export function retryLaterOf(err: unknown): { delayMs: number | undefined } | undefined {
  if (!isOutboxkitError(err, 'OUTBOXKIT_RETRY_LATER')) return undefined;
  const delayMs = (err as { delayMs?: unknown }).delayMs;
  return { delayMs: typeof delayMs === 'number' && Number.isFinite(delayMs) && delayMs >= 0 ? delayMs : undefined };
}

/**
 * An error of the application's handler, as opposed to one of the consumer's own statements: what
 * the handler threw (`error`), or a failed statement it swallowed ({@link swallowedFailure}). Only
 * these count as attempts. Internal: the consumer unwraps it (its `error` is what users see, in
 * `consumer:retry` events, logs and dead-letter reasons); it never leaves the consumer.
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

/**
 * The consumer's own database connection failed during a message's transaction: the handler
 * failed, and the rollback of its effects (ROLLBACK, or ROLLBACK TO the message's savepoint) failed
 * too, so the connection that holds the inbox row is gone (terminated, reset, server restarted).
 * Whatever the handler threw (`handlerError`, often the same lost connection seen by its
 * statement on `tx`), this is an outage, not the message's failure: never an attempt. A
 * rollback that succeeds proves the connection alive, and the handler's error then counts, even
 * one whose code names a lost connection (it came from another connection than the consumer's).
 *
 * Internal class; it leaves the consumer as the `error` of `consumer:error` (and in its log
 * line), where it is an `InboxUnavailableError` (code `OUTBOXKIT_STORE_UNAVAILABLE`, retriable)
 * whose `cause` is the rollback's error.
 */
export class ConnectionLostError extends InboxUnavailableError {
  /** What the handler threw. */
  readonly handlerError: unknown;

  constructor(handlerError: unknown, rollbackError: unknown) {
    super(
      "The consumer's database connection failed during the message's transaction (the rollback after the " +
        "handler's failure failed too); not counted as an attempt, the message runs again.",
      { cause: rollbackError, retriable: true },
    );
    this.handlerError = handlerError;
  }
}

/**
 * What a failed rollback of `error` (a message's failure) makes of it: a handler's failure
 * becomes a {@link ConnectionLostError} (the consumer's connection is gone); any other failure
 * is returned as `otherwise` gives it.
 */
export function afterFailedRollback(error: unknown, rollbackError: unknown, otherwise: unknown): unknown {
  return error instanceof HandlerFailure ? new ConnectionLostError(error.error, rollbackError) : otherwise;
}
