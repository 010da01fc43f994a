/**
 * `outboxkit/client`: an HTTP client for callers of idempotent endpoints (on fetch). It attaches
 * one stable `Idempotency-Key` per logical operation, retries what is safe to retry with bounded
 * exponential backoff and full jitter, honours `Retry-After`, and never retries 400/413/422.
 */
export {
  createIdempotentClient,
  encodeKeyHeader,
  type ClientResponse,
  type IdempotentClient,
  type RequestOptions,
} from './client.js';
export {
  CLIENT_DEFAULTS,
  NEVER_RETRIED_STATUSES,
  resolveClientOptions,
  type AttemptEvent,
  type IdempotentClientOptions,
  type ResolvedClientOptions,
  type RetryEvent,
} from './options.js';
export {
  CLIENT_ERROR_CODES,
  IdempotentClientError,
  RequestRejectedError,
  RetriesExhaustedError,
  isClientError,
  type ClientErrorCode,
  type ClientErrorDetails,
  type GiveUpReason,
  type ReceivedProblem,
} from './errors.js';
export {
  MAX_RETRY_AFTER_MS,
  parseRetryAfterMs,
  planRetry,
  type RetryPlan,
  type RetryPlanInput,
} from './retry-delay.js';
