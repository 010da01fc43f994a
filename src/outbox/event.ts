/**
 * The outbox event envelope and its validation: pure logic, no I/O.
 */
import { v7 as uuidv7, validate as uuidValidate, version as uuidVersion } from 'uuid';
import { InvalidEventError } from '../errors.js';
import { EVENT_ID_MAX_AGE_MS, EVENT_ID_MAX_SKEW_MS, OUTBOX_LANES } from '../constants.js';
import { jsonText, type JsonTextWording } from '../json-text.js';
import {
  addCloudEventHeaders,
  HEADER_CONTENT_TYPE,
  JSON_CONTENT_TYPE,
  type CloudEventsOptions,
} from './cloud-events.js';

/** An event to write to the outbox. */
export interface OutboxEventInput {
  /** Kafka topic: 1-249 characters of `[a-zA-Z0-9._-]` (Kafka's topic name rule). */
  topic: string;
  /**
   * Kafka partition key, usually the aggregate id. Events that share a key are published in the
   * order their transactions committed. `null`: no key, no order promise.
   */
  key: string | null;
  /** Event type, for example `order.created`; carried in the `event-type` Kafka header. 1-255 chars. */
  type: string;
  /**
   * The payload. A `Buffer`/`Uint8Array` is published byte for byte (never passed to an encoder);
   * anything else goes to the outbox's `encode` hook when it has one (see `OutboxOptions.encode`),
   * else is serialised with `JSON.stringify` as UTF-8 (a JS string becomes a JSON string). Values
   * JSON cannot hold (BigInt, functions, `undefined`) are rejected: pass the encoded bytes instead.
   */
  payload: unknown;
  /**
   * Extra Kafka headers (string values). The relay adds `event-id` and `event-type` (so these
   * two names are refused here, in any case: set `eventId` and `type`); the writer
   * may add `traceparent`/`tracestate` (active OpenTelemetry context), `content-type` (from an
   * encoder) and `ce_*` (CloudEvents), never overwriting one set here except `ce_id`, `ce_type`,
   * `ce_specversion` and `ce_source`.
   */
  headers?: Record<string, string>;
  /** Aggregate type, for example `order`. */
  aggregateType?: string;
  /** Aggregate id. */
  aggregateId?: string;
  /**
   * The durable event id: a UUIDv7 (RFC 9562 §5.7) made at most 1 h before this call
   * ({@link EVENT_ID_MAX_AGE_MS}) and at most 5 min after it ({@link EVENT_ID_MAX_SKEW_MS}), so that
   * no id is ever enqueued twice: within that window the outbox still holds the first event (the
   * relay keeps published rows at least that long), after it the id is refused for its age.
   * @defaultValue a new UUIDv7
   */
  eventId?: string;
}

/** An event's envelope after validation: everything but the payload. */
export interface EventEnvelope {
  eventId: string;
  topic: string;
  key: string | null;
  lane: number;
  type: string;
  headers: Record<string, string>;
  aggregateType: string | null;
  aggregateId: string | null;
}

/** An event after validation, as it is stored. */
export interface PreparedEvent extends EventEnvelope {
  /** The payload bytes, stored as `bytea` and published as the Kafka value byte for byte. */
  payload: Buffer;
}

/** A payload turned into bytes, and its content type when known (a MIME type, RFC 2046). */
export interface EncodedPayload {
  value: Buffer;
  contentType: string | null;
}

/** Per-call settings of {@link prepareEvent} beyond the payload limit. */
export interface PrepareEventOptions {
  /** Add the CloudEvents binary-mode headers (see cloud-events.ts). @defaultValue off */
  cloudEvents?: CloudEventsOptions;
  /** The creation time written to `ce_time` (RFC 3339). @defaultValue now */
  time?: string;
}

/** Kafka's legal topic names: 1-249 of `[a-zA-Z0-9._-]` (org.apache.kafka.common.internals.Topic). */
export const KAFKA_TOPIC_NAME = /^[a-zA-Z0-9._-]{1,249}$/;

/** Kafka header names outboxkit writes itself. */
export const HEADER_EVENT_ID = 'event-id';
export const HEADER_EVENT_TYPE = 'event-type';

