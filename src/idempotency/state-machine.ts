/**
 * The idempotency state machine: pure decisions, no I/O. The SQL that applies them is in
 * ./store.ts, the orchestration in ./execute.ts.
 *
 * States (docs/guarantees.md, G1; docs/http-contract.md):
 *
 * ```text
 *   (none) ──claim──▶ processing ──handler 2xx/3xx──▶ completed ──retry──▶ replay
 *                         │      ──stored 4xx──────▶ failed    ──retry──▶ replay
 *                         └──────5xx, 408/409/425/429, throw, crash──▶ (released: rolled back)
 *   completed/failed past retention ──claim──▶ processing (a new execution, new owner token)
 *
 * lease mode (./lease.ts), the claim committed first:
 *   processing ──lease expired, same fingerprint──▶ processing (takeover: new token, generation + 1)
 *   processing ──error or 5xx before any effect──▶ (released by its owner)
 *   processing ──error or 5xx after an effect────▶ failed (stored, replayed)
 *   processing ──ctx.uncertain(reason)───────────▶ uncertain ──reconcileUncertain()──▶ completed | failed
 * ```
 *
 * In one-transaction mode the `processing` record is never visible to other transactions: it
 * commits together with the result, or rolls back with everything else (docs/guarantees.md, G2). A stored 4xx
 * first rolls the handler's writes back to the savepoint taken after the claim ({@link reject}).
 * Only an owner (by its token) or a reconciliation ever moves a record out of `processing` or
 * `uncertain`; elapsed time never does, and cleanup never deletes them.
 */
import { InvalidOptionsError, optionNames, refuseUnknownOptions } from '../errors.js';
import type { IdempotencyState } from '../schema.js';
import type { Fingerprint } from './fingerprint.js';

/** What the handler of an idempotent operation returns. */
export interface HandlerResponse {
  /** HTTP status, an integer from 200 to 599. Which statuses are stored: {@link outcomeOfStatus}. */
  status: number;
  /**
   * Response headers (string values). Stored and replayed: the representation headers
   * (`REPRESENTATION_HEADERS`: content-type, content-encoding, content-language, content-location,
   * content-disposition, content-range, vary) and the `replayHeaders` allow-list.
   */
  headers?: Readonly<Record<string, string>>;
  /**
   * The body. Stored as bytes and replayed byte for byte: a `Buffer`/`Uint8Array` as is, a string
   * as UTF-8, anything else serialised once with `JSON.stringify`.
   * Default `content-type`: `application/json` for a JSON value, `text/plain; charset=utf-8` for a
   * string, `application/octet-stream` for bytes.
   */
  body: Buffer | Uint8Array | string | object;
}

/** A response as outboxkit stores and returns it. */
export interface IdempotentResponse {
  status: number;
  /** Lower-cased header names. */
  headers: Record<string, string>;
  body: Buffer;
}

/** The outcome of {@link executeIdempotent}. */
export interface IdempotentResult {
  /** True when the response is a stored one (the handler did not run for this request). */
  replayed: boolean;
  /**
   * The response to send. On a replay: the stored status, stored headers and body bytes, plus
   * `idempotent-replayed: true`, as stored (the HTTP adapters then apply the request's
   * `Accept-Encoding`: `negotiateReplayEncoding()`). Otherwise: what the handler returned, every
   * header included.
   */
  response: IdempotentResponse;
}

/** The header that marks a replayed response (Stripe, draft-ietf-httpapi-idempotency-key-header). */
export const REPLAYED_HEADER = 'idempotent-replayed';

/**
 * What happens to a handler's response:
 * - `completed`: stored and replayed (2xx, 3xx);
 * - `failed`: a final rejection, stored and replayed (4xx other than the retriable ones below);
 * - `release`: not stored; the transaction is rolled back (the handler's writes too) and the key
 *   stays free for a retry (5xx, and 408 Request Timeout, 409 Conflict, 425 Too Early,
 *   429 Too Many Requests: the same request may succeed later; test/unit/idempotency/state-machine.test.ts, "which outcomes are stored").
 *
 * A stored 4xx never commits the handler's writes: they are rolled back to the savepoint taken
 * right after the claim, and only the record (with the rejection) commits. See {@link reject}.
 */
export type ResponseOutcome = 'completed' | 'failed' | 'release';

/** 4xx statuses that mean "try again later", so storing them would replay a transient failure forever. */
export const RETRIABLE_CLIENT_STATUSES: ReadonlySet<number> = new Set([408, 409, 425, 429]);

