/**
 * The outbox writer: inserts events in the application's own transaction.
 */
import { joinTransaction, type TransactionHandle } from '../database.js';
import { z } from 'zod';
import { InvalidEventError } from '../errors.js';
import { boolean, fn, integer, parseOptions, SHARED_OPTIONS, value } from '../options.js';
import { DEFAULT_SCHEMA } from '../constants.js';
import { notifyChannel, quoteSchema } from '../schema-name.js';
import { activeContextHeaders } from '../tracing.js';
import { resolveCloudEventsOptions, type CloudEventsOptions } from './cloud-events.js';
import { encodeWith, type PayloadEncoder } from './encoding.js';
import { deleteEventsSql, insertEventsSql, MAX_EVENTS_PER_INSERT, verifyInTransactionSql } from './sql.js';
import {
  completeEvent,
  encodeDefault,
  HEADER_EVENT_ID,
  HEADER_EVENT_TYPE,
  isBytes,
  prepareEnvelope,
  prepareEvent,
  type OutboxEventInput,
  type PrepareEventOptions,
  type PreparedEvent,
} from './event.js';

/** Options of {@link createOutbox}. */
export interface OutboxOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /**
   * Largest payload accepted, in bytes. Keep it below the topic's `max.message.bytes` (Kafka's
   * default is 1,048,588 bytes) minus headers. @defaultValue 1_000_000
   */
  maxPayloadBytes?: number;
  /**
   * Largest total of an event's header names and values, in UTF-8 bytes, counting every header the
   * record will carry: the given ones, `content-type`, the CloudEvents and trace-context headers,
   * and the `event-id` and `event-type` headers the relay adds. With the defaults, payload (1,000,000)
   * + headers (16,384) + key (at most 4,096) stay below Kafka's default `max.message.bytes`
   * (1,048,588), so a valid event always fits a default topic. @defaultValue 16_384
   */
  maxHeaderBytes?: number;
  /**
   * Send `NOTIFY` on the schema's channel so relays wake at once instead of at their next poll.
   * PostgreSQL folds identical notifications of one transaction into one. @defaultValue true
   */
  notify?: boolean;
  /**
   * Serialisation hook: turns each payload that is not already bytes into bytes, inside
   * `enqueue()` and before the INSERT (async allowed, for example a Schema Registry's
   * `registry.encode(schemaId, payload)`). A failure throws {@link EventEncodingError} and writes
   * nothing. See {@link PayloadEncoder}. @defaultValue JSON (`JSON.stringify`, UTF-8)
   */
  encode?: PayloadEncoder;
  /**
   * Adds CloudEvents 1.0 attributes as Kafka headers in binary content mode (`ce_specversion`,
   * `ce_id`, `ce_source`, `ce_type`, `ce_time`, `ce_subject`, `content-type`), stored with the
   * event and published by the relay as is. See docs/events.md for the mapping.
   * @defaultValue off
   */
  cloudEvents?: CloudEventsOptions;
  /**
   * Stores the active OpenTelemetry context (W3C `traceparent`, `tracestate`, through the global
   * propagator) in each event's headers, so the relay carries it to Kafka and the dedup consumer
   * continues the trace. Needs the optional peer `@opentelemetry/api`; without it, or without an
   * active span, nothing is added. @defaultValue true
   */
  traceContext?: boolean;
}

/** An event as written: its durable id and its position. */
export interface EnqueuedEvent {
  eventId: string;
  /** The row's sequence value, as a decimal string (a bigint that may exceed 2^53). */
  seq: string;
  topic: string;
  key: string | null;
}

