/**
 * The dead-letter record: what the consumer writes when it gives up on a message (docs/guarantees.md, G5).
 * Pure logic, no I/O.
 */
import type { InboundMessage, ProducerMessage, RecordHeaders } from '../src/kafka/types.js';
import { syntaxErrorPosition, VALUE_FREE_ERRORS } from './consumed-event.js';

/** Why the message was dead-lettered: the fixed reason below, or the handler's error. */
export const HEADER_DLQ_REASON = 'dlq-reason';
/** The topic the message was read from. */
export const HEADER_DLQ_ORIGINAL_TOPIC = 'dlq-original-topic';
/** Its partition, as a decimal string. */
export const HEADER_DLQ_ORIGINAL_PARTITION = 'dlq-original-partition';
/** Its offset, as a decimal string. */
export const HEADER_DLQ_ORIGINAL_OFFSET = 'dlq-original-offset';
/** How many times the handler ran on it (0 when it never ran), as a decimal string. */
export const HEADER_DLQ_ATTEMPTS = 'dlq-attempts';
/** When the consumer gave up: an ISO 8601 UTC timestamp. */
export const HEADER_DLQ_FAILED_AT = 'dlq-failed-at';
/** The consumer group that gave up (replays usually target that group's handler). */
export const HEADER_DLQ_CONSUMER_GROUP = 'dlq-consumer-group';

/** What the dead-letter topic of a consumed topic is named by default: `<topic>.dlq`. */
export const DEAD_LETTER_TOPIC_SUFFIX = '.dlq';

/**
 * The topic a dead-letter topic belongs to under the default naming (`orders.dlq` → `orders`),
 * or null for a name without the {@link DEAD_LETTER_TOPIC_SUFFIX}: `dlq replay` sends dead letters
 * there, never where a record's own `dlq-original-topic` header says (anyone who may write to the
 * dead-letter topic chooses its headers).
 */
export function topicOfDeadLetterTopic(deadLetterTopic: string): string | null {
  if (!deadLetterTopic.endsWith(DEAD_LETTER_TOPIC_SUFFIX)) return null;
  const topic = deadLetterTopic.slice(0, -DEAD_LETTER_TOPIC_SUFFIX.length);
  return topic === '' || topic === '.' || topic === '..' ? null : topic;
}

/** The `dlq-reason` of a message without a usable event id (test/consumer/c16-missing-event-id.test.ts). */
export const DEAD_LETTER_REASON_INVALID_EVENT_ID = 'missing or invalid event id';

/** Longest `dlq-reason` written, in characters; longer error messages are cut. */
export const MAX_DLQ_REASON_LENGTH = 1_000;

/** What the dead-letter record says about the failure. */
export interface DeadLetterInfo {
  reason: string;
  topic: string;
  partition: number;
  attempts: number;
  groupId: string;
  failedAt: Date;
}

/** Shortest word of an error message that {@link reasonOf} checks against the message value. */
const MIN_CHECKED_WORD = 3;

