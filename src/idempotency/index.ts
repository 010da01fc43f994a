/**
 * The idempotency layer's public API: one-transaction mode (`executeIdempotent`) and lease mode
 * (`executeLeased`), side by side in src/idempotency/lease.ts. Internals (SQL, pure transitions,
 * error classification) are imported from their modules by adapters, not re-exported here.
 */
export {
  BodyInvalidError,
  BodyTooLargeError,
  DeadlineInvalidError,
  KeyInProgressError,
  KeyInvalidError,
  KeyMismatchError,
  KeyMissingError,
  LeaseLostError,
  ReplayNotAcceptableError,
  StoreUnavailableError,
  TenantUnresolvedError,
  type RetryAfterErrorOptions,
} from './errors.js';
export { IDEMPOTENCY_KEY_HEADER, MAX_KEY_LENGTH, parseIdempotencyKey, redactKey, type ParseKeyOptions } from './key.js';
export {
  FINGERPRINT_VERSION,
  MAX_JSON_DEPTH,
  MAX_JSON_MEMBER_NAMES,
  fingerprintRequest,
  type Fingerprint,
  type FingerprintInput,
} from './fingerprint.js';
export {
  IDEMPOTENCY_DEFAULTS,
  REPRESENTATION_HEADERS,
  resolveIdempotencyOptions,
  type ConcurrencyPolicy,
  type IdempotencyOptions,
  type ResolvedIdempotencyOptions,
} from './options.js';
export {
  REPLAYED_HEADER,
  RETRIABLE_CLIENT_STATUSES,
  outcomeOfResponse,
  outcomeOfStatus,
  reject,
  type HandlerResponse,
  type RejectOptions,
  type Rejection,
  type IdempotentResponse,
  type IdempotentResult,
  type ResponseOutcome,
} from './state-machine.js';
export { executeIdempotent, type ExecutionContext, type IdempotentRequest } from './execute.js';
export {
  executeLeased,
  type LeaseContext,
  type LeasedRequest,
  type LeasedResult,
  type UncertainOutcome,
} from './lease.js';
export {
  LEASE_DEFAULTS,
  MIN_OPERATION_ID_SECRET_BYTES,
  MIN_WAIT_PAUSE_MS,
  UNKEYED_OPERATION_ID_WARNING,
  resolveLeaseOptions,
  type LeaseOptions,
  type LeasePolicy,
  type ResolvedLeaseOptions,
} from './lease-options.js';
export { leaseChannel, operationIdFor, operationIdOf, type UncertainRecord } from './lease-store.js';
export {
  reconcileUncertain,
  serveOperation,
  type Reconciliation,
  type ReconcileOptions,
  type ReconcileResult,
  type ServeOperationOptions,
} from './reconcile.js';
export {
  IDEMPOTENCY_OUTCOMES,
  REQUESTS_TOTAL,
  idempotencyGauges,
  type GaugeOptions,
  type IdempotencyOutcome,
  type IdempotencyOutcomeEvent,
} from './metrics.js';
export { CLEANUP_DEFAULTS, cleanupExpiredKeys, type CleanupOptions } from './cleanup.js';
export {
  PROBLEM_CONTENT_TYPE,
  PROBLEM_TYPE_BASE,
  isProblemError,
  toProblem,
  type ProblemDetails,
  type ProblemResponse,
} from '../http/problem.js';
export { DECODABLE_CODINGS, negotiateReplayEncoding, type ReplayEncodingDecision } from '../http/replay-encoding.js';