const REJECTION = Symbol.for('outboxkit.rejection');

/** Options of {@link reject}. */
export interface RejectOptions {
  /**
   * Whether the rejection is final and is stored and replayed to every retry (`true`), or the key
   * is released so that a retry executes again (`false`: the whole transaction rolls back).
   * @defaultValue true
   */
  store?: boolean;
  /** Response headers, as in {@link HandlerResponse}. */
  headers?: Readonly<Record<string, string>>;
}

/** Every option name of {@link RejectOptions}; the compiler keeps it in step with the interface. */
const REJECT_OPTION_NAMES = optionNames<RejectOptions>({ store: true, headers: true });

/** A business rejection built by {@link reject}: a {@link HandlerResponse} with a marker. */
export interface Rejection extends HandlerResponse {
  readonly [REJECTION]: { readonly store: boolean };
}

/**
 * Ends a handler with a business rejection (a 4xx), for example "out of stock":
 * `return reject(409, { title: 'Out of stock' }, { store: false })` or
 * `return ctx.reject(422, problem)`.
 *
 * - `store: true` (default): the handler's business writes and outbox events made after the claim
 *   are rolled back to a SAVEPOINT taken right after the claim, and the rejection is stored as a
 *   `failed` record and replayed, byte for byte, to every retry of the key (docs/http-contract.md).
 * - `store: false`: the whole transaction rolls back, nothing is recorded, the response is
 *   answered once, and a retry with the same key executes again.
 *
 * @param status - a 4xx status. With `store: true`, not 408/409/425/429 (those mean "try again
 *   later": storing them would replay a transient answer forever).
 * @throws {@link InvalidOptionsError} on another status, or an unknown option name (a misspelt
 *   `store: false` would otherwise store the rejection).
 */
export function reject(status: number, body: HandlerResponse['body'], options: RejectOptions = {}): Rejection {
  refuseUnknownOptions(options ?? {}, REJECT_OPTION_NAMES, 'reject');
  const store = options.store ?? true;
  if (!Number.isInteger(status) || status < 400 || status > 499) {
    throw new InvalidOptionsError(`reject() needs a 4xx status, got ${String(status)}; throw for server errors.`);
  }
  if (store && RETRIABLE_CLIENT_STATUSES.has(status)) {
    throw new InvalidOptionsError(
      `reject(${status}) cannot be stored: ${status} means "try again later"; pass { store: false }.`,
    );
  }
  const response: HandlerResponse = { status, body, ...(options.headers ? { headers: options.headers } : {}) };
  return Object.assign(response, { [REJECTION]: Object.freeze({ store }) });
}

/**
 * What becomes of a handler's response: a {@link reject} marker decides for itself (stored →
 * `failed`, not stored → `release`); any other response follows {@link outcomeOfStatus}.
 */
export function outcomeOfResponse(response: HandlerResponse): ResponseOutcome {
  const marker = (response as Partial<Rejection>)[REJECTION];
  if (marker !== undefined) return marker.store ? 'failed' : 'release';
  return outcomeOfStatus(response.status);
}

/** Decides what becomes of a handler's response with status `status` (see {@link ResponseOutcome}). */
export function outcomeOfStatus(status: number): ResponseOutcome {
  if (status >= 200 && status < 400) return 'completed';
  if (status >= 400 && status < 500 && !RETRIABLE_CLIENT_STATUSES.has(status)) return 'failed';
  return 'release';
}

const DROPPED_HEADERS: ReadonlySet<string> = new Set([
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'te',
  'trailer',
  'upgrade',
  REPLAYED_HEADER,
]);

const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// Field values (RFC 9110 §5.5) as Node.js accepts them (`res.setHeader`): HTAB, visible ASCII,
// space and obs-text (0x80-0xFF); no NUL, CR, LF, other controls, DEL, nor any character above
// U+00FF (a lone surrogate included). Node.js would throw at send time, which, after commit, would
// break every replay of the stored response; NUL would also make the store fail.
const BAD_HEADER_VALUE = /[^\t\x20-\x7e\x80-\xff]/;

/**
 * Turns a handler's response into bytes and lower-cased headers, adding the default
 * `content-type` and dropping framing/hop-by-hop headers (`content-length`, `transfer-encoding`,
 * `connection`, ...) and `idempotent-replayed`. Validates it before anything is stored.
 *
 * @throws {@link InvalidOptionsError} on a status outside 200-599, an invalid header, or a body
 *   that JSON cannot serialise.
 */
