/**
 * The event a dedup handler receives, decoded from a Kafka message: pure logic, no I/O.
 */
import type { IHeaders, KafkaMessage } from 'kafkajs';
import { validate as uuidValidate } from 'uuid';
import { HEADER_EVENT_TYPE } from '../src/outbox/event.js';
import { InvalidMessageError } from './errors.js';

/** One Kafka message, as the handler sees it. */
export interface ConsumedEvent {
  /** The durable event id (a UUID, lower case) from the event id header; the deduplication key. */
  readonly id: string;
  /** The event type from the `event-type` header (written by the relay), or null when absent. */
  readonly type: string | null;
  /** The Kafka key decoded as UTF-8 (the relay writes the event key), or null. */
  readonly key: string | null;
  /** The Kafka value: the payload bytes as the producer wrote them, or null (a tombstone). */
  readonly value: Buffer | null;
  /**
   * The value parsed as UTF-8 JSON. Parsed on first call, then memoised.
   *
   * @throws {@link InvalidMessageError} when the value is null or not JSON. A handler that lets it
   *   propagate has the message dead-lettered at once, without retries.
   */
  json<T = unknown>(): T;
  /**
   * Kafka headers decoded as UTF-8. When a header name occurs more than once, the last value
   * wins (Kafka's `Headers.lastHeader`). The dead-letter topic keeps the original bytes.
   */
  readonly headers: Readonly<Record<string, string>>;
  /** The topic the message was read from. */
  readonly topic: string;
  /** The partition the message was read from. */
  readonly partition: number;
  /** The message's offset in its partition, as a decimal string (Kafka offsets are 64-bit). */
  readonly offset: string;
}

type HeaderValue = IHeaders[string];

function lastHeaderValue(value: HeaderValue): Buffer | string | undefined {
  return Array.isArray(value) ? value[value.length - 1] : value;
}

/** Decodes kafkajs headers (Buffers, strings or arrays of them) to strings; last value wins. */
export function decodeHeaders(headers: IHeaders | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, raw] of Object.entries(headers ?? {})) {
    const value = lastHeaderValue(raw);
    if (value !== undefined) out[name] = Buffer.isBuffer(value) ? value.toString('utf8') : String(value);
  }
  return out;
}

const NIL_UUID = '00000000-0000-0000-0000-000000000000';
const MAX_UUID = 'ffffffff-ffff-ffff-ffff-ffffffffffff';

/**
 * Reads the event id from decoded headers.
 *
 * @returns the id in lower case, or null when the header is missing or is not a UUID (RFC 9562
 *   versions 1-8; the nil and max UUIDs are refused: they identify nothing).
 */
export function readEventId(headers: Readonly<Record<string, string>>, headerName: string): string | null {
  const raw = headers[headerName];
  if (raw === undefined || !uuidValidate(raw)) return null;
  const id = raw.toLowerCase();
  return id === NIL_UUID || id === MAX_UUID ? null : id;
}

/** Builds the {@link ConsumedEvent} of a message whose event id has been read. */
export function toConsumedEvent(
  topic: string,
  partition: number,
  message: KafkaMessage,
  id: string,
  headers: Readonly<Record<string, string>>,
): ConsumedEvent {
  let parsed: { value: unknown } | undefined;
  const value = message.value;
  return {
    id,
    type: headers[HEADER_EVENT_TYPE] ?? null,
    key: message.key === null ? null : message.key.toString('utf8'),
    value,
    headers,
    topic,
    partition,
    offset: message.offset,
    json<T>(): T {
      if (parsed === undefined) {
        if (value === null) {
          throw new InvalidMessageError(
            `Event ${id} (${topic}/${partition}@${message.offset}) has no value to parse as JSON.`,
          );
        }
        try {
          parsed = { value: JSON.parse(value.toString('utf8')) as unknown };
        } catch (err) {
          throw new InvalidMessageError(
            `Event ${id} (${topic}/${partition}@${message.offset}) is not valid JSON: ${(err as Error).message}`,
            { cause: err },
          );
        }
      }
      return parsed.value as T;
    },
  };
}
