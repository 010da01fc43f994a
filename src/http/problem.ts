/**
 * RFC 9457 problem details for outboxkit's errors: the HTTP face of the idempotency contract
 * (docs/http-contract.md). Framework-neutral: adapters send `status`, `headers` and
 * `JSON.stringify(body)`.
 */
import { isOutboxkitError, type ErrorCode } from '../errors.js';

/** Base of outboxkit's problem type URIs; each type is documented at that address. */
export const PROBLEM_TYPE_BASE = 'https://outboxkit.dev/problems/';

/** The media type of problem details (RFC 9457 §3). */
export const PROBLEM_CONTENT_TYPE = 'application/problem+json';

/** An RFC 9457 problem details object, with outboxkit's `code` extension member. */
export interface ProblemDetails {
  /** A stable URI naming the problem type, for example `https://outboxkit.dev/problems/key-mismatch`. */
  type: string;
  /** A short, stable summary of the problem type. */
  title: string;
  /** The HTTP status. */
  status: number;
  /** What happened to this request and how to fix it. */
  detail: string;
  /** The outboxkit error code, for example `OUTBOXKIT_KEY_MISMATCH`. */
  code: ErrorCode | 'OUTBOXKIT_INTERNAL';
}

/** A problem response ready to send. */
export interface ProblemResponse {
  status: number;
  /** `content-type: application/problem+json`, `cache-control: no-store`, and `retry-after` when retriable. */
  headers: Record<string, string>;
  body: ProblemDetails;
}

interface ProblemKind {
  status: number;
  slug: string;
  title: string;
  /** Whether the response carries `Retry-After`. */
  retryAfter: boolean;
  /**
   * A fixed `detail` for errors whose message is for operators, not clients (it may name schemas
   * or tables); otherwise `detail` is the error's message.
   */
  detail?: string;
}

/** A {@link ProblemKind}: `retryAfter` false and no fixed `detail` unless `more` says otherwise. */
function problemKind(
  status: number,
  slug: string,
  title: string,
  more: Partial<Pick<ProblemKind, 'retryAfter' | 'detail'>> = {},
): ProblemKind {
  return { status, slug, title, retryAfter: false, ...more };
}

/**
 * The HTTP mapping of the errors a client can cause or retry. Other codes (invalid options, a
 * missing transaction, ...) are server bugs: {@link toProblem} answers them with a generic 500.
 */
export const PROBLEM_KINDS: Readonly<Partial<Record<ErrorCode, ProblemKind>>> = Object.freeze({
  OUTBOXKIT_KEY_MISSING: problemKind(400, 'key-missing', 'Idempotency key missing'),
  OUTBOXKIT_KEY_INVALID: problemKind(400, 'key-invalid', 'Idempotency key invalid'),
  OUTBOXKIT_TENANT_UNRESOLVED: problemKind(400, 'tenant-unresolved', 'Caller not identified'),
  OUTBOXKIT_BODY_TOO_LARGE: problemKind(413, 'body-too-large', 'Request body too large'),
  OUTBOXKIT_BODY_INVALID: problemKind(400, 'body-invalid', 'Request body invalid'),
  OUTBOXKIT_KEY_MISMATCH: problemKind(422, 'key-mismatch', 'Idempotency key reused with a different request'),
  OUTBOXKIT_KEY_IN_PROGRESS: problemKind(409, 'key-in-progress', 'Request in progress', { retryAfter: true }),
  OUTBOXKIT_STORE_UNAVAILABLE: problemKind(503, 'store-unavailable', 'Idempotency store unavailable', {
    retryAfter: true,
  }),
  OUTBOXKIT_LEASE_LOST: problemKind(409, 'lease-lost', 'Request taken over', { retryAfter: true }),
  OUTBOXKIT_DEADLINE_INVALID: problemKind(400, 'deadline-invalid', 'Request deadline invalid'),
  OUTBOXKIT_REPLAY_NOT_ACCEPTABLE: problemKind(406, 'replay-not-acceptable', 'Stored response not acceptable'),
  // An operator error (no `outboxkit migrate` yet): 500, not retriable (no Retry-After), with a
  // stable type so that clients and monitors can tell it from a bug; the handler never ran.
  OUTBOXKIT_SCHEMA_MISSING: problemKind(500, 'schema-missing', 'Idempotency store not set up', {
    detail:
      "The server's idempotency store is not set up (its tables are missing); nothing was executed. The operator must run the database migrations.",
  }),
});

/**
 * Whether `err` is an outboxkit error with an HTTP mapping in {@link PROBLEM_KINDS}: those a
 * client causes or may retry (400/406/409/413/422/503), and the operator error `schema-missing` (500).
 */
export function isProblemError(err: unknown): boolean {
  return isOutboxkitError(err) && PROBLEM_KINDS[err.code] !== undefined;
}

/**
 * Maps an error to an RFC 9457 problem response.
 *
 * | code | status | type |
 * | --- | --- | --- |
 * | OUTBOXKIT_KEY_MISSING | 400 | key-missing |
 * | OUTBOXKIT_KEY_INVALID | 400 | key-invalid |
 * | OUTBOXKIT_TENANT_UNRESOLVED | 400 | tenant-unresolved |
 * | OUTBOXKIT_BODY_TOO_LARGE | 413 | body-too-large |
 * | OUTBOXKIT_BODY_INVALID | 400 | body-invalid |
 * | OUTBOXKIT_KEY_MISMATCH | 422 | key-mismatch |
 * | OUTBOXKIT_KEY_IN_PROGRESS | 409 + Retry-After | key-in-progress |
 * | OUTBOXKIT_STORE_UNAVAILABLE | 503 + Retry-After | store-unavailable |
 * | OUTBOXKIT_LEASE_LOST | 409 + Retry-After | lease-lost |
 * | OUTBOXKIT_DEADLINE_INVALID | 400 | deadline-invalid |
 * | OUTBOXKIT_REPLAY_NOT_ACCEPTABLE | 406 | replay-not-acceptable |
 * | OUTBOXKIT_SCHEMA_MISSING | 500, no Retry-After | schema-missing (fixed detail; the message naming the schema is for logs) |
 * | anything else | 500 | internal (the message is not disclosed) |
 *
 * `Retry-After` is the error's `retryAfterSeconds`, else `options.retryAfterSeconds`, else 1.
 */
export function toProblem(err: unknown, options: { retryAfterSeconds?: number } = {}): ProblemResponse {
  const headers: Record<string, string> = { 'content-type': PROBLEM_CONTENT_TYPE, 'cache-control': 'no-store' };
  const kind = isOutboxkitError(err) ? PROBLEM_KINDS[err.code] : undefined;
  if (!isOutboxkitError(err) || kind === undefined) {
    return {
      status: 500,
      headers,
      body: {
        type: `${PROBLEM_TYPE_BASE}internal`,
        title: 'Internal error',
        status: 500,
        detail: 'The request failed because of an internal error.',
        code: 'OUTBOXKIT_INTERNAL',
      },
    };
  }
  if (kind.retryAfter) {
    const own = (err as { retryAfterSeconds?: unknown }).retryAfterSeconds;
    const seconds =
      typeof own === 'number' && Number.isInteger(own) && own >= 0 ? own : (options.retryAfterSeconds ?? 1);
    headers['retry-after'] = String(seconds);
  }
  return {
    status: kind.status,
    headers,
    body: {
      type: `${PROBLEM_TYPE_BASE}${kind.slug}`,
      title: kind.title,
      status: kind.status,
      detail: kind.detail ?? err.message,
      code: err.code,
    },
  };
}
