/**
 * The idempotency layer's public API (one-transaction mode). Internals (SQL, pure transitions,
 * error classification) are imported from their modules by adapters, not re-exported here.
 */
export {
  BodyInvalidError,
  BodyTooLargeError,
  KeyInProgressError,
  KeyInvalidError,
  KeyMismatchError,
  KeyMissingError,
  LeaseLostError,
  StoreUnavailableError,
  TenantUnresolvedError,
  type RetryAfterErrorOptions,
} from './errors.js';
export { IDEMPOTENCY_KEY_HEADER, MAX_KEY_LENGTH, parseIdempotencyKey, redactKey, type ParseKeyOptions } from './key.js';
export { FINGERPRINT_VERSION, fingerprintRequest, type Fingerprint, type FingerprintInput } from './fingerprint.js';
export {
  IDEMPOTENCY_DEFAULTS,
  resolveIdempotencyOptions,
  type ConcurrencyPolicy,
  type IdempotencyOptions,
  type ResolvedIdempotencyOptions,
} from './options.js';
export {
  REPLAYED_HEADER,
  RETRIABLE_CLIENT_STATUSES,
  outcomeOfStatus,
  type HandlerResponse,
  type IdempotentResponse,
  type IdempotentResult,
  type ResponseOutcome,
} from './state-machine.js';
export { executeIdempotent, type IdempotentRequest } from './execute.js';
export { CLEANUP_DEFAULTS, cleanupExpiredKeys, type CleanupOptions } from './cleanup.js';
export {
  PROBLEM_CONTENT_TYPE,
  PROBLEM_TYPE_BASE,
  isProblemError,
  toProblem,
  type ProblemDetails,
  type ProblemResponse,
} from '../http/problem.js';