/** `text` cut to `max` characters, an ellipsis marking the cut. */
function cut(text: string, max = MAX_DLQ_REASON_LENGTH): string {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** What replaces a word of the value in a reason. */
const WITHHELD = '…';

/**
 * The `dlq-reason` for an error a handler threw: `Name: message`, followed by the error's
 * `code` in brackets when it has one its message does not show (outboxkit's own `OUTBOXKIT_*`
 * codes left out), then `; cause: Name: message [code]` for each error of its `cause` chain (at
 * most {@link MAX_REASON_CAUSES}): so `Error: socket hang up [ECONNRESET]`, or undici's
 * `TypeError: fetch failed; cause: ConnectTimeoutError: Connect Timeout Error (...)
 * [UND_ERR_CONNECT_TIMEOUT]`. Cut to 1,000 characters, and never carrying bytes of the message
 * value (a dead letter's payload is never shown, and anyone who may read the dead-letter topic,
 * or run `outboxkit dlq list`, reads its reason):
 * - a `SyntaxError`'s message (also in the cause chain) is replaced by a fixed text and the
 *   position it names (`JSON.parse` quotes the text it failed on);
 * - every word of the message (3 or more characters, quotes and punctuation around it left out)
 *   that occurs in the value is replaced by `…`: for a JSON value, a word found in one of its
 *   strings or numbers, or holding one of 3 or more characters; otherwise a word found in the
 *   value read as UTF-8. So `Error: card 4111111111111111 declined` becomes `Error: card …
 *   declined` when the card number is in the payload. Shorter words, and values a handler derived
 *   from the payload (sums, decoded Avro numbers), are not recognised: keep payload contents out
 *   of error messages. The full error is in the consumer's log. The errors of `event.json()` and
 *   `event.decoded()` name no byte of the value and are kept whole (without their causes).
 *
 * @param value - the message value, or null (then only the SyntaxError rule applies).
 */
export function reasonOf(err: unknown, value: Buffer | null = null): string {
  if (err instanceof Error && err.name === 'SyntaxError') return cut(describeError(err));
  const valueFree = err instanceof Error && VALUE_FREE_ERRORS.has(err);
  const links = [describeError(err)];
  if (!valueFree) {
    let e = causeOf(err);
    for (let n = 0; e !== undefined && n < MAX_REASON_CAUSES; n++, e = causeOf(e)) links.push(describeError(e));
  }
  // Cut first: the words withheld are then those of the reason written, a bounded number.
  let text = cut(links.join('; cause: '));
  if (value !== null && value.length > 0 && !valueFree) text = withholdValueWords(text, value);
  return cut(text);
}

/** Most errors of a `cause` chain a reason names, after the error itself. */
export const MAX_REASON_CAUSES = 3;

function causeOf(err: unknown): unknown {
  return typeof err === 'object' && err !== null ? (err as { cause?: unknown }).cause : undefined;
}

/** One error of a reason: `Name: message [code]` (see {@link reasonOf}). */
function describeError(err: unknown): string {
  if (err instanceof Error && err.name === 'SyntaxError') {
    return `SyntaxError: message withheld (it may quote the message value)${syntaxErrorPosition(err)}`;
  }
  let text = err instanceof Error ? `${err.name}: ${err.message}` : `non-error thrown: ${String(err)}`;
  const code = typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined;
  if (typeof code === 'string' && code !== '' && !code.startsWith('OUTBOXKIT_') && !text.includes(code)) {
    text += ` [${code}]`;
  }
  return text;
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const MINUS = 0x2d;
const WHITESPACE = /\s/;

const isDigit = (c: number): boolean => c >= 0x30 && c <= 0x39;
/** `[\d.eE+-]`: a character of a number after its first digit. */
const inNumber = (c: number): boolean =>
  isDigit(c) || c === 0x2e || c === 0x65 || c === 0x45 || c === 0x2b || c === MINUS;
/** A line terminator: what `.` does not match. */
const endsLine = (c: number): boolean => c === 0x0a || c === 0x0d || c === 0x2028 || c === 0x2029;
/** `\s`: ASCII spaces, tabs and line ends directly, the rest by the regular expression. */
const isSpace = (c: number): boolean =>
  c < 0x80 ? c === 0x20 || (c >= 0x09 && c <= 0x0d) : WHITESPACE.test(String.fromCharCode(c));

/**
 * The end of the JSON string whose text starts at `from` (just after its opening quote): the index
 * of its closing quote, or, when it has none, `~f` where `f` is where the string breaks off (the
 * end of `text`, or a backslash that escapes nothing: a line end, or the end of `text`).
 */
function stringEnd(text: string, from: number): number {
  for (let k = from; k < text.length; k++) {
    const c = text.charCodeAt(k);
    if (c === QUOTE) return k;
    if (c === BACKSLASH) {
      if (k + 1 >= text.length || endsLine(text.charCodeAt(k + 1))) return ~k;
      k++;
    }
  }
  return ~text.length;
}

/**
 * What of `value` a reason must not show: for a JSON value (its first byte is `{`, `[` or `"`),
 * its strings and numbers but not its keys, else its whole text (UTF-8).
 *
 * The strings and numbers are the matches of `"((?:[^"\\]|\\.)*)"(\s*:)?|-?\d[\d.eE+-]*`, all of
 * them (a string followed by `:` being a key), found in one pass by hand instead: irregexp keeps
 * a backtracking entry for each character of such a string (some 23 MiB of fresh memory for a
 * string of 1 MiB, 70-120 ms of page faults on a VM, and a RangeError from 8 MiB on), and the
 * search tries again from each quote inside an unterminated string, which is quadratic
 * (`"\"\"\"…`: 0.45 s at 40 KiB). A quote inside a string that breaks off at `f` opens a string that
 * breaks off at `f` too (it is the second character of an escape, after which both read the same
 * characters in the same state): such quotes are passed over.
 */
function valueLeaves(value: Buffer): string[] {
  const text = value.toString('utf8');
  if (!/^\s*[[{"]/.test(text)) return [text];
  const leaves: string[] = [];
  // Quotes before this index open a string that breaks off.
  let brokenUntil = 0;
  let i = 0;
  while (i < text.length) {
    const c = text.charCodeAt(i);
    if (c === QUOTE && i >= brokenUntil) {
      const end = stringEnd(text, i + 1);
      if (end >= 0) {
        let k = end + 1;
        while (k < text.length && isSpace(text.charCodeAt(k))) k++;
        if (text.charCodeAt(k) === COLON) {
          i = k + 1; // a key: the names of fields are no secret
          continue;
        }
        const raw = text.slice(i + 1, end);
        // Without a backslash, unescaping changes nothing (JSON.parse returns the text, or refuses
        // a control character in it and the text is kept): no copy of a long string.
        leaves.push(raw.includes('\\') ? unescaped(raw) : raw);
        i = end + 1;
        continue;
      }
      brokenUntil = ~end;
    }
    if (isDigit(c) || (c === MINUS && isDigit(text.charCodeAt(i + 1)))) {
      let k = i + 1;
      while (k < text.length && inNumber(text.charCodeAt(k))) k++;
      leaves.push(text.slice(i, k));
      i = k;
      continue;
    }
    i++;
  }
  return leaves;
}

/** The text of a JSON string with escapes (between its quotes) unescaped, or as it is when it is not valid JSON. */
function unescaped(raw: string): string {
  try {
    return JSON.parse(`"${raw}"`) as string;
  } catch {
    return raw;
  }
}

/** Longest word of a reason checked for the leaves of the value it holds (longer ones: their first 64 characters). */
const MAX_CONTAINED_LEAF = 64;

const PUNCTUATION = /[\p{P}\p{S}]/u;

/** `token` without the punctuation and symbols around it: `"4111",` is checked as 4111. */
function coreOf(token: string): string {
  let start = 0;
  let end = token.length;
  while (start < end && PUNCTUATION.test(token[start]!)) start++;
  while (end > start && PUNCTUATION.test(token[end - 1]!)) end--;
  return token.slice(start, end);
}

/**
 * `text` with each word found in the value's leaves withheld. Bounded work whatever the sizes:
 * `text` is at most {@link MAX_DLQ_REASON_LENGTH} characters; each word is searched once in the
 * leaves joined (native search), and the leaves a word may contain are looked up by its
 * substrings of 3 to 64 characters in a set.
 */
function withholdValueWords(text: string, value: Buffer): string {
  const leaves = valueLeaves(value);
  const joined = leaves.join('\u0000');
  const leafSet = new Set(
    leaves.filter((leaf) => leaf.length >= MIN_CHECKED_WORD && leaf.length <= MAX_CONTAINED_LEAF),
  );
  const holdsLeaf = (word: string): boolean => {
    for (let i = 0; i + MIN_CHECKED_WORD <= word.length; i++) {
      for (let j = i + MIN_CHECKED_WORD; j <= Math.min(word.length, i + MAX_CONTAINED_LEAF); j++) {
        if (leafSet.has(word.slice(i, j))) return true;
      }
    }
    return false;
  };
  return text.replace(/\S+/g, (token) => {
    const core = coreOf(token);
    if (core.length < MIN_CHECKED_WORD || !(joined.includes(core) || holdsLeaf(core))) return token;
    return token.replace(core, WITHHELD);
  });
}

/**
 * The message to produce to the dead-letter topic: the original key and value byte for byte, the
 * original headers (raw, repeated names kept), and the `dlq-*` headers, which replace any that the
 * original carried (a replayed message that fails again records its latest failure).
 */
export function deadLetterMessage(message: InboundMessage, info: DeadLetterInfo): ProducerMessage {
  const headers: RecordHeaders = { ...(message.headers ?? {}) };
  headers[HEADER_DLQ_REASON] = info.reason;
  headers[HEADER_DLQ_ORIGINAL_TOPIC] = info.topic;
  headers[HEADER_DLQ_ORIGINAL_PARTITION] = String(info.partition);
  headers[HEADER_DLQ_ORIGINAL_OFFSET] = message.offset;
  headers[HEADER_DLQ_ATTEMPTS] = String(info.attempts);
  headers[HEADER_DLQ_FAILED_AT] = info.failedAt.toISOString();
  headers[HEADER_DLQ_CONSUMER_GROUP] = info.groupId;
  return { key: message.key, value: message.value, headers };
}

/** Every header the consumer adds to a dead-letter record starts with this prefix. */
export const DLQ_HEADER_PREFIX = 'dlq-';

/**
 * On a dead letter that holds no value: what was left out, and why (see {@link reducedDeadLetter}).
 * Such a letter cannot be replayed from the dead-letter topic; its original is in the original
 * topic at `dlq-original-topic`/`-partition`/`-offset` for as long as that topic keeps it.
 */
export const HEADER_DLQ_OMITTED = 'dlq-omitted';

/** The `dlq-*` headers the consumer writes (a dead letter's own, as opposed to the original's). */
const DLQ_HEADERS = new Set([
  HEADER_DLQ_REASON,
  HEADER_DLQ_ORIGINAL_TOPIC,
  HEADER_DLQ_ORIGINAL_PARTITION,
  HEADER_DLQ_ORIGINAL_OFFSET,
  HEADER_DLQ_ATTEMPTS,
  HEADER_DLQ_FAILED_AT,
  HEADER_DLQ_CONSUMER_GROUP,
]);

/** Largest kept header value (the event id and type) of a reduced dead letter, in bytes. */
const MAX_KEPT_HEADER_BYTES = 256;
/** Largest key a reduced dead letter keeps, in bytes. */
const MAX_KEPT_KEY_BYTES = 1_024;

function byteLength(value: string | Buffer | (string | Buffer)[] | null | undefined): number {
  if (value === null || value === undefined) return 0;
  if (Array.isArray(value)) return value.reduce((n, v) => n + Buffer.byteLength(v), 0);
  return Buffer.byteLength(value);
}

/**
 * The dead letter to send when the whole one was refused as too large (MESSAGE_TOO_LARGE: the
 * original plus the `dlq-*` headers exceeds the dead-letter topic's `max.message.bytes`): the
 * consumer's own `dlq-*` headers, the headers named in `keep` (the event id and type, so that
 * `outboxkit dlq list` still names the event) and the key when they are small (at most 256 and
 * 1,024 bytes), no value, nothing else, and a {@link HEADER_DLQ_OMITTED} header that says what was
 * left out. Its size is bounded (under 3 KiB with the consumer's reasons, cut to 1,000
 * characters of ASCII), whatever the original's: the failure stays visible with its reason and position, and the
 * partition moves on (docs/guarantees.md, G5).
 */
export function reducedDeadLetter(letter: ProducerMessage, keep: readonly string[]): ProducerMessage {
  const headers: RecordHeaders = {};
  let dropped = 0;
  for (const [name, value] of Object.entries(letter.headers ?? {})) {
    if (value === undefined) continue;
    if (DLQ_HEADERS.has(name) || (keep.includes(name) && byteLength(value) <= MAX_KEPT_HEADER_BYTES))
      headers[name] = value;
    else dropped += 1;
  }
  const keyBytes = byteLength(letter.key);
  const keepKey = keyBytes <= MAX_KEPT_KEY_BYTES;
  const left = [
    `value (${byteLength(letter.value)} bytes)`,
    ...(dropped > 0 ? [`${dropped} header${dropped > 1 ? 's' : ''}`] : []),
    ...(keepKey ? [] : [`key (${keyBytes} bytes)`]),
  ];
  headers[HEADER_DLQ_OMITTED] =
    `${left.join(', ')}: the dead letter was larger than the dead-letter topic's max.message.bytes. ` +
    'The original is at dlq-original-topic/-partition/-offset while that topic keeps it.';
  return { key: keepKey ? (letter.key ?? null) : null, value: null, headers };
}

/** What `outboxkit dlq list` shows of one dead-letter record: never the payload itself. */
export interface DeadLetterSummary {
  /** Where the dead-letter record sits. */
  dlq: { topic: string; partition: number; offset: string };
  /** Where the message was read from when it failed (null when the header is missing). */
  originalTopic: string | null;
  originalPartition: number | null;
  originalOffset: string | null;
  reason: string | null;
  /** Handler runs before it was dead-lettered (0: never ran, as for a missing event id). */
  attempts: number | null;
  /** ISO 8601 UTC. */
  failedAt: string | null;
  consumerGroup: string | null;
  /** The event id (lower case) when the event id header holds a usable one, else null. */
  eventId: string | null;
  /** The event id header's value when it holds no usable id (cut to 64 characters), else null. */
  invalidEventId: string | null;
  /** The `dlq-omitted` header: the value was left out (too large for the dead-letter topic), else null. */
  omitted: string | null;
  eventType: string | null;
  /** The Kafka key as UTF-8, cut to 64 characters. */
  key: string | null;
  /** Size of the value in bytes (null for a tombstone); the value itself is never shown. */
  valueBytes: number | null;
}

/** Longest key (or invalid event id) shown in a summary, in characters. */
const MAX_SUMMARY_KEY_LENGTH = 64;

function headerText(headers: InboundMessage['headers'], name: string): string | null {
  const raw = headers?.[name];
  const value = Array.isArray(raw) ? raw[raw.length - 1] : raw;
  if (value === undefined) return null;
  return Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
}

function intOrNull(text: string | null): number | null {
  if (text === null || !/^\d+$/.test(text)) return null;
  return Number(text);
}

/**
 * Summarises a dead-letter record for listing.
 *
 * @param eventId - the record's event id as the consumer reads it (`readEventId`), or null.
 * @param eventType - its `event-type` header, or null.
 * @param eventIdHeader - the header that carries the event id. @defaultValue 'event-id'
 */
export function summarizeDeadLetter(
  message: InboundMessage,
  dlq: { topic: string; partition: number },
  eventId: string | null,
  eventType: string | null,
  eventIdHeader = 'event-id',
): DeadLetterSummary {
  const h = message.headers;
  const key = message.key === null ? null : message.key.toString('utf8');
  const rawEventId = eventId === null ? headerText(h, eventIdHeader) : null;
  return {
    dlq: { ...dlq, offset: message.offset },
    originalTopic: headerText(h, HEADER_DLQ_ORIGINAL_TOPIC),
    originalPartition: intOrNull(headerText(h, HEADER_DLQ_ORIGINAL_PARTITION)),
    originalOffset: headerText(h, HEADER_DLQ_ORIGINAL_OFFSET),
    reason: headerText(h, HEADER_DLQ_REASON),
    attempts: intOrNull(headerText(h, HEADER_DLQ_ATTEMPTS)),
    failedAt: headerText(h, HEADER_DLQ_FAILED_AT),
    consumerGroup: headerText(h, HEADER_DLQ_CONSUMER_GROUP),
    eventId,
    invalidEventId: rawEventId === null ? null : cut(rawEventId, MAX_SUMMARY_KEY_LENGTH),
    omitted: headerText(h, HEADER_DLQ_OMITTED),
    eventType,
    key: key === null ? null : cut(key, MAX_SUMMARY_KEY_LENGTH),
    valueBytes: message.value === null ? null : message.value.length,
  };
}

/**
 * The message that re-drives a dead letter: the original key and value byte for byte and the
 * original headers (raw, repeated names kept) without the `dlq-*` ones, so the consumer sees the
 * message as it first arrived. Its event id is unchanged: the dedup consumer applies it at most
 * once however often it is replayed.
 */
export function replayMessage(message: InboundMessage): ProducerMessage {
  const headers: RecordHeaders = {};
  for (const [name, value] of Object.entries(message.headers ?? {})) {
    if (!name.startsWith(DLQ_HEADER_PREFIX) && value !== undefined) headers[name] = value;
  }
  return { key: message.key, value: message.value, headers };
}
