/**
 * The outbox writer: inserts events in the application's own transaction.
 */
import { joinTransaction, type TransactionHandle } from '../database.js';
import { z } from 'zod';
import { InvalidEventError } from '../errors.js';
import { boolean, fn, integer, parseOptions, sentence, SHARED_OPTIONS, value } from '../options.js';
import { DEFAULT_SCHEMA } from '../constants.js';
import { notifyChannel, quoteSchema } from '../schema-name.js';
import { activeContextHeaders } from '../tracing.js';
import { resolveCloudEventsOptions, type CloudEventsOptions } from './cloud-events.js';
import { encodeWith, type PayloadEncoder } from './encoding.js';
import {
  deleteEventsSql,
  ENQUEUE_SAVEPOINT,
  insertEventsSql,
  MAX_EVENTS_PER_INSERT,
  verifyInTransactionSql,
} from './sql.js';
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

/**
 * How the relay finds the events a writer writes (docs/wal-source.md):
 * - `'table'`: the relay polls `outbox_events` (woken by `NOTIFY`), so the writer row-locks each
 *   key in `outbox_key_locks` to keep per-key commit order;
 * - `'wal'`: the relay reads the table's inserts from a logical replication slot through a
 *   publication (`migrate({ walPublication: true })`), which hands over transactions in commit
 *   order, so the writer takes no key lock and sends no `NOTIFY`.
 */
export type OutboxSource = 'table' | 'wal';

/** The values of {@link OutboxSource}. */
export const OUTBOX_SOURCES = ['table', 'wal'] as const satisfies readonly OutboxSource[];

/** Options of {@link createOutbox}. */
export interface OutboxOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /**
   * Which relay reads the events: `'table'` (the polling relay) or `'wal'` (a relay reading a
   * logical replication slot, docs/wal-source.md). Both write the same row, with the same
   * validation and errors, into `<schema>.outbox_events`, which stays the durable copy of each event
   * until it is published. With `'wal'`:
   * - no per-key lock: `outbox_key_locks` is not touched, writers of one key never wait for each
   *   other and never deadlock on the writer's account, and a bulk transaction is bounded only by
   *   PostgreSQL (per-key order is the commit order the slot delivers);
   * - no `NOTIFY` (the slot streams each commit; `notify: true` is refused with this source);
   * - events are inserted in the order given (the table source sorts a call's events by key,
   *   keeping the given order within a key);
   * - the database needs `wal_level = logical` and the publication: run `migrate` with
   *   `walPublication` once. The replication slot is the WAL relay's, which creates it.
   *
   * A table relay does not keep per-key order for events written with `'wal'`: switch a running
   * system between the sources in the order of docs/runbooks.md, "Switching between table mode and
   * WAL mode".
   * @defaultValue 'table'
   */
  source?: OutboxSource;
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
   * PostgreSQL folds identical notifications of one transaction into one. Only with
   * `source: 'table'`: `notify: true` with `source: 'wal'` throws {@link InvalidOptionsError}.
   * @defaultValue true with `source: 'table'`, false with `source: 'wal'`
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
   * Per-key order: each distinct key's row in `outbox_key_locks` is row-locked (created on the key's
   * first event) before the events' sequence values are drawn, and stays locked until the
   * transaction ends, so events of one key take their positions in the order their transactions
   * commit (docs/guarantees.md, G3). Keys are locked in sorted order within a call; two
   * transactions that enqueue the same keys in opposite orders across *separate* calls can still
   * deadlock (PostgreSQL then aborts one with SQLSTATE 40P01, and it can be retried). Transactions
   * with disjoint keys never wait for each other. With `source: 'wal'` nothing is locked: the
   * replication slot hands the relay whole transactions in commit order, which is the per-key
   * order; events are inserted in the order given, with no `NOTIFY`, and a transaction may hold
   * as many events as PostgreSQL takes (100,000 distinct keys tested, test/wal/writer.test.ts).
   *
   * Bulk transactions: row locks take no entry in PostgreSQL's shared lock table, so one
   * transaction may enqueue any number of distinct keys (tested with 100,000 under the default
   * `max_locks_per_transaction` 64); a call takes `ENQUEUE_LOCK_TABLE_ENTRIES` (15) lock-table
   * entries at most, whatever its size. Events are written in statements of at most
   * {@link MAX_EVENTS_PER_INSERT} events. Under REPEATABLE READ or SERIALIZABLE, a transaction
   * whose snapshot is older than another writer's *first* event of a key it also enqueues fails
   * with SQLSTATE 40001 (serialization failure): retry it, as those isolation levels require.
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
  /** The LISTEN/NOTIFY channel relays listen on (notified only with `notify`, never with `source: 'wal'`). */
  readonly channel: string;
  /** Which relay reads these events ({@link OutboxOptions.source}). */
  readonly source: OutboxSource;
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