/** The outbox writer of one schema. */
export interface Outbox {
  /**
   * Writes events to the outbox inside the caller's transaction.
   *
   * Per-key order: for each distinct key, a transaction-scoped advisory lock is taken before the
   * row's sequence value is drawn, so events of one key take their positions in the order their
   * transactions commit (docs/guarantees.md, G3). Keys are locked in sorted order within a call; two
   * transactions that enqueue the same keys in opposite orders across *separate* calls can still
   * deadlock (PostgreSQL then aborts one with SQLSTATE 40P01, and it can be retried).
   *
   * @param tx - a `pg` client inside BEGIN, or a drizzle transaction (never a pool or the
   *   top-level db).
   * @param events - one event or several.
   * @returns the written events, with their event ids, in the order given.
   * @throws {@link NotInTransactionError} when `tx` is not a live transaction (test/outbox/enqueue.test.ts, "phantom events").
   * @throws {@link EventEncodingError} when the `encode` hook fails for an event (nothing is written).
   * @throws {@link InvalidEventError} when an event is invalid (payload over `maxPayloadBytes`,
   *   headers over `maxHeaderBytes`, ...), or when an `eventId` already exists in the outbox.
   *   Nothing of the call is written then, and the transaction stays usable.
   * @throws {@link SchemaMissingError} when outboxkit's tables do not exist (run `outboxkit migrate`).
   */
  enqueue(tx: TransactionHandle, events: OutboxEventInput | readonly OutboxEventInput[]): Promise<EnqueuedEvent[]>;
  /** The LISTEN/NOTIFY channel relays listen on. */
  readonly channel: string;
}

/** The largest value PostgreSQL stores in one field (1 GB), in bytes: the upper bound of the byte limits. */
const MAX_FIELD_BYTES = 1_073_741_823;

/**
 * The bytes of the headers the relay publishes with the event (the stored ones, `event-id` and
 * `event-type`); throws {@link InvalidEventError} over `maxHeaderBytes`.
 */
function checkHeaderBytes(e: PreparedEvent, maxHeaderBytes: number): void {
  let bytes =
    Buffer.byteLength(HEADER_EVENT_ID) +
    e.eventId.length +
    Buffer.byteLength(HEADER_EVENT_TYPE) +
    Buffer.byteLength(e.type);
  for (const [name, value] of Object.entries(e.headers)) bytes += Buffer.byteLength(name) + Buffer.byteLength(value);
  if (bytes > maxHeaderBytes) {
    throw new InvalidEventError(
      `Event headers are ${bytes} bytes (names and values, with the relay's event-id and event-type), over the limit of ` +
        `${maxHeaderBytes} bytes; a Kafka record must fit the topic's max.message.bytes. Move large values into the ` +
        'payload, or raise maxHeaderBytes (and the topic limit).',
    );
  }
}

/** Default options of {@link createOutbox}. */
export const OUTBOX_DEFAULTS = Object.freeze({
  schema: DEFAULT_SCHEMA,
  maxPayloadBytes: 1_000_000,
  maxHeaderBytes: 16_384,
  notify: true,
  traceContext: true,
});

/**
 * The writer's options, declared once. The byte limits stop at the largest value PostgreSQL stores
 * in one field (1 GB); Kafka's own limits are far below.
 */
const outboxOptionsSchema = z.strictObject({
  schema: SHARED_OPTIONS.schema,
  maxPayloadBytes: integer(1, MAX_FIELD_BYTES).default(OUTBOX_DEFAULTS.maxPayloadBytes),
  maxHeaderBytes: integer(1, MAX_FIELD_BYTES).default(OUTBOX_DEFAULTS.maxHeaderBytes),
  notify: boolean().default(OUTBOX_DEFAULTS.notify),
  encode: fn<PayloadEncoder>('(payload, event) => bytes | { value, contentType }').optional(),
  cloudEvents: value<CloudEventsOptions>('an object { source }', (v) => typeof v === 'object' && v !== null).optional(),
  traceContext: boolean().default(OUTBOX_DEFAULTS.traceContext),
} satisfies Record<keyof OutboxOptions, z.ZodType>);

export { notifyChannel };

/** Orders keys by UTF-16 code units (a total order every writer shares); null keys first. */
function compareKeys(a: string | null, b: string | null): number {
  const x = a ?? '';
  const y = b ?? '';
  return x < y ? -1 : x > y ? 1 : 0;
}

/**
 * Creates the outbox writer of one schema.
 *
 * @throws {@link InvalidOptionsError} on an invalid schema name or limit.
 */