/**
 * The lane of a key: FNV-1a (32 bit) of its UTF-8 bytes, modulo {@link OUTBOX_LANES}.
 * Stable across processes and versions: the writer stores it and relays divide lanes by it.
 */
export function laneOf(key: string): number {
  let h = 0x811c9dc5;
  for (const byte of Buffer.from(key, 'utf8')) {
    h ^= byte;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h % OUTBOX_LANES;
}

/** True for payloads published byte for byte (`Buffer`, any `Uint8Array`). */
export function isBytes(payload: unknown): payload is Uint8Array {
  return payload instanceof Uint8Array;
}

/** A `Buffer` view of bytes (no copy). */
export function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/**
 * The default encoding: bytes as given (content type unknown), anything else `JSON.stringify` as
 * UTF-8 (`application/json`).
 *
 * @throws {@link InvalidEventError} when the value cannot be serialised to JSON, or holds, at any
 *   depth, what JSON.stringify would change without an error: NaN, ±Infinity, an invalid Date, a
 *   Map, a Set, an ArrayBuffer, or a typed array other than a top-level byte array or a Buffer.
 */
export function encodeDefault(payload: unknown): EncodedPayload {
  if (isBytes(payload)) return { value: asBuffer(payload), contentType: null };
  return { value: encodeJson(payload), contentType: JSON_CONTENT_TYPE };
}

/** How the errors of an event payload that JSON would not keep are worded. */
const PAYLOAD_WORDING: JsonTextWording = {
  subject: 'The event payload',
  lossyFix:
    ' (NaN, Infinity and an invalid Date become null, a Map or a Set {}, a typed array an object); ' +
    'send plain values, or the encoded bytes as a Buffer or Uint8Array.',
  failedFix: '; pass the encoded bytes as a Buffer.',
  absent: 'The event payload is not JSON-serialisable (undefined or a function); pass a value or a Buffer.',
};

function encodeJson(payload: unknown): Buffer {
  // One pass that also checks each value as given (`this[key]`, before toJSON): what JSON would
  // silently change is refused, at any depth, not published as another value.
  const text = jsonText(payload, PAYLOAD_WORDING, (message, cause) => new InvalidEventError(message, { cause }));
  return Buffer.from(text, 'utf8');
}

const LONE_SURROGATE = /\p{Cs}/u; // with the u flag, only a surrogate outside a pair matches

/**
 * Refuses text that PostgreSQL or UTF-8 cannot carry as given, before it reaches the database: a
 * NUL character (U+0000; PostgreSQL text cannot store it) and an unpaired UTF-16 surrogate (not
 * Unicode: UTF-8 encoding would replace it with U+FFFD, and PostgreSQL refuses it in JSON, which
 * aborts the caller's transaction).
 */
function storableText(value: string, name: string): string {
  if (value.includes('\u0000')) {
    throw new InvalidEventError(`Event ${name} contains a NUL character (U+0000), which PostgreSQL text cannot store.`);
  }
  if (LONE_SURROGATE.test(value)) {
    throw new InvalidEventError(
      `Event ${name} contains an unpaired UTF-16 surrogate, which is not Unicode text and cannot be encoded as UTF-8.`,
    );
  }
  return value;
}

/** The nil and max UUIDs (RFC 9562 §5.9, §5.10) name no event: consumers dead-letter them. */
const RESERVED_UUIDS = new Set(['00000000-0000-0000-0000-000000000000', 'ffffffff-ffff-ffff-ffff-ffffffffffff']);

function optionalText(value: unknown, name: string, max: number): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string' || value.length === 0 || value.length > max) {
    throw new InvalidEventError(`Event ${name} must be a string of 1-${max} characters.`);
  }
  return storableText(value, name);
}

