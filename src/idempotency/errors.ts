/**
 * Errors of the idempotency layer. Each has a stable code from {@link ERROR_CODES}; recognise them
 * with `isOutboxkitError(err, 'OUTBOXKIT_KEY_MISMATCH')` rather than `instanceof`.
 * The HTTP mapping (status, problem type) lives in src/http/problem.ts.
 */
import { OutboxkitError, type OutboxkitErrorOptions } from '../errors.js';

/** Options of the retriable errors that tell the client when to come back. */
export interface RetryAfterErrorOptions extends Omit<OutboxkitErrorOptions, 'retriable'> {
  /** Seconds the client should wait before retrying (sent as `Retry-After`). @defaultValue 1 */
  retryAfterSeconds?: number;
}

/** The request has no `Idempotency-Key` header but the operation requires one. HTTP 400. */
export class KeyMissingError extends OutboxkitError {
  constructor(
    message = 'This operation requires an Idempotency-Key header; send a unique key (for example a UUID) and reuse it for retries of the same request.',
    options?: OutboxkitErrorOptions,
  ) {
    super('OUTBOXKIT_KEY_MISSING', message, options);
  }
}

/**
 * The `Idempotency-Key` header is empty, longer than 255 characters, not visible ASCII, not a
 * valid RFC 8941 string, or sent more than once. HTTP 400.
 */
export class KeyInvalidError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_KEY_INVALID', message, options);
  }
}

/** The tenant of the request could not be determined; it is refused, never put in a shared scope. HTTP 400. */
export class TenantUnresolvedError extends OutboxkitError {
  constructor(
    message = 'The caller (tenant) of this request could not be determined; authenticate the request before sending an Idempotency-Key.',
    options?: OutboxkitErrorOptions,
  ) {
    super('OUTBOXKIT_TENANT_UNRESOLVED', message, options);
  }
}

/** The body is larger than the fingerprint limit; nothing was recorded. HTTP 413. */
export class BodyTooLargeError extends OutboxkitError {
  /** The limit that was exceeded, in bytes. */
  readonly maxBodyBytes: number;

  constructor(message: string, maxBodyBytes: number, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_BODY_TOO_LARGE', message, options);
    this.maxBodyBytes = maxBodyBytes;
  }
}

/**
 * The body cannot be fingerprinted: not UTF-8 JSON, not I-JSON (duplicate member names, lone
 * surrogates), or a number that JSON cannot hold without rounding. HTTP 400; nothing recorded.
 */
export class BodyInvalidError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_BODY_INVALID', message, options);
  }
}

/**
 * The key was already used, within its retention, for a request with a different fingerprint
 * (body, semantic headers or method). HTTP 422. The stored response is never returned for it.
 */
export class KeyMismatchError extends OutboxkitError {
  constructor(
    message = 'Idempotency key reused with a different request (body or semantic headers); send a new key, or the identical request to get the stored result.',
    options?: OutboxkitErrorOptions,
  ) {
    super('OUTBOXKIT_KEY_MISMATCH', message, options);
  }
}

/**
 * Another request with the same key is still being processed (policy `reject`), or did not finish
 * within `waitTimeoutMs` (policy `wait`). Retriable: HTTP 409 with `Retry-After`.
 */
export class KeyInProgressError extends OutboxkitError {
  /** Seconds the client should wait before retrying. */
  readonly retryAfterSeconds: number;

  constructor(
    message = 'A request with this idempotency key is still being processed; retry the identical request after the Retry-After delay.',
    options: RetryAfterErrorOptions = {},
  ) {
    super('OUTBOXKIT_KEY_IN_PROGRESS', message, { cause: options.cause, retriable: true });
    this.retryAfterSeconds = options.retryAfterSeconds ?? 1;
  }
}

/**
 * The idempotency store (PostgreSQL) could not be reached or failed before the outcome was known;
 * the handler did not run unprotected. Retriable: HTTP 503 with `Retry-After`. When it is raised
 * after the handler ran (the COMMIT failed), the retry either replays the committed result or
 * executes again, never both.
 */
export class StoreUnavailableError extends OutboxkitError {
  /** Seconds the client should wait before retrying. */
  readonly retryAfterSeconds: number;

  constructor(
    message = 'The idempotency store (PostgreSQL) is unavailable; retry the identical request after the Retry-After delay.',
    options: RetryAfterErrorOptions = {},
  ) {
    super('OUTBOXKIT_STORE_UNAVAILABLE', message, { cause: options.cause, retriable: true });
    this.retryAfterSeconds = options.retryAfterSeconds ?? 1;
  }
}

/**
 * The request's deadline (`executeLeased()`'s `request.deadline`, or what a lease route's
 * `deadline(req)` returned) is not a finite number of milliseconds since the epoch: `NaN` (for
 * example from a malformed `Request-Timeout` header), an infinity or not a number. Refused before
 * anything is read or written. HTTP 400 `deadline-invalid`.
 */
export class DeadlineInvalidError extends OutboxkitError {
  constructor(
    message = "The request's deadline is not a valid time; send a valid timeout, or none.",
    options?: OutboxkitErrorOptions,
  ) {
    super('OUTBOXKIT_DEADLINE_INVALID', message, options);
  }
}

/**
 * The record is no longer owned by this execution (its owner token changed): the completion
 * updated zero rows and the result was not stored. Cannot happen in one-transaction mode unless
 * the record was changed outside outboxkit; in lease mode it fences a stale owner.
 */
export class LeaseLostError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_LEASE_LOST', message, options);
  }
}

/**
 * A retry of a completed or failed key cannot be answered with its stored response for its
 * `Accept-Encoding`: the field refuses the stored content coding and refuses identity too
 * (`identity;q=0`, or `*;q=0` without an `identity` member), or refuses the stored coding while
 * outboxkit cannot decode it (a coding other than gzip, x-gzip, deflate and br, or a stored 206,
 * whose range counts coded bytes). HTTP 406 `replay-not-acceptable` (RFC 9110 §12.5.3,
 * §15.5.7). Nothing changes: the stored response stays, and a retry whose `Accept-Encoding`
 * accepts its coding (or identity, for a coding outboxkit decodes) replays it.
 */
export class ReplayNotAcceptableError extends OutboxkitError {
  /** The stored response's content codings, in the order they were applied (`['gzip']`). */
  readonly storedCodings: readonly string[];

  constructor(storedCodings: readonly string[], message?: string, options?: OutboxkitErrorOptions) {
    super(
      'OUTBOXKIT_REPLAY_NOT_ACCEPTABLE',
      message ??
        `The stored response of this idempotency key is encoded with ${storedCodings.join(', ')}, which this request's Accept-Encoding refuses; retry with an Accept-Encoding that accepts it.`,
      options,
    );
    this.storedCodings = Object.freeze([...storedCodings]);
  }
}