export function normaliseResponse(response: HandlerResponse): IdempotentResponse {
  if (typeof response !== 'object' || response === null) {
    throw new InvalidOptionsError('The idempotent handler must return { status, headers?, body }.');
  }
  const { status } = response;
  if (!Number.isInteger(status) || status < 200 || status > 599) {
    throw new InvalidOptionsError(
      `The idempotent handler returned status ${String(status)}; use an integer from 200 to 599.`,
    );
  }
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(response.headers ?? {})) {
    if (!HEADER_NAME.test(name))
      throw new InvalidOptionsError(`The handler returned an invalid header name ${JSON.stringify(name)}.`);
    if (typeof value !== 'string') {
      throw new InvalidOptionsError(
        `The handler returned a ${value === null ? 'null' : typeof value} value for header ${JSON.stringify(name)}; header values must be strings.`,
      );
    }
    if (BAD_HEADER_VALUE.test(value)) {
      throw new InvalidOptionsError(
        `The handler returned an invalid value for header ${JSON.stringify(name)}: it contains a control character (NUL, CR, LF, ...) or a character above U+00FF.`,
      );
    }
    const lower = name.toLowerCase();
    // Framing and hop-by-hop headers are the server's to compute; `idempotent-replayed` is ours.
    if (!DROPPED_HEADERS.has(lower)) headers[lower] = value;
  }
  const { body } = response;
  let bytes: Buffer;
  let contentType: string;
  if (Buffer.isBuffer(body)) {
    bytes = body;
    contentType = 'application/octet-stream';
  } else if (body instanceof Uint8Array) {
    bytes = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
    contentType = 'application/octet-stream';
  } else if (typeof body === 'string') {
    bytes = Buffer.from(body, 'utf8');
    contentType = 'text/plain; charset=utf-8';
  } else {
    let text: string | undefined;
    try {
      text = JSON.stringify(body);
    } catch (err) {
      throw new InvalidOptionsError(
        `The handler's response body cannot be serialised to JSON: ${(err as Error).message}.`,
        { cause: err },
      );
    }
    if (text === undefined) throw new InvalidOptionsError("The handler's response body cannot be serialised to JSON.");
    bytes = Buffer.from(text, 'utf8');
    contentType = 'application/json';
  }
  headers['content-type'] ??= contentType;
  return { status, headers, body: bytes };
}

/** The headers of `response` that are stored for replay: those in `allowList` (lower-cased names). */
export function headersToStore(
  headers: Readonly<Record<string, string>>,
  allowList: ReadonlySet<string>,
): Record<string, string> {
  const stored: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (allowList.has(name)) stored[name] = value;
  }
  return stored;
}

/** An idempotency record as read back from the store. */
export interface StoredRecord {
  state: IdempotencyState;
  fingerprint: Buffer;
  fingerprintVersion: number;
  responseStatus: number | null;
  responseHeaders: Record<string, string> | null;
  responseBody: Buffer | null;
}

/** What to do with a request whose key already has a committed record it could not take over. */
export type ExistingRecordDecision =
  { kind: 'mismatch' } | { kind: 'replay'; response: IdempotentResponse } | { kind: 'in-progress' };

/**
 * Decides the fate of a request whose key has a live committed record:
 * - a different fingerprint (or fingerprint version) → `mismatch` (422), whatever the state: the
 *   stored response is never returned for another request;
 * - `completed` or `failed` → `replay` the stored response, marked `idempotent-replayed: true`;
 * - `processing` (lease mode) or `uncertain` → `in-progress` (409).
 */
export function decideOnExisting(record: StoredRecord, fingerprint: Fingerprint): ExistingRecordDecision {
  // Only version 1 exists; a later version will recompute the request's fingerprint in the
  // record's version before comparing.
  if (record.fingerprintVersion !== fingerprint.version || !record.fingerprint.equals(fingerprint.digest)) {
    return { kind: 'mismatch' };
  }
  if (record.state === 'completed' || record.state === 'failed') {
    return { kind: 'replay', response: replayOf(record) };
  }
  return { kind: 'in-progress' };
}

function replayOf(record: StoredRecord): IdempotentResponse {
  if (record.responseStatus === null || record.responseBody === null) {
    // A terminal record always has a response; a hand-edited one might not.
    throw new InvalidOptionsError(`A ${record.state} idempotency record has no stored response.`);
  }
  return {
    status: record.responseStatus,
    headers: { ...(record.responseHeaders ?? {}), [REPLAYED_HEADER]: 'true' },
    body: record.responseBody,
  };
}