export function createOutbox(options: OutboxOptions = {}): Outbox {
  const resolved = parseOptions(outboxOptionsSchema, options ?? {}, 'createOutbox');
  const table = `${quoteSchema(resolved.schema)}.outbox_events`;
  const encoder = resolved.encode;
  const cloudEvents = resolveCloudEventsOptions(resolved.cloudEvents);
  const channel = notifyChannel(resolved.schema);
  const verifyInTransaction = verifyInTransactionSql(table);
  const { maxPayloadBytes, maxHeaderBytes } = resolved;
  const traceContext = resolved.traceContext;

  /** Validates and encodes every event of a call; throws before anything is written. */
  async function prepareAll(list: readonly OutboxEventInput[]): Promise<PreparedEvent[]> {
    const options: PrepareEventOptions =
      cloudEvents === undefined ? {} : { cloudEvents, time: new Date().toISOString() };
    let prepared: PreparedEvent[];
    if (encoder === undefined) {
      prepared = list.map((e) => prepareEvent(e, maxPayloadBytes, options));
    } else {
      // Every envelope is checked before the first encoder call: an invalid event never reaches
      // the encoder (a Schema Registry encoder may register schemas or call the network).
      const envelopes = list.map((e) => prepareEnvelope(e));
      const encoded = await Promise.all(
        list.map((e, i) =>
          isBytes(e.payload) ? encodeDefault(e.payload) : encodeWith(encoder, e.payload, envelopes[i]!),
        ),
      );
      prepared = envelopes.map((envelope, i) => completeEvent(envelope, encoded[i]!, maxPayloadBytes, options));
    }
    const trace = traceContext ? activeContextHeaders() : undefined;
    if (trace !== undefined) {
      for (const e of prepared) {
        for (const name of Object.keys(trace)) if (!Object.hasOwn(e.headers, name)) e.headers[name] = trace[name]!;
      }
    }
    for (const e of prepared) checkHeaderBytes(e, maxHeaderBytes);
    return prepared;
  }

  return {
    channel,
    async enqueue(tx, input) {
      const list = Array.isArray(input) ? (input as readonly OutboxEventInput[]) : [input as OutboxEventInput];
      if (list.length === 0) return [];
      // Validate and encode everything before touching the database: an invalid event writes nothing.
      const prepared = await prepareAll(list);
      const ids = new Set(prepared.map((e) => e.eventId));
      if (ids.size !== prepared.length)
        throw new InvalidEventError('Two events of one enqueue() call have the same eventId.');
      const db = joinTransaction(tx, 'enqueue()', { verifyInTransaction });
      // Lock keys in one global order (stable sort keeps the given order within a key).
      const ordered = [...prepared].sort((a, b) => compareKeys(a.key, b.key));
      const seqById = new Map<string, string>();
      for (let i = 0; i < ordered.length; i += MAX_EVENTS_PER_INSERT) {
        const chunk = ordered.slice(i, i + MAX_EVENTS_PER_INSERT);
        const last = i + MAX_EVENTS_PER_INSERT >= ordered.length;
        const insert = insertEventsSql(table, chunk, resolved.notify && last ? channel : null);
        const { rows } = await db.query<{ event_id: string; seq: string }>(insert.text, insert.values, {
          name: insert.name,
        });
        for (const r of rows) seqById.set(r.event_id, r.seq);
      }
      // An event id that already exists was skipped by ON CONFLICT (the caller's transaction stays
      // usable). The call writes all or nothing: its other rows, still visible to this transaction
      // only, are deleted again before the error.
      const skipped = prepared.filter((e) => !seqById.has(e.eventId)).map((e) => e.eventId);
      if (skipped.length > 0) {
        if (seqById.size > 0) {
          const undo = deleteEventsSql(table, [...seqById.values()]);
          await db.query(undo.text, undo.values);
        }
        throw new InvalidEventError(
          `Event id ${skipped.join(', ')} already exists in the outbox; give each event a new id (or omit eventId). ` +
            'Nothing of this call was written.',
        );
      }
      return prepared.map((e) => ({
        eventId: e.eventId,
        seq: seqById.get(e.eventId) ?? '',
        topic: e.topic,
        key: e.key,
      }));
    },
  };
}

const defaultOutbox = createOutbox();

/**
 * Writes events to the default outbox (schema `outboxkit`) inside the caller's transaction.
 * See {@link Outbox.enqueue}; use {@link createOutbox} for another schema or limits.
 */
export function enqueue(
  tx: TransactionHandle,
  events: OutboxEventInput | readonly OutboxEventInput[],
): Promise<EnqueuedEvent[]> {
  return defaultOutbox.enqueue(tx, events);
}
