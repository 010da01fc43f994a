/**
 * The outbox event envelope and its validation: pure logic, no I/O.
 */
import { v7 as uuidv7, validate as uuidValidate } from 'uuid';
import { InvalidEventError } from '../errors.js';
import { OUTBOX_LANES } from '../schema.js';

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
   * The payload. A `Buffer`/`Uint8Array` is published byte for byte; anything else is serialised
   * with `JSON.stringify` (a JS string becomes a JSON string). Values JSON cannot hold (BigInt,
   * functions, `undefined`) are rejected: pass the encoded bytes instead.
   */
  payload: unknown;
  /** Extra Kafka headers (string values). The relay adds `event-id` and `event-type`. */
  headers?: Record<string, string>;
  /** Aggregate type, for example `order`. */
  aggregateType?: string;
  /** Aggregate id. */
  aggregateId?: string;
  /** The durable event id (UUID). @defaultValue a new UUIDv7 (RFC 9562) */
  eventId?: string;
}

/** An event after validation, as it is stored. */
export interface PreparedEvent {
  eventId: string;
  topic: string;
  key: string | null;
  lane: number;
  type: string;
  payload: Buffer;
  headers: Record<string, string>;
  aggregateType: string | null;
  aggregateId: string | null;
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

function encodePayload(payload: unknown): Buffer {
  if (Buffer.isBuffer(payload)) return payload;
  if (payload instanceof Uint8Array) return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  let text: string | undefined;
  try {
    text = JSON.stringify(payload);
  } catch (err) {
    throw new InvalidEventError(
      `The event payload cannot be serialised to JSON (${(err as Error).message}); pass the encoded bytes as a Buffer.`,
      { cause: err },
    );
  }
  if (text === undefined) {
    throw new InvalidEventError(
      'The event payload is not JSON-serialisable (undefined or a function); pass a value or a Buffer.',
    );
  }
  return Buffer.from(text, 'utf8');
}

/** PostgreSQL text cannot hold U+0000: refuse it before it reaches the database. */
function noNul(value: string, name: string): string {
  if (value.includes('\u0000')) {
    throw new InvalidEventError(`Event ${name} contains a NUL character (U+0000), which PostgreSQL text cannot store.`);
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
  return noNul(value, name);
}

/**
 * Validates one event and turns it into the stored form.
 *
 * @param maxPayloadBytes - the payload limit in bytes.
 * @throws {@link InvalidEventError} on a missing or illegal topic, a missing type, a bad key, bad
 *   headers, an unserialisable payload, a payload over `maxPayloadBytes`, or an invalid `eventId`.
 */
export function prepareEvent(event: OutboxEventInput, maxPayloadBytes: number): PreparedEvent {
  if (typeof event !== 'object' || event === null) throw new InvalidEventError('An outbox event must be an object.');
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
  if (event.key !== null) noNul(event.key, 'key');
  const headers: Record<string, string> = {};
  const given: unknown = event.headers ?? {};
  if (typeof given !== 'object' || given === null || Array.isArray(given) || Buffer.isBuffer(given)) {
    throw new InvalidEventError('Event headers must be a plain object of string values.');
  }
  for (const [name, value] of Object.entries(given)) {
    if (typeof value !== 'string')
      throw new InvalidEventError(`Header ${JSON.stringify(name)} must have a string value.`);
    headers[noNul(name, 'header name')] = noNul(value, `header ${JSON.stringify(name)}`);
  }
  const eventId: unknown = event.eventId ?? uuidv7();
  if (typeof eventId !== 'string' || !uuidValidate(eventId) || RESERVED_UUIDS.has(eventId.toLowerCase())) {
    throw new InvalidEventError(
      `Event id ${JSON.stringify(eventId)} is not a usable UUID (the nil and max UUIDs are reserved).`,
    );
  }
  const payload = encodePayload(event.payload);
  if (payload.length > maxPayloadBytes) {
    throw new InvalidEventError(
      `Event payload is ${payload.length} bytes, over the limit of ${maxPayloadBytes} bytes; ` +
        "store large data elsewhere and publish a reference, or raise maxPayloadBytes (and the topic's max.message.bytes).",
    );
  }
  return {
    eventId: eventId.toLowerCase(),
    topic: event.topic,
    key: event.key,
    lane: laneOf(event.key ?? eventId),
    type,
    payload,
    headers,
    aggregateType: optionalText(event.aggregateType, 'aggregateType', 255),
    aggregateId: optionalText(event.aggregateId, 'aggregateId', 255),
  };
}
