/**
 * The outbox's serialisation hook: how an application value becomes the payload bytes.
 */
import { EventEncodingError, isOutboxkitError } from '../errors.js';
import { asBuffer, isBytes, type EncodedPayload, type EventEnvelope } from './event.js';

/** What an encoder learns about the event it encodes. */
export interface EncodeContext {
  /** The Kafka topic (a Schema Registry subject is often `<topic>-value`). */
  readonly topic: string;
  /** The event type, for example `order.created`. */
  readonly type: string;
  /** The Kafka key, or null. */
  readonly key: string | null;
  /** The event id (UUID, lower case). */
  readonly eventId: string;
}

/** What an encoder returns: the bytes, or the bytes and their content type. */
export type EncoderResult = Uint8Array | { value: Uint8Array; contentType?: string };

/**
 * Turns an event's payload into bytes, for example Avro through a Schema Registry
 * (`(payload) => registry.encode(schemaId, payload)`). May be async. Called inside `enqueue()`,
 * before the INSERT, once per event whose payload is not already bytes (`Buffer`/`Uint8Array`
 * payloads are stored as given and never reach the encoder).
 *
 * Return the bytes, or `{ value, contentType }`: a content type other than `application/json` is
 * stored in the event's `content-type` header (unless the event sets one) and is the CloudEvents
 * `datacontenttype`. Throwing fails the whole `enqueue()` call with {@link EventEncodingError}
 * before anything is written.
 */
export type PayloadEncoder = (payload: unknown, event: EncodeContext) => EncoderResult | Promise<EncoderResult>;

/**
 * Runs `encoder` on one event's payload.
 *
 * @throws {@link EventEncodingError} when the encoder throws (its error is the `cause`; an
 *   outboxkit error it throws is passed through as is) or returns something other than bytes or
 *   `{ value: bytes, contentType?: string }`.
 */
export async function encodeWith(
  encoder: PayloadEncoder,
  payload: unknown,
  envelope: EventEnvelope,
): Promise<EncodedPayload> {
  let result: unknown;
  try {
    result = await encoder(payload, {
      topic: envelope.topic,
      type: envelope.type,
      key: envelope.key,
      eventId: envelope.eventId,
    });
  } catch (err) {
    if (isOutboxkitError(err)) throw err;
    throw new EventEncodingError(
      `The outbox's encode hook failed for event ${envelope.eventId} (type ${envelope.type}, topic ${envelope.topic}): ` +
        `${(err as Error)?.message ?? String(err)}. Nothing was written; fix the payload or the encoder and retry.`,
      { cause: err },
    );
  }
  if (isBytes(result)) return { value: asBuffer(result), contentType: null };
  if (typeof result === 'object' && result !== null && isBytes((result as { value?: unknown }).value)) {
    const { value, contentType } = result as { value: Uint8Array; contentType?: unknown };
    if (contentType !== undefined && (typeof contentType !== 'string' || contentType.length === 0)) {
      throw new EventEncodingError(
        `The outbox's encode hook returned a contentType that is not a non-empty string (${JSON.stringify(contentType)}) ` +
          `for event ${envelope.eventId}; return a MIME type such as 'application/avro', or leave it out.`,
      );
    }
    return { value: asBuffer(value), contentType: contentType ?? null };
  }
  throw new EventEncodingError(
    `The outbox's encode hook returned ${describe(result)} for event ${envelope.eventId}; it must return a Buffer or ` +
      'Uint8Array, or { value: Buffer, contentType?: string }.',
  );
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object without a byte value' : typeof value;
}
