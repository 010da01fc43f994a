/**
 * Errors specific to the dedup consumer. Like every outboxkit error they extend
 * {@link OutboxkitError} and are recognised by `code` (or `isOutboxkitError(err, code)`), not by
 * `instanceof`.
 */
import { OutboxkitError, type OutboxkitErrorOptions } from '../src/errors.js';

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
 */
export class InboxUnavailableError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_STORE_UNAVAILABLE', message, options);
  }
}
