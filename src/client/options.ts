/**
 * Options of the idempotent HTTP client, their defaults and their validation.
 */
import { InvalidOptionsError } from '../errors.js';

/** Statuses never retried, whatever `retryStatuses` says: the same request gets the same answer. */
export const NEVER_RETRIED_STATUSES: ReadonlySet<number> = new Set([400, 413, 422]);

/** What one attempt ended with, as reported to {@link IdempotentClientOptions.onAttempt}. */
export interface AttemptEvent {
  method: string;
  path: string;
  /** 1 for the first attempt. */
  attempt: number;
  /** The HTTP status, or `undefined` when there was no response (network error, timeout). */
  status: number | undefined;
  /** Whether the response carried `Idempotent-Replayed: true`. */
  replayed: boolean;
  /** The attempt hit `timeoutMs` (or the deadline) before the whole response arrived. */
  timedOut: boolean;
  /** The network or timeout error, when there was no response. */
  error: unknown;
  /** Duration of the attempt, in ms. */
  durationMs: number;
}

/** A retry about to be waited for, as reported to {@link IdempotentClientOptions.onRetry}. */
export interface RetryEvent {
  method: string;
  path: string;
  /** The attempt that failed (1 for the first). */
  attempt: number;
  /** The status of the failed attempt, or `undefined` for a network error or timeout. */
  status: number | undefined;
  /** The server's `Retry-After`, in ms, if any. */
  retryAfterMs: number | undefined;
  /** The delay before the next attempt, in ms: `Retry-After` plus the full-jitter backoff. */
  delayMs: number;
}

/** Options of `createIdempotentClient()`. Durations are in milliseconds. */
export interface IdempotentClientOptions {
  /**
   * The service's base URL, for example `https://api.example.com/v1`. Request paths are appended
   * to it (`/orders` → `https://api.example.com/v1/orders`).
   */
  baseUrl: string | URL;
  /**
   * Most HTTP attempts per logical operation, the first one included (1 = never retry).
   * @defaultValue 5
   */
  maxAttempts?: number;
  /**
   * Time budget of one logical operation, in ms, from the first attempt: every attempt and every
   * wait between attempts fit in it. No attempt starts after it, no attempt runs past it, and a
   * wait (backoff plus `Retry-After`) that would reach it ends the operation at once.
   * @defaultValue 30_000
   */
  deadlineMs?: number;
  /**
   * Cap of the first retry's random backoff, in ms; the cap doubles with each retry, up to
   * `maxDelayMs`. The delay is drawn uniformly in [0, cap) (full jitter).
   * @defaultValue 100
   */
  initialDelayMs?: number;
  /** Largest backoff cap, in ms (a `Retry-After` comes on top of it). @defaultValue 5_000 */
  maxDelayMs?: number;
  /**
   * Timeout of one attempt (connection, request and whole response body), in ms. An attempt that
   * times out is retried with the same key: the server either finished (the retry replays) or
   * not (the retry executes, or gets 409 while the first is still running).
   * @defaultValue 10_000
   */
  timeoutMs?: number;
  /**
   * Response statuses that are retried (network errors and timeouts always are). 400, 413 and
   * 422 are refused here: they are never retried. 500 is not retried by default (a server bug
   * usually repeats); add it if your server releases the key on 500, as outboxkit's does.
   * @defaultValue [408, 409, 425, 429, 502, 503, 504]
   */
  retryStatuses?: readonly number[];
  /** Headers sent with every request (for example `authorization`). @defaultValue {} */
  headers?: Readonly<Record<string, string>>;
  /** The fetch implementation (for example undici's `fetch` with a custom dispatcher). @defaultValue globalThis.fetch */
  fetch?: typeof fetch;
  /** Source of random numbers in [0, 1) for the jitter (tests, simulations). @defaultValue Math.random */
  random?: () => number;
  /** Called after every attempt (metrics, logs). Must not throw. @defaultValue none */
  onAttempt?: (event: AttemptEvent) => void;
  /** Called before waiting for a retry. Must not throw. @defaultValue none */
  onRetry?: (event: RetryEvent) => void;
}

/** {@link IdempotentClientOptions} with every default applied, validated and frozen. */
export interface ResolvedClientOptions {
  /** Without a trailing slash. */
  readonly baseUrl: string;
  readonly maxAttempts: number;
  readonly deadlineMs: number;
  readonly initialDelayMs: number;
  readonly maxDelayMs: number;
  readonly timeoutMs: number;
  readonly retryStatuses: ReadonlySet<number>;
  readonly headers: Readonly<Record<string, string>>;
  readonly fetch: typeof fetch;
  readonly random: () => number;
  readonly onAttempt: ((event: AttemptEvent) => void) | undefined;
  readonly onRetry: ((event: RetryEvent) => void) | undefined;
}

/** Default client options. */
export const CLIENT_DEFAULTS = Object.freeze({
  maxAttempts: 5,
  deadlineMs: 30_000,
  initialDelayMs: 100,
  maxDelayMs: 5_000,
  timeoutMs: 10_000,
  retryStatuses: Object.freeze([408, 409, 425, 429, 502, 503, 504]) as readonly number[],
});

const MAX_DURATION_MS = 86_400_000; // a day: catches seconds given as ms and the like

