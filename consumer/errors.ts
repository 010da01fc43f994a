/**
 * Errors specific to the dedup consumer. Like every outboxkit error they extend
 * {@link OutboxkitError} and are recognised by `code` (or `isOutboxkitError(err, code)`), not by
 * `instanceof`.
 */
import { InvalidOptionsError, OutboxkitError, type OutboxkitErrorOptions } from '../src/errors.js';

/**
 * A Kafka message cannot be turned into an event the handler can use: its value is missing or is
 * not JSON (thrown by {@link ConsumedEvent.json}), or the handler itself decided the message is
 * unusable.
 *
 * A handler that throws this error (code `OUTBOXKIT_INVALID_MESSAGE`, from any copy of outboxkit)
 * has its message dead-lettered at once, without further attempts: retrying cannot fix bad input.
 */
export class InvalidMessageError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_INVALID_MESSAGE', message, options);
  }
}

/**
 * The consumer cannot use its inbox table: PostgreSQL does not answer (`retriable: true`), or the
 * table does not exist in the configured schema (`retriable: false`; run `outboxkit migrate`, or
 * check the `schema` option). Thrown by `DedupConsumer.start()`; code `OUTBOXKIT_STORE_UNAVAILABLE`.
 * While the consumer runs, it is also the `error` of a `consumer:error` event (name
 * `ConnectionLostError`, `retriable: true`, `cause`: the driver's error) when the consumer's own
 * connection failed during a message's transaction: the handler failed and the rollback failed
 * too. Not counted as an attempt; the message runs again.
 */
export class InboxUnavailableError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_STORE_UNAVAILABLE', message, options);
  }
}

/** Options of a {@link RetryLaterError}. */
export interface RetryLaterErrorOptions {
  /**
   * How long the message's partition waits before the message runs again, in ms (a finite number
   * ≥ 0; the consumer waits at least until its next fetch, and never past `maxRetryLaterMs`). For
   * example the seconds of an HTTP `Retry-After` times 1,000. @defaultValue the consumer's
   * backoff: full jitter below `min(retryMaxMs, retryInitialMs * 2^(n-1))` for the `n`th deferral
   */
  delayMs?: number;
  /** The underlying error (the downstream's answer or network error), if any. */
  cause?: unknown;
}

/**
 * Thrown by a dedup consumer's handler that knows its message cannot be handled **now** for a
 * reason that is not the message's: the service it calls is down, overloaded or rate-limits it.
 * The handler's transaction rolls back, its partition waits `delayMs` (other partitions go on),
 * and the message runs again **without counting an attempt** towards `maxAttempts`.
 *
 * Bounded: a message is deferred this way for at most the consumer's `maxRetryLaterMs`
 * (15 minutes by default), counted from its first deferral on this member; after that a
 * `RetryLaterError` counts as an attempt like any other error, so the message is dead-lettered
 * after `maxAttempts` with this error as its reason and the partition moves on. Every deferral is
 * logged (warn), emitted as `consumer:retry-later` and counted in
 * `outboxkit_consumer_retry_later_total`.
 *
 * Any other error a handler throws (network errors such as `ECONNRESET`, `ETIMEDOUT` or undici's
 * `fetch failed` included) counts as an attempt. Recognised by code `OUTBOXKIT_RETRY_LATER` (from
 * any copy of outboxkit), only when the handler throws it itself (not as the `cause` of another
 * error); `retriable` is always true.
 *
 * @example
 * ```ts
 * const res = await fetch(url, { method: 'POST', body, signal });
 * if (res.status === 503) throw new RetryLaterError('payments API unavailable', { delayMs: 30_000 });
 * ```
 * @throws {@link InvalidOptionsError} from the constructor when `delayMs` is not a finite number ≥ 0.
 */
export class RetryLaterError extends OutboxkitError {
  /** The wait asked for, in ms; undefined: the consumer's backoff. */
  readonly delayMs: number | undefined;

  constructor(message: string, options: RetryLaterErrorOptions = {}) {
    const { delayMs, cause } = options;
    if (delayMs !== undefined && !(typeof delayMs === 'number' && Number.isFinite(delayMs) && delayMs >= 0)) {
      throw new InvalidOptionsError(
        `RetryLaterError: delayMs must be a finite number of milliseconds ≥ 0 (or left out for the consumer's backoff); got ${String(delayMs)}.`,
      );
    }
    super('OUTBOXKIT_RETRY_LATER', message, { cause, retriable: true });
    this.delayMs = delayMs;
  }
}