/** Default options of {@link createOutbox} (`notify` is the table source's; the WAL source's is false). */
export const OUTBOX_DEFAULTS = Object.freeze({
  schema: DEFAULT_SCHEMA,
  source: 'table' as OutboxSource,
  maxPayloadBytes: 1_000_000,
  maxHeaderBytes: 16_384,
  notify: true,
  traceContext: true,
});

/**
 * The writer's options, declared once. The byte limits stop at the largest value PostgreSQL stores
 * in one field (1 GB); Kafka's own limits are far below.
 */
const outboxOptionsSchema = z
  .strictObject({
    schema: SHARED_OPTIONS.schema,
    source: z
      .enum(OUTBOX_SOURCES, { error: `must be ${OUTBOX_SOURCES.map((s) => `'${s}'`).join(' or ')}` })
      .default(OUTBOX_DEFAULTS.source),
    maxPayloadBytes: integer(1, MAX_FIELD_BYTES).default(OUTBOX_DEFAULTS.maxPayloadBytes),
    maxHeaderBytes: integer(1, MAX_FIELD_BYTES).default(OUTBOX_DEFAULTS.maxHeaderBytes),
    // Its default depends on `source` (resolved in createOutbox()).
    notify: boolean().optional(),
    encode: fn<PayloadEncoder>('(payload, event) => bytes | { value, contentType }').optional(),
    cloudEvents: value<CloudEventsOptions>(
      'an object { source }',
      (v) => typeof v === 'object' && v !== null,
    ).optional(),
    traceContext: boolean().default(OUTBOX_DEFAULTS.traceContext),
  } satisfies Record<keyof OutboxOptions, z.ZodType>)
  .superRefine((o, ctx) => {
    // A WAL relay is woken by the slot's stream, not by NOTIFY: a NOTIFY would cost every writer a
    // serialising commit step for nothing (docs/wal-source.md, "The writer").
    if (o.source === 'wal' && o.notify === true) {
      ctx.addIssue(
        sentence(
          "notify: true cannot be combined with source: 'wal' (a WAL relay reads the replication slot, not NOTIFY); " +
            'drop notify, or use the table source.',
        ),
      );
    }
  });

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
  const wal = resolved.source === 'wal';
  // The WAL source locks no key: the slot's commit order is the per-key order.
  const keyLocks = wal ? null : `${quoteSchema(resolved.schema)}.outbox_key_locks`;
  const notify = resolved.notify ?? !wal;
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
    source: resolved.source,
    async enqueue(tx, input) {
      const list = Array.isArray(input) ? (input as readonly OutboxEventInput[]) : [input as OutboxEventInput];
      if (list.length === 0) return [];
      // Validate and encode everything before touching the database: an invalid event writes nothing.
      const prepared = await prepareAll(list);
      const ids = new Set(prepared.map((e) => e.eventId));
      if (ids.size !== prepared.length)
        throw new InvalidEventError('Two events of one enqueue() call have the same eventId.');
      const db = joinTransaction(tx, 'enqueue()', { verifyInTransaction });
      // Lock keys in one global order (stable sort keeps the given order within a key). The WAL
      // source locks nothing, so it inserts in the given order, which the slot then streams.
      const ordered = wal ? prepared : [...prepared].sort((a, b) => compareKeys(a.key, b.key));
      // Only a caller's eventId can exist already (a generated UUIDv7 is new), and a call of one
      // event that is skipped wrote nothing: only the WAL source's calls of several events with
      // an explicit id need the savepoint (ENQUEUE_SAVEPOINT says why), so the common call pays
      // no extra round trip.
      const idsGiven = list.some((e) => e.eventId !== undefined);
      const savepoint = wal && list.length > 1 && idsGiven;
      if (savepoint) await db.query(ENQUEUE_SAVEPOINT.begin);
      const seqById = new Map<string, string>();
      for (let i = 0; i < ordered.length; i += MAX_EVENTS_PER_INSERT) {
        const chunk = ordered.slice(i, i + MAX_EVENTS_PER_INSERT);
        const last = i + MAX_EVENTS_PER_INSERT >= ordered.length;
        const insert = insertEventsSql(table, keyLocks, chunk, notify && last ? channel : null, idsGiven);
        const { rows } = await db.query<{ event_id: string; seq: string }>(insert.text, insert.values, {
          name: insert.name,
        });
        for (const r of rows) seqById.set(r.event_id, r.seq);
      }
      // An event id that already exists was skipped by ON CONFLICT (the caller's transaction stays
      // usable). The call writes all or nothing: its other rows, still visible to this transaction
      // only, are deleted again before the error.
      const skipped = prepared.filter((e) => !seqById.has(e.eventId)).map((e) => e.eventId);
      if (savepoint) await db.query(skipped.length > 0 ? ENQUEUE_SAVEPOINT.undo : ENQUEUE_SAVEPOINT.release);
      if (skipped.length > 0) {
        if (seqById.size > 0 && !savepoint) {
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