/** Validates an integer option; shared with the per-request overrides. */
export function integerOption(name: string, value: unknown, min: number, max: number, unit: string): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new InvalidOptionsError(`${name} must be an integer from ${min} to ${max} (${unit}), got ${String(value)}.`);
  }
  return value;
}

/** Bounds of the duration options, in ms. */
export const DURATION_BOUNDS = { min: 1, max: MAX_DURATION_MS } as const;

/** Bounds of `maxAttempts`. */
export const ATTEMPT_BOUNDS = { min: 1, max: 100 } as const;

/**
 * Applies defaults to `options` and validates them once.
 *
 * @throws {@link InvalidOptionsError} on a missing or non-HTTP base URL, a count or duration out of
 *   range, `maxDelayMs` below `initialDelayMs`, a never-retried status in `retryStatuses`, or a
 *   default `idempotency-key` header.
 */
export function resolveClientOptions(options: IdempotentClientOptions): ResolvedClientOptions {
  if (typeof options !== 'object' || options === null) {
    throw new InvalidOptionsError('createIdempotentClient() needs options with a baseUrl.');
  }
  let base: URL;
  try {
    base = new URL(String(options.baseUrl));
  } catch (err) {
    throw new InvalidOptionsError(`baseUrl must be an absolute http(s) URL, got ${JSON.stringify(options.baseUrl)}.`, {
      cause: err,
    });
  }
  if (base.protocol !== 'http:' && base.protocol !== 'https:') {
    throw new InvalidOptionsError(`baseUrl must be an http(s) URL, got ${JSON.stringify(base.protocol)}.`);
  }
  if (base.search !== '' || base.hash !== '') {
    throw new InvalidOptionsError('baseUrl must not have a query or a fragment; put them in the request path.');
  }
  const d = CLIENT_DEFAULTS;
  const duration = (name: string, value: number | undefined, fallback: number) =>
    integerOption(name, value ?? fallback, DURATION_BOUNDS.min, DURATION_BOUNDS.max, 'ms');
  const initialDelayMs = duration('initialDelayMs', options.initialDelayMs, d.initialDelayMs);
  const maxDelayMs = duration('maxDelayMs', options.maxDelayMs, d.maxDelayMs);
  if (maxDelayMs < initialDelayMs) {
    throw new InvalidOptionsError(`maxDelayMs (${maxDelayMs}) must be at least initialDelayMs (${initialDelayMs}).`);
  }
  const retryStatuses = new Set<number>();
  for (const status of options.retryStatuses ?? d.retryStatuses) {
    integerOption('retryStatuses[]', status, 400, 599, 'an HTTP error status');
    if (NEVER_RETRIED_STATUSES.has(status)) {
      throw new InvalidOptionsError(
        `retryStatuses must not include ${status}: 400, 413 and 422 are never retried (the same request gets the same answer).`,
      );
    }
    retryStatuses.add(status);
  }
  const headers = { ...(options.headers ?? {}) };
  checkHeaders(headers, 'headers');
  const fetchImpl = options.fetch ?? globalThis.fetch;
  if (typeof fetchImpl !== 'function') throw new InvalidOptionsError('fetch must be a function.');
  const random = options.random ?? Math.random;
  if (typeof random !== 'function') throw new InvalidOptionsError('random must be a function returning [0, 1).');
  for (const hook of ['onAttempt', 'onRetry'] as const) {
    if (options[hook] !== undefined && typeof options[hook] !== 'function') {
      throw new InvalidOptionsError(`${hook} must be a function.`);
    }
  }
  return Object.freeze({
    baseUrl: withoutTrailingSlashes(base.href),
    maxAttempts: integerOption(
      'maxAttempts',
      options.maxAttempts ?? d.maxAttempts,
      ATTEMPT_BOUNDS.min,
      ATTEMPT_BOUNDS.max,
      'attempts',
    ),
    deadlineMs: duration('deadlineMs', options.deadlineMs, d.deadlineMs),
    initialDelayMs,
    maxDelayMs,
    timeoutMs: duration('timeoutMs', options.timeoutMs, d.timeoutMs),
    retryStatuses,
    headers: Object.freeze(headers),
    fetch: fetchImpl,
    random,
    onAttempt: options.onAttempt,
    onRetry: options.onRetry,
  });
}

/** Refuses a caller-set `idempotency-key` (the client owns it: pass `idempotencyKey` instead). */
export function checkHeaders(headers: Readonly<Record<string, string>>, where: string): void {
  for (const [name, value] of Object.entries(headers)) {
    if (typeof value !== 'string') throw new InvalidOptionsError(`${where}.${name} must be a string.`);
    if (name.toLowerCase() === 'idempotency-key') {
      throw new InvalidOptionsError(
        `${where} must not set Idempotency-Key: the client attaches one per operation; pass { idempotencyKey } to choose it.`,
      );
    }
  }
}

/** `href` without its trailing slashes (an index loop: /\/+$/ is quadratic on a run of slashes). */
function withoutTrailingSlashes(href: string): string {
  let end = href.length;
  while (end > 0 && href.charCodeAt(end - 1) === 0x2f /* / */) end--;
  return href.slice(0, end);
}