/**
 * Refuses an explicit event id that is not a UUIDv7 of the reuse window: one made more than
 * {@link EVENT_ID_MAX_AGE_MS} ago or more than {@link EVENT_ID_MAX_SKEW_MS} ahead (the writer's
 * clock). The relay keeps a published row at least as long as that window
 * (`EVENT_ID_REUSE_WINDOW_MS`), so an id the window accepts meets the outbox's unique constraint
 * if it was used before, and an id the window refuses cannot come back at all: a consumer's inbox,
 * which remembers applied ids for days, never sees one id on two events. The timestamp of a UUIDv7
 * is its first 48 bits, Unix time in ms (RFC 9562 §5.7).
 */
function checkExplicitEventId(eventId: string, now = Date.now()): void {
  const madeAt = uuidVersion(eventId) === 7 ? parseInt(eventId.replace(/-/g, '').slice(0, 12), 16) : undefined;
  if (madeAt !== undefined && madeAt >= now - EVENT_ID_MAX_AGE_MS && madeAt <= now + EVENT_ID_MAX_SKEW_MS) return;
  const why =
    madeAt === undefined
      ? 'is not a UUIDv7'
      : madeAt < now
        ? `was made ${Math.round((now - madeAt) / 60_000)} min ago`
        : `is dated ${Math.round((madeAt - now) / 60_000)} min ahead of this clock`;
  throw new InvalidEventError(
    `Event id ${JSON.stringify(eventId)} ${why}: an explicit eventId must be a UUIDv7 (RFC 9562) made at most ` +
      `${EVENT_ID_MAX_AGE_MS / 60_000} min before enqueue() and at most ${EVENT_ID_MAX_SKEW_MS / 60_000} min after it, ` +
      'so that an id is never used by two events (docs/events.md, Event ids). Omit eventId for a new one, ' +
      'or make it with uuid v7() just before the transaction.',
  );
}

/**
 * The fields of {@link OutboxEventInput} (the compiler keeps this list and the interface in step):
 * any other is refused, since a typo must not pass silently.
 */
const EVENT_FIELDS = new Set(
  Object.keys({
    topic: true,
    key: true,
    type: true,
    payload: true,
    headers: true,
    aggregateType: true,
    aggregateId: true,
    eventId: true,
  } satisfies Record<keyof OutboxEventInput, true>),
);

/**
 * Validates everything of one event but its payload (cheap, synchronous; run it before any encoder
 * so an invalid event never reaches one).
 *
 * @throws {@link InvalidEventError} on a missing or illegal topic, a missing type, a bad key, bad
 *   headers, an invalid `eventId` or an unknown field.
 */
export function prepareEnvelope(event: OutboxEventInput): EventEnvelope {
  if (typeof event !== 'object' || event === null) throw new InvalidEventError('An outbox event must be an object.');
  for (const field in event) {
    if (!EVENT_FIELDS.has(field)) {
      throw new InvalidEventError(
        `Unknown event field ${JSON.stringify(field)} (a typo?): an event has ${[...EVENT_FIELDS].join(', ')}.`,
      );
    }
  }
  if (typeof event.topic !== 'string' || !KAFKA_TOPIC_NAME.test(event.topic) || /^\.\.?$/.test(event.topic)) {
    throw new InvalidEventError(
      `Invalid topic ${JSON.stringify(event.topic)}: Kafka topics are 1-249 characters of letters, digits, '.', '_' and '-'.`,
    );
  }
  const type = optionalText(event.type, 'type', 255);
  if (type === null) throw new InvalidEventError('Event type is required (for example "order.created").');
  if (event.key !== null && (typeof event.key !== 'string' || Buffer.byteLength(event.key) > 4096)) {
    throw new InvalidEventError('Event key must be a string of at most 4096 bytes, or null.');
  }
  if (event.key !== null) storableText(event.key, 'key');
  const headers: Record<string, string> = {};
  const given: unknown = event.headers ?? {};
  const proto: unknown = typeof given === 'object' && given !== null ? Object.getPrototypeOf(given) : undefined;
  if (typeof given !== 'object' || given === null || (proto !== Object.prototype && proto !== null)) {
    throw new InvalidEventError(
      'Event headers must be a plain object of string values (not a Map, an array or a Buffer).',
    );
  }
  for (const [name, value] of Object.entries(given)) {
    if (typeof value !== 'string')
      throw new InvalidEventError(`Header ${JSON.stringify(name)} must have a string value.`);
    const lower = name.toLowerCase();
    if (lower === '__proto__') throw new InvalidEventError('A header cannot be named "__proto__".');
    if (lower === HEADER_EVENT_ID || lower === HEADER_EVENT_TYPE) {
      throw new InvalidEventError(
        `Header ${JSON.stringify(name)} is set by the relay from the event's ${lower === HEADER_EVENT_ID ? 'eventId' : 'type'}; ` +
          `set \`${lower === HEADER_EVENT_ID ? 'eventId' : 'type'}\` instead.`,
      );
    }
    headers[storableText(name, 'header name')] = storableText(value, `header ${JSON.stringify(name)}`);
  }
  const eventId: unknown = event.eventId ?? uuidv7();
  if (typeof eventId !== 'string' || !uuidValidate(eventId) || RESERVED_UUIDS.has(eventId.toLowerCase())) {
    throw new InvalidEventError(
      `Event id ${JSON.stringify(eventId)} is not a usable UUID (the nil and max UUIDs are reserved).`,
    );
  }
  if (event.eventId !== undefined) checkExplicitEventId(eventId);
  return {
    eventId: eventId.toLowerCase(),
    topic: event.topic,
    key: event.key,
    lane: laneOf(event.key ?? eventId),
    type,
    headers,
    aggregateType: optionalText(event.aggregateType, 'aggregateType', 255),
    aggregateId: optionalText(event.aggregateId, 'aggregateId', 255),
  };
}

