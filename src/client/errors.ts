/**
 * Errors of the idempotent HTTP client: {@link OutboxkitError}s with codes of their own in
 * `ERROR_CODES` (`OUTBOXKIT_CLIENT_REJECTED`, `OUTBOXKIT_CLIENT_GAVE_UP`), so `isOutboxkitError()`
 * recognises them as it does every error of outboxkit; `isClientError(err, code)` narrows to the
 * client's. Invalid options throw the library's `InvalidOptionsError`.
 */
import { OutboxkitError } from '../errors.js';
import type { ProblemDetails } from '../http/problem.js';

/** Every error code of the client (a part of `ERROR_CODES`). */
export const CLIENT_ERROR_CODES = ['OUTBOXKIT_CLIENT_REJECTED', 'OUTBOXKIT_CLIENT_GAVE_UP'] as const;

/** Union of the client's error codes. */
export type ClientErrorCode = (typeof CLIENT_ERROR_CODES)[number];

const BRAND = Symbol.for('outboxkit.client-error');

/** What every client error carries about the logical operation. */
export interface ClientErrorDetails {
  /** The HTTP method, upper case. */
  method: string;
  /** The request path (relative to `baseUrl`). */
  path: string;
  /** The Idempotency-Key the attempts carried: reuse it to retry the same operation later. */
  idempotencyKey: string;
  /** How many HTTP attempts were made (1 = no retry). */
  attempts: number;
  /** Time from the first attempt to the error, in ms. */
  elapsedMs: number;
}

/**
 * Base class of the client's errors: an {@link OutboxkitError} (a stable `code`, `retriable`:
 * whether sending the same operation again later with the same key may succeed, `cause`) with the
 * operation's details.
 */
export class IdempotentClientError extends OutboxkitError implements ClientErrorDetails {
  declare readonly code: ClientErrorCode;
  readonly method: string;
  readonly path: string;
  readonly idempotencyKey: string;
  readonly attempts: number;
  readonly elapsedMs: number;
  readonly [BRAND] = true;

  constructor(
    code: ClientErrorCode,
    message: string,
    details: ClientErrorDetails,
    options: { retriable: boolean; cause?: unknown },
  ) {
    super(code, message, options);
    this.method = details.method;
    this.path = details.path;
    this.idempotencyKey = details.idempotencyKey;
    this.attempts = details.attempts;
    this.elapsedMs = details.elapsedMs;
  }
}

/** True when `err` is an error of the client (from any copy of the library), optionally of one code. */
export function isClientError(err: unknown, code?: ClientErrorCode): err is IdempotentClientError {
  if (typeof err !== 'object' || err === null) return false;
  if ((err as Record<symbol, unknown>)[BRAND] !== true) return false;
  return code === undefined || (err as IdempotentClientError).code === code;
}

/** An RFC 9457 problem as received: outboxkit's members when the server is outboxkit, any others as sent. */
export type ReceivedProblem = Partial<ProblemDetails> & Record<string, unknown>;

/**
 * The server answered with a status that is never retried: 400 (bad key or body), 413 (body too
 * large), 422 (key reused with another body: send a new key, or the identical request), or any
 * other status outside `retryStatuses` (401, 403, 404, 500, ...). Sending the same request again
 * would get the same answer: fix the request. Not retriable.
 */
export class RequestRejectedError extends IdempotentClientError {
  /** The HTTP status. */
  readonly status: number;
  /** The response headers. */
  readonly headers: Headers;
  /** The response body bytes. */
  readonly body: Uint8Array;
  /**
   * The parsed problem details when the response is `application/problem+json` (RFC 9457) and a
   * JSON object, for example `{ type, title, status, detail, code: 'OUTBOXKIT_KEY_MISMATCH' }`.
   */
  readonly problem: ReceivedProblem | undefined;

  constructor(
    details: ClientErrorDetails,
    response: { status: number; headers: Headers; body: Uint8Array; problem: ReceivedProblem | undefined },
  ) {
    const problem = response.problem;
    const what = problem?.code ?? problem?.title;
    const detail = typeof problem?.detail === 'string' ? ` ${problem.detail}` : '';
    super(
      'OUTBOXKIT_CLIENT_REJECTED',
      `${details.method} ${details.path} was rejected with ${response.status}${what ? ` (${String(what)})` : ''}; ` +
        `it is not retried: the same request would get the same answer.${detail}`,
      details,
      { retriable: false },
    );
    this.status = response.status;
    this.headers = response.headers;
    this.body = response.body;
    this.problem = problem;
  }
}

/** Why the client stopped retrying. */
export type GiveUpReason = 'max-attempts' | 'deadline';

/**
 * The client stopped retrying: `maxAttempts` attempts failed, or the next attempt could not start
 * before the deadline (including a `Retry-After` that reaches past it). Every attempt failed with a
 * retriable outcome (network error, timeout, 409, 503, ...), so the outcome is unknown: the
 * operation may or may not have been executed. Retriable: send it again later with the same
 * `idempotencyKey`, and the server replays or executes it exactly once.
 */
export class RetriesExhaustedError extends IdempotentClientError {
  readonly reason: GiveUpReason;
  /** The status of the last attempt, or `undefined` when it got no response (network error, timeout). */
  readonly lastStatus: number | undefined;

  constructor(
    details: ClientErrorDetails,
    failure: { reason: GiveUpReason; lastStatus: number | undefined; lastError: unknown },
  ) {
    const last =
      failure.lastStatus !== undefined
        ? `last status ${failure.lastStatus}`
        : `last error: ${describeError(failure.lastError)}`;
    const why = failure.reason === 'max-attempts' ? 'no attempts left' : 'deadline reached';
    super(
      'OUTBOXKIT_CLIENT_GAVE_UP',
      `${details.method} ${details.path} gave up after ${details.attempts} attempt${details.attempts === 1 ? '' : 's'} ` +
        `in ${details.elapsedMs} ms (${why}; ${last}). The outcome is unknown: send the request again later with the same Idempotency-Key.`,
      details,
      { retriable: true, cause: failure.lastError },
    );
    this.reason = failure.reason;
    this.lastStatus = failure.lastStatus;
  }
}

function describeError(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    const code = typeof cause === 'object' && cause !== null ? (cause as { code?: unknown }).code : undefined;
    return `${err.name}${typeof code === 'string' ? ` ${code}` : ''}: ${err.message}`;
  }
  return String(err);
}
