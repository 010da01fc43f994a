/**
 * `createIdempotentClient()`: an HTTP client (on fetch) for callers of idempotent endpoints.
 *
 * One logical operation = one `Idempotency-Key` (a UUIDv7 unless the caller gives one), attached to
 * every attempt, with the body encoded once so that every attempt sends the same bytes (the same
 * fingerprint). Retries go through p-retry with a delay computed by {@link planRetry} (Retry-After
 * plus full jitter, bounded by the deadline); see {@link IdempotentClientOptions} for the bounds.
 */
import pRetry, { AbortError as StopRetrying } from 'p-retry';
import { v7 as uuidv7 } from 'uuid';
import { InvalidOptionsError } from '../errors.js';
import { jsonText, type JsonTextWording } from '../json-text.js';
import {
  RequestRejectedError,
  RetriesExhaustedError,
  type ClientErrorDetails,
  type GiveUpReason,
  type ReceivedProblem,
} from './errors.js';
import {
  ATTEMPT_BOUNDS,
  DURATION_BOUNDS,
  checkHeaders,
  integerOption,
  resolveClientOptions,
  type IdempotentClientOptions,
  type ResolvedClientOptions,
} from './options.js';
import { parseRetryAfterMs, planRetry } from './retry-delay.js';

/** Options of one logical operation. */
export interface RequestOptions {
  /**
   * The operation's idempotency key: 1-255 printable ASCII characters. Pass the key of an earlier
   * call that gave up ({@link RetriesExhaustedError.idempotencyKey}) to resume that operation.
   * @defaultValue a new UUIDv7
   */
  idempotencyKey?: string;
  /** Headers of this request, on top of the client's `headers`. @defaultValue {} */
  headers?: Readonly<Record<string, string>>;
  /** Aborts the operation: the pending attempt or wait stops and the call rejects with `signal.reason`. */
  signal?: AbortSignal;
  /** Overrides the client's `deadlineMs` for this operation, in ms. */
  deadlineMs?: number;
  /** Overrides the client's `maxAttempts` for this operation. */
  maxAttempts?: number;
  /** Overrides the client's `timeoutMs` (per attempt) for this operation, in ms. */
  timeoutMs?: number;
}

/** A successful (status < 400) response. */
export interface ClientResponse {
  status: number;
  headers: Headers;
  /** The body bytes (a replay is byte-identical to the first response). */
  body: Uint8Array;
  /** The response carried `Idempotent-Replayed: true`: the server did not execute again. */
  replayed: boolean;
  /** The key every attempt carried. */
  idempotencyKey: string;
  /** Attempts made, this one included. */
  attempts: number;
  /** The body as UTF-8 text. */
  text(): string;
  /** The body parsed as JSON. */
  json<T = unknown>(): T;
}

/** The client returned by {@link createIdempotentClient}. */
export interface IdempotentClient {
  /** The resolved options. */
  readonly options: ResolvedClientOptions;
  /**
   * Sends one logical operation: every attempt carries the same key and the same body bytes.
   * A body that is a string or bytes (`Uint8Array`, `ArrayBuffer`, any typed array) is sent as
   * is, a JSON value as `JSON.stringify(body)`; `content-type` defaults to `application/json`.
   *
   * @returns the first response with a status below 400 (fresh or replayed).
   * @throws {@link RequestRejectedError} on a status that is not retried (400, 413, 422, 404, ...).
   * @throws {@link RetriesExhaustedError} when the attempts or the deadline ran out.
   * @throws `signal.reason` when the caller aborts.
   * @throws {@link InvalidOptionsError} on an invalid key, header or override, or a body that is
   *   neither text, bytes nor a JSON value kept as is (a Blob, FormData, URLSearchParams or stream;
   *   NaN, a Map or a Set inside it).
   */
  request(method: string, path: string, body?: unknown, options?: RequestOptions): Promise<ClientResponse>;
  post(path: string, body?: unknown, options?: RequestOptions): Promise<ClientResponse>;
  put(path: string, body?: unknown, options?: RequestOptions): Promise<ClientResponse>;
  patch(path: string, body?: unknown, options?: RequestOptions): Promise<ClientResponse>;
  delete(path: string, options?: RequestOptions): Promise<ClientResponse>;
}