/**
 * Joins a validated envelope and its encoded payload into the stored form: checks the payload
 * limit, sets `content-type` when the encoding names one and no header did, and adds the
 * CloudEvents headers when asked.
 *
 * @param maxPayloadBytes - the payload limit in bytes.
 * @throws {@link InvalidEventError} when the payload is over `maxPayloadBytes`, or its content type
 *   contains a NUL character.
 */
export function completeEvent(
  envelope: EventEnvelope,
  encoded: EncodedPayload,
  maxPayloadBytes: number,
  options: PrepareEventOptions = {},
): PreparedEvent {
  const payload = encoded.value;
  if (payload.length > maxPayloadBytes) {
    throw new InvalidEventError(
      `Event payload is ${payload.length} bytes, over the limit of ${maxPayloadBytes} bytes; ` +
        "store large data elsewhere and publish a reference, or raise maxPayloadBytes (and the topic's max.message.bytes).",
    );
  }
  const { headers } = envelope;
  const given = headers[HEADER_CONTENT_TYPE];
  const contentType =
    given ?? (encoded.contentType === null ? null : storableText(encoded.contentType, 'content type'));
  // An encoder that names its content type (JSON is the documented default and goes unsaid unless
  // CloudEvents asks for it) tells consumers how to decode the bytes.
  if (given === undefined && contentType !== null && contentType !== JSON_CONTENT_TYPE) {
    headers[HEADER_CONTENT_TYPE] = contentType;
  }
  if (options.cloudEvents !== undefined) {
    addCloudEventHeaders(
      headers,
      {
        eventId: envelope.eventId,
        type: envelope.type,
        key: envelope.key,
        aggregateId: envelope.aggregateId,
        contentType,
        time: options.time ?? new Date().toISOString(),
      },
      options.cloudEvents,
    );
  }
  return { ...envelope, payload };
}

/**
 * Validates one event and turns it into the stored form with the default encoding (bytes as
 * given, else JSON): {@link prepareEnvelope}, {@link encodeDefault}, {@link completeEvent}.
 *
 * @param maxPayloadBytes - the payload limit in bytes.
 * @throws {@link InvalidEventError} on a missing or illegal topic, a missing type, a bad key, bad
 *   headers, an unserialisable payload, a payload over `maxPayloadBytes`, or an invalid `eventId`.
 */
export function prepareEvent(
  event: OutboxEventInput,
  maxPayloadBytes: number,
  options: PrepareEventOptions = {},
): PreparedEvent {
  const envelope = prepareEnvelope(event);
  return completeEvent(envelope, encodeDefault(event.payload), maxPayloadBytes, options);
}
