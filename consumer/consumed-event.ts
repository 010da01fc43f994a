/**
 * The event a dedup handler receives, decoded from a Kafka message: pure logic, no I/O.
 */
import type { InboundMessage, RecordHeaders } from '../src/kafka/types.js';
import { validate as uuidValidate } from 'uuid';
import { readCloudEventAttributes, type CloudEventAttributes } from '../src/outbox/cloud-events.js';
import { HEADER_EVENT_TYPE } from '../src/outbox/event.js';
import { exceedsJsonDepth, MAX_JSON_DEPTH } from '../src/json-text.js';
import { InvalidMessageError } from './errors.js';

/**
 * Turns a message's value into the application's value, for example Avro through a Schema
 * Registry (`(value) => registry.decode(value)`). May be async. Used by
 * {@link ConsumedEvent.decoded}; set it with the consumer's `decode` option.
 *
 * What it throws reaches the handler through `decoded()`: let it propagate and the message is
 * retried, then dead-lettered after `maxAttempts`; throw an `InvalidMessageError` (code
 * `OUTBOXKIT_INVALID_MESSAGE`) for bytes that can never be decoded, and it is dead-lettered at
 * once.
 */
export type EventDecoder = (value: Buffer, event: ConsumedEvent) => unknown;

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
   * The value decoded by the consumer's `decode` hook (see {@link EventDecoder}), or, without a
   * hook, parsed as JSON like {@link ConsumedEvent.json}. Decoded on first call, then memoised.
   *
   * @throws {@link InvalidMessageError} (rejects) when the value is null (a tombstone), or without a
   *   hook when it is not JSON; otherwise whatever the hook throws.
   */
  decoded<T = unknown>(): Promise<T>;
  /**
   * The CloudEvents attributes of the message (binary content mode `ce_*` headers and
   * `content-type`, CloudEvents Kafka Protocol Binding 1.0.2 §3.2), or null when a required one
   * (`ce_specversion`, `ce_id`, `ce_source`, `ce_type`) is missing.
   */
  cloudEvent(): CloudEventAttributes | null;
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

type HeaderValue = RecordHeaders[string];

/**
 * Errors this module makes whose messages hold no byte of the value (they name the event and its
 * position only): their dead-letter reason is kept whole (see `reasonOf`).
 */
export const VALUE_FREE_ERRORS = new WeakSet<Error>();

function valueFree(err: InvalidMessageError): InvalidMessageError {
  VALUE_FREE_ERRORS.add(err);
  return err;
}

/**
 * Where a JSON.parse SyntaxError says the text went wrong (` at character 12`, in UTF-16 code
 * units), or '' when its message names no position. The message itself is never kept: V8 quotes
 * the input in it (`Unexpected token 'o', "not json" is not valid JSON`).
 */
export function syntaxErrorPosition(err: unknown): string {
  const position = err instanceof Error ? /\bposition (\d+)/.exec(err.message)?.[1] : undefined;
  return position === undefined ? '' : ` at character ${position}`;
}

function lastHeaderValue(value: HeaderValue): Buffer | string | undefined {
  return Array.isArray(value) ? value[value.length - 1] : value;
}

/** Decodes raw headers (Buffers, strings or arrays of them) to strings; last value wins. */
export function decodeHeaders(headers: RecordHeaders | undefined): Record<string, string> {
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

/** The {@link ConsumedEvent} of one Kafka message (methods on the prototype: no closures per message). */
class KafkaConsumedEvent implements ConsumedEvent {
  readonly id: string;
  readonly type: string | null;
  readonly key: string | null;
  readonly value: Buffer | null;
  readonly headers: Readonly<Record<string, string>>;
  readonly topic: string;
  readonly partition: number;
  readonly offset: string;
  #parsed: { value: unknown } | undefined;
  #decoded: Promise<unknown> | undefined;
  #decoder: EventDecoder | undefined;

  constructor(
    topic: string,
    partition: number,
    message: InboundMessage,
    id: string,
    headers: Readonly<Record<string, string>>,
    decoder: EventDecoder | undefined,
  ) {
    this.id = id;
    this.type = headers[HEADER_EVENT_TYPE] ?? null;
    this.key = message.key === null ? null : message.key.toString('utf8');
    this.value = message.value;
    this.headers = headers;
    this.topic = topic;
    this.partition = partition;
    this.offset = message.offset;
    this.#decoder = decoder;
  }

  #where(): string {
    return `Event ${this.id} (${this.topic}/${this.partition}@${this.offset})`;
  }

  json<T>(): T {
    if (this.#parsed === undefined) {
      if (this.value === null)
        throw valueFree(new InvalidMessageError(`${this.#where()} has no value to parse as JSON.`));
      const text = this.value.toString('utf8');
      if (exceedsJsonDepth(text, MAX_JSON_DEPTH)) {
        throw valueFree(
          new InvalidMessageError(
            `${this.#where()} nests JSON arrays and objects more than ${MAX_JSON_DEPTH} levels deep.`,
          ),
        );
      }
      try {
        this.#parsed = { value: JSON.parse(text) as unknown };
      } catch (err) {
        // Neither JSON.parse's message nor the SyntaxError itself: V8 quotes the text it failed
        // on, and this message becomes the dead letter's reason, which never shows the value.
        throw valueFree(
          new InvalidMessageError(
            `${this.#where()} is not valid JSON${syntaxErrorPosition(err)}; its bytes are not shown.`,
          ),
        );
      }
    }
    return this.#parsed.value as T;
  }

  decoded<T>(): Promise<T> {
    this.#decoded ??= this.#decode();
    return this.#decoded as Promise<T>;
  }

  async #decode(): Promise<unknown> {
    const decoder = this.#decoder;
    if (decoder === undefined) return this.json();
    if (this.value === null) {
      throw valueFree(new InvalidMessageError(`${this.#where()} has no value to decode (a tombstone).`));
    }
    return await decoder(this.value, this);
  }

  cloudEvent(): CloudEventAttributes | null {
    return readCloudEventAttributes(this.headers);
  }

  /** Sets the decoder before the handler sees the event (consumer/tracing.ts `runHandler`). */
  useDecoder(decoder: EventDecoder): void {
    if (this.#decoded === undefined) this.#decoder = decoder;
  }
}

/**
 * Builds the {@link ConsumedEvent} of a message whose event id has been read.
 *
 * @param decoder - the hook behind {@link ConsumedEvent.decoded}. @defaultValue JSON
 */
export function toConsumedEvent(
  topic: string,
  partition: number,
  message: InboundMessage,
  id: string,
  headers: Readonly<Record<string, string>>,
  decoder?: EventDecoder,
): ConsumedEvent {
  return new KafkaConsumedEvent(topic, partition, message, id, headers, decoder);
}

/**
 * Gives `event` the consumer's decoder (a no-op for an event this module did not build, or one
 * already decoded).
 */
export function useDecoder(event: ConsumedEvent, decoder: EventDecoder): void {
  if (event instanceof KafkaConsumedEvent) event.useDecoder(decoder);
}