// A key that can be sent bare: visible ASCII without `"`, `,` and `;` (see src/idempotency/key.ts).
const BARE_KEY = /^[\x21\x23-\x2b\x2d-\x3a\x3c-\x7e]{1,255}$/;
const PRINTABLE_KEY = /^[\x20-\x7e]{1,255}$/;
const METHOD = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const UTF8 = new TextDecoder();
const UTF8_ENCODER = new TextEncoder();

/** The `Idempotency-Key` header value for `key`: bare when possible, else an RFC 8941 sf-string. */
export function encodeKeyHeader(key: string): string {
  if (typeof key !== 'string' || !PRINTABLE_KEY.test(key)) {
    throw new InvalidOptionsError('idempotencyKey must be 1-255 printable ASCII characters (a UUID is typical).');
  }
  if (BARE_KEY.test(key)) return key;
  return `"${key.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

/**
 * outboxkit's problem codes that only an operator can fix (its tables are missing: 500
 * `schema-missing`): never retried, even when their status is in `retryStatuses` (a server that
 * releases the key on 500 may list 500 there).
 */
const OPERATOR_PROBLEM_CODES: ReadonlySet<string> = new Set(['OUTBOXKIT_SCHEMA_MISSING']);

function isOperatorProblem(problem: ReceivedProblem | undefined): boolean {
  return typeof problem?.code === 'string' && OPERATOR_PROBLEM_CODES.has(problem.code);
}

/** An attempt that failed in a way that may succeed if retried. */
class RetriableFailure extends Error {
  constructor(
    readonly status: number | undefined,
    readonly retryAfterMs: number | undefined,
    readonly error: unknown,
  ) {
    super(status === undefined ? 'no response' : `status ${status}`);
  }
}

/** A rejection of fetch that is a network failure (undici: `TypeError: fetch failed` / `terminated`). */
function isNetworkFailure(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  // Other TypeErrors are programming errors (invalid URL or header): retrying cannot help.
  if (err.name === 'TypeError') return err.message === 'fetch failed' || err.message === 'terminated' || !!err.cause;
  return true;
}

/** How the errors of a request body that JSON would not keep are worded. */
const BODY_WORDING: JsonTextWording = {
  subject: 'The request body',
  lossyFix: '; send plain values, or the encoded bytes.',
  failedFix: '.',
  absent: 'The request body cannot be serialised to JSON.',
};

/**
 * The body's bytes, computed once for every attempt: a string or bytes (`Uint8Array`, `Buffer`,
 * `ArrayBuffer`, any typed array or `DataView`: their bytes) as given, else JSON. Bodies that
 * `JSON.stringify` would turn into something else without an error are refused: a `Blob`,
 * `FormData`, `URLSearchParams` or stream (written `{}`), and, at any depth, NaN, ±Infinity, an
 * invalid Date, a Map, a Set or a typed array. Another logical operation would otherwise run
 * under the key.
 */
function encodeBody(body: unknown): Uint8Array | string | undefined {
  if (body === undefined) return undefined;
  if (typeof body === 'string' || body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  const name = (body as { constructor?: { name?: string } } | null)?.constructor?.name;
  if (
    (typeof Blob !== 'undefined' && body instanceof Blob) ||
    (typeof FormData !== 'undefined' && body instanceof FormData) ||
    body instanceof URLSearchParams ||
    (typeof ReadableStream !== 'undefined' && body instanceof ReadableStream)
  ) {
    throw new InvalidOptionsError(
      `The request body is a ${name ?? 'stream'}, which is not sent as is: pass a string, bytes or a JSON value.`,
    );
  }
  const text = jsonText(body, BODY_WORDING, (message, cause) => new InvalidOptionsError(message, { cause }));
  return UTF8_ENCODER.encode(text);
}

/**
 * Largest problem details body read, in bytes (64 KiB): a problem (RFC 9457) is a few fields, and
 * a larger or deeply nested body from a misbehaving server is not parsed (the response is then
 * handled without its problem details).
 */
const MAX_PROBLEM_BYTES = 65_536;

/** The problem details (RFC 9457) of a response, or undefined. @internal */
export function parseProblem(headers: Headers, body: Uint8Array): ReceivedProblem | undefined {
  const type = headers.get('content-type') ?? '';
  if (!/^application\/(problem\+)?json\b/i.test(type) || body.byteLength > MAX_PROBLEM_BYTES) return undefined;
  try {
    const parsed: unknown = JSON.parse(UTF8.decode(body));
    return typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)
      ? (parsed as ReceivedProblem)
      : undefined;
  } catch {
    return undefined;
  }
}

/** A promise resolved after `ms`, rejected with `signal.reason` if it aborts first. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason as Error);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Creates an idempotent HTTP client.
 *
 * What is retried (same key, same body bytes): network errors, attempts that exceed `timeoutMs`,
 * and the `retryStatuses` (by default 408, 409, 425, 429, 502, 503, 504). Never: 400, 413, 422
 * (a {@link RequestRejectedError} carrying the problem details at once), nor any other status,
 * nor outboxkit's 500 `schema-missing` (an operator error) even if 500 is in `retryStatuses`.
 *
 * When: after attempt n fails, the client waits `Retry-After` (seconds or HTTP-date, if the
 * response has one) plus a delay drawn uniformly in [0, min(maxDelayMs, initialDelayMs × 2^(n−1)))
 * (exponential backoff with full jitter), and stops with {@link RetriesExhaustedError} after
 * `maxAttempts` attempts or when the next attempt could not start before `deadlineMs`.
 *
 * Full jitter and p-retry: p-retry's own delay is `minTimeout × factor^n`, optionally multiplied by
 * a random factor in [1, 2) (`randomize`), which keeps at least the whole base delay: clients that
 * failed together still retry in a band, not spread from zero. So p-retry is given `minTimeout: 0`
 * (its delay is always 0) and bounds the attempts (`retries`) and the total time
 * (`maxRetryTime`); the wait itself happens in its `shouldRetry` hook, which p-retry calls only
 * when a retry is allowed, with the full-jitter delay of {@link planRetry}.
 *
 * @example
 * ```ts
 * import { createIdempotentClient, isClientError } from 'outboxkit/client';
 *
 * const api = createIdempotentClient({ baseUrl: 'https://orders.internal', deadlineMs: 10_000 });
 * try {
 *   const res = await api.post('/orders', { sku: 'A-1', qty: 2 }, { headers: { authorization } });
 *   const order = res.json<{ id: string }>(); // res.replayed: the server answered from its record
 * } catch (err) {
 *   if (isClientError(err, 'OUTBOXKIT_CLIENT_GAVE_UP')) queueForLater(err.idempotencyKey); // outcome unknown
 *   else throw err;
 * }
 * ```
 */
export function createIdempotentClient(options: IdempotentClientOptions): IdempotentClient {
  const opts = resolveClientOptions(options);

  async function request(
    method: string,
    path: string,
    body?: unknown,
    req: RequestOptions = {},
  ): Promise<ClientResponse> {
    if (typeof method !== 'string' || !METHOD.test(method)) {
      throw new InvalidOptionsError(`Invalid HTTP method ${JSON.stringify(method)}.`);
    }
    if (typeof path !== 'string') throw new InvalidOptionsError('The request path must be a string.');
    const upper = method.toUpperCase();
    const key = req.idempotencyKey ?? uuidv7();
    const keyHeader = encodeKeyHeader(key);
    const deadlineMs =
      req.deadlineMs === undefined
        ? opts.deadlineMs
        : integerOption('deadlineMs', req.deadlineMs, DURATION_BOUNDS.min, DURATION_BOUNDS.max, 'ms');
    const maxAttempts =
      req.maxAttempts === undefined
        ? opts.maxAttempts
        : integerOption('maxAttempts', req.maxAttempts, ATTEMPT_BOUNDS.min, ATTEMPT_BOUNDS.max, 'attempts');
    const timeoutMs =
      req.timeoutMs === undefined
        ? opts.timeoutMs
        : integerOption('timeoutMs', req.timeoutMs, DURATION_BOUNDS.min, DURATION_BOUNDS.max, 'ms');
    const extraHeaders = req.headers ?? {};
    checkHeaders(extraHeaders, 'headers');
    const payload = encodeBody(body);
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries({ ...opts.headers, ...extraHeaders })) {
      headers[name.toLowerCase()] = value;
    }
    if (payload !== undefined) headers['content-type'] ??= 'application/json';
    headers['idempotency-key'] = keyHeader;
    const url = `${opts.baseUrl}${path.startsWith('/') ? path : `/${path}`}`;
    const signal = req.signal;

    const started = performance.now();
    const deadlineAt = started + deadlineMs;
    let attempts = 0;
    let last: RetriableFailure | undefined;
    let gaveUpFor: GiveUpReason | undefined;
    const details = (): ClientErrorDetails => ({
      method: upper,
      path,
      idempotencyKey: key,
      attempts,
      elapsedMs: Math.round(performance.now() - started),
    });

    const attempt = async (): Promise<ClientResponse> => {
      attempts++;
      const n = attempts;
      const attemptStarted = performance.now();
      const timeout = AbortSignal.timeout(Math.max(1, Math.min(timeoutMs, Math.floor(deadlineAt - attemptStarted))));
      const attemptSignal = signal === undefined ? timeout : AbortSignal.any([signal, timeout]);
      const report = (status: number | undefined, replayed: boolean, error: unknown) =>
        opts.onAttempt?.({
          method: upper,
          path,
          attempt: n,
          status,
          replayed,
          timedOut: timeout.aborted && error !== undefined,
          error,
          durationMs: performance.now() - attemptStarted,
        });
      let res: Response;
      let bytes: Uint8Array;
      try {
        res = await opts.fetch(url, { method: upper, headers, body: payload, signal: attemptSignal });
        // The whole body is part of the attempt (and of its timeout).
        bytes = new Uint8Array(await res.arrayBuffer());
      } catch (err) {
        if (signal?.aborted) throw new StopRetrying(toError(signal.reason));
        if (!timeout.aborted && !isNetworkFailure(err)) throw new StopRetrying(toError(err));
        report(undefined, false, err);
        throw new RetriableFailure(undefined, undefined, err);
      }
      const replayed = res.headers.get('idempotent-replayed') === 'true';
      report(res.status, replayed, undefined);
      if (res.status < 400) {
        return {
          status: res.status,
          headers: res.headers,
          body: bytes,
          replayed,
          idempotencyKey: key,
          attempts: n,
          text: () => UTF8.decode(bytes),
          json: <T>() => JSON.parse(UTF8.decode(bytes)) as T,
        };
      }
      const problem = parseProblem(res.headers, bytes);
      if (opts.retryStatuses.has(res.status) && !isOperatorProblem(problem)) {
        throw new RetriableFailure(
          res.status,
          parseRetryAfterMs(res.headers.get('retry-after'), Date.now()),
          new Error(`HTTP ${res.status}`),
        );
      }
      throw new StopRetrying(
        new RequestRejectedError(details(), {
          status: res.status,
          headers: res.headers,
          body: bytes,
          problem,
        }),
      );
    };

    try {
      return await pRetry(attempt, {
        retries: maxAttempts - 1,
        // p-retry's delay is always 0 (minTimeout 0): the full-jitter wait happens in shouldRetry.
        minTimeout: 0,
        maxTimeout: 0,
        maxRetryTime: deadlineMs,
        signal,
        onFailedAttempt: ({ error }) => {
          if (error instanceof RetriableFailure) last = error;
        },
        shouldRetry: async ({ error, attemptNumber }) => {
          if (!(error instanceof RetriableFailure)) return false;
          const plan = planRetry({
            retry: attemptNumber,
            initialDelayMs: opts.initialDelayMs,
            maxDelayMs: opts.maxDelayMs,
            retryAfterMs: error.retryAfterMs,
            remainingMs: deadlineAt - performance.now(),
            random: opts.random,
          });
          if (!plan.retry) {
            gaveUpFor = 'deadline';
            return false;
          }
          opts.onRetry?.({
            method: upper,
            path,
            attempt: attemptNumber,
            status: error.status,
            retryAfterMs: error.retryAfterMs,
            delayMs: plan.delayMs,
          });
          await sleep(plan.delayMs, signal);
          return true;
        },
      });
    } catch (err) {
      if (err instanceof RetriableFailure) {
        // Not planRetry's verdict: p-retry ran out of retries, or of time (maxRetryTime).
        const reason: GiveUpReason = gaveUpFor ?? (attempts >= maxAttempts ? 'max-attempts' : 'deadline');
        throw new RetriesExhaustedError(details(), {
          reason,
          lastStatus: (last ?? err).status,
          lastError: (last ?? err).error,
        });
      }
      throw err;
    }
  }

  return {
    options: opts,
    request,
    post: (path, body, o) => request('POST', path, body, o),
    put: (path, body, o) => request('PUT', path, body, o),
    patch: (path, body, o) => request('PATCH', path, body, o),
    delete: (path, o) => request('DELETE', path, undefined, o),
  };
}

function toError(value: unknown): Error {
  return value instanceof Error ? value : new Error(String(value));
}
