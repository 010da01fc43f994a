/**
 * Reads what a chaos run left behind, for the checker: PostgreSQL (orders, outbox, idempotency
 * records, shipments) and Kafka (the topic and its dead-letter topic, read from the beginning up to
 * the high watermarks of the moment).
 */
import { randomBytes } from 'node:crypto';
import type { Kafka, KafkaMessage } from 'kafkajs';
import type pg from 'pg';
import { HEADER_DLQ_REASON } from '../consumer/dead-letter.js';
import { HEADER_EVENT_ID } from '../src/outbox/event.js';
import type { OutboxSource } from '../src/outbox/enqueue.js';
import type { Observed } from './check.js';

/**
 * WAL mode: the run's record of the committed outbox rows. The WAL relay deletes each row once
 * Kafka acknowledged its event, so the table cannot say at the end which events were committed;
 * a trigger copies each row inserted into `outboxkit.outbox_events` to `chaos.committed_events`
 * in the writer's own transaction, so a copy exists exactly when the row committed (a rolled-back
 * transaction or savepoint takes its copy with it). The copy table is in no publication.
 */
export async function recordCommittedEvents(pool: pg.Pool): Promise<void> {
  await pool.query(`
    CREATE SCHEMA IF NOT EXISTS chaos;
    CREATE TABLE IF NOT EXISTS chaos.committed_events AS
      SELECT event_id, aggregate_id, key, topic FROM outboxkit.outbox_events WITH NO DATA;
    CREATE OR REPLACE FUNCTION chaos.copy_committed_event() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO chaos.committed_events (event_id, aggregate_id, key, topic)
        VALUES (NEW.event_id, NEW.aggregate_id, NEW.key, NEW.topic);
      RETURN NULL;
    END $$;
    CREATE OR REPLACE TRIGGER chaos_committed_events AFTER INSERT ON outboxkit.outbox_events
      FOR EACH ROW EXECUTE FUNCTION chaos.copy_committed_event();`);
}

/**
 * The backlog of the drain: outbox rows still to publish, and orders neither shipped nor
 * dead-lettered. In table mode a row is pending until marked published; in WAL mode every row
 * left that is not parked is pending (the WAL relay deletes what Kafka acknowledged, marks nothing).
 */
export async function pipelineBacklog(
  pool: pg.Pool,
  deadLettered: number,
  source: OutboxSource = 'table',
): Promise<{ pending: number; unshipped: number }> {
  const pendingWhere = source === 'wal' ? 'parked_at IS NULL' : 'published_at IS NULL';
  const r = await pool.query<{ pending: string; orders: string; shipments: string }>(
    `SELECT (SELECT count(*) FROM outboxkit.outbox_events WHERE ${pendingWhere}) AS pending,
            (SELECT count(*) FROM orders_demo.orders) AS orders,
            (SELECT count(*) FROM orders_demo.shipments) AS shipments`,
  );
  const row = r.rows[0]!;
  return { pending: Number(row.pending), unshipped: Number(row.orders) - Number(row.shipments) - deadLettered };
}

/**
 * Kafka's side of the drain: the messages in the dead-letter topic, and the shipping group's lag on
 * the topic (messages past its committed offsets, summed over partitions; a partition with no
 * committed offset counts from its low watermark). A lag of 0 means every message, redeliveries
 * included, was handled and its offset committed.
 */
export async function drainProgress(
  kafka: Kafka,
  o: { topic: string; deadLetterTopic: string; groupId: string },
): Promise<{ deadLettered: number; lag: number }> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const deadLettered = (await admin.fetchTopicOffsets(o.deadLetterTopic)).reduce((n, p) => n + Number(p.high), 0);
    const ends = await admin.fetchTopicOffsets(o.topic);
    const [entry] = await admin.fetchOffsets({ groupId: o.groupId, topics: [o.topic] });
    const committed = new Map((entry?.partitions ?? []).map((p) => [p.partition, Number(p.offset)]));
    let lag = 0;
    for (const p of ends) {
      const at = committed.get(p.partition) ?? -1;
      lag += Number(p.high) - (at < 0 ? Number(p.low) : at);
    }
    return { deadLettered, lag };
  } finally {
    await admin.disconnect();
  }
}

/**
 * PostgreSQL's side of a run; `topic`: the orders topic (outbox rows of other topics are checked
 * apart). The committed events are the outbox rows in table mode, their copies in WAL mode
 * ({@link recordCommittedEvents}); the rows left pending are those neither published nor parked.
 */
export async function readDatabase(
  pool: pg.Pool,
  topic: string,
  source: OutboxSource = 'table',
): Promise<Omit<Observed, 'published' | 'deadLetters'>> {
  const orders = await pool.query<{ id: string; tenant: string; cart_id: string; customer_id: string | null }>(
    'SELECT id, tenant, cart_id, customer_id FROM orders_demo.orders',
  );
  const outbox = await pool.query<{ event_id: string; aggregate_id: string; key: string }>(
    `SELECT event_id, aggregate_id, key FROM ${source === 'wal' ? 'chaos.committed_events' : 'outboxkit.outbox_events'} WHERE topic = $1`,
    [topic],
  );
  const left = await pool.query<{ event_id: string; aggregate_id: string }>(
    `SELECT event_id, aggregate_id FROM outboxkit.outbox_events
      WHERE topic = $1 AND published_at IS NULL AND parked_at IS NULL`,
    [topic],
  );
  const stuck = await pool.query<{ tenant: string; key: string; state: string }>(
    `SELECT tenant, key, state FROM outboxkit.idempotency_keys WHERE state IN ('processing', 'uncertain')`,
  );
  const shipments = await pool.query<{
    order_id: string;
    event_id: string;
    applications: number;
    applied_seq: string;
    customer_id: string | null;
    customer_version: number | null;
  }>('SELECT order_id, event_id, applications, applied_seq, customer_id, customer_version FROM orders_demo.shipments');
  return {
    orders: orders.rows.map((o) => ({ id: o.id, tenant: o.tenant, cartId: o.cart_id, customerId: o.customer_id })),
    outbox: outbox.rows.map((e) => ({ eventId: e.event_id, orderId: e.aggregate_id, key: e.key })),
    leftPending: left.rows.map((e) => ({ eventId: e.event_id, orderId: e.aggregate_id })),
    stuckKeys: stuck.rows,
    shipments: shipments.rows.map((s) => ({
      orderId: s.order_id,
      eventId: s.event_id,
      applications: s.applications,
      appliedSeq: Number(s.applied_seq),
      customerId: s.customer_id,
      customerVersion: s.customer_version,
    })),
  };
}

/** Every message of `topic`, read by a throwaway consumer group up to the current high watermarks. */
export async function readTopic(
  kafka: Kafka,
  topic: string,
  timeoutMs = 60_000,
): Promise<{ partition: number; message: KafkaMessage }[]> {
  const admin = kafka.admin();
  await admin.connect();
  let ends: Map<number, bigint>;
  try {
    const offsets = await admin.fetchTopicOffsets(topic);
    ends = new Map(offsets.map((o) => [o.partition, BigInt(o.high)]));
  } finally {
    await admin.disconnect();
  }
  const left = new Set([...ends].filter(([, high]) => high > 0n).map(([p]) => p));
  const out: { partition: number; message: KafkaMessage }[] = [];
  if (left.size === 0) return out;
  const consumer = kafka.consumer({ groupId: `chaos-reader-${randomBytes(4).toString('hex')}` });
  await consumer.connect();
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`reading ${topic} timed out; partitions left: ${[...left].join(', ')}`)),
        timeoutMs,
      );
      void consumer.run({
        autoCommit: false,
        eachMessage: async ({ partition, message }) => {
          const high = ends.get(partition) ?? 0n;
          if (BigInt(message.offset) < high) out.push({ partition, message });
          if (BigInt(message.offset) >= high - 1n) left.delete(partition);
          if (left.size === 0) {
            clearTimeout(timer);
            resolve();
          }
        },
      });
    });
  } finally {
    await consumer.disconnect();
  }
  return out;
}

const header = (m: KafkaMessage, name: string): string | undefined => {
  const v = m.headers?.[name];
  const one = Array.isArray(v) ? v[0] : v;
  return one === undefined ? undefined : one.toString();
};

/** The orders topic as the checker wants it: event id (header), key, order id and version (payload). */
export function toPublished(messages: { partition: number; message: KafkaMessage }[]): Observed['published'] {
  return messages.map(({ partition, message }) => {
    const payload = JSON.parse(message.value?.toString() ?? '{}') as { orderId?: string; customerVersion?: number };
    return {
      partition,
      offset: message.offset,
      eventId: header(message, HEADER_EVENT_ID) ?? '(none)',
      key: message.key?.toString() ?? '',
      orderId: payload.orderId ?? '(none)',
      customerVersion: payload.customerVersion ?? null,
    };
  });
}

/** The event ids (header) of a topic's messages. */
export function toEventIds(messages: { partition: number; message: KafkaMessage }[]): string[] {
  return messages.map(({ message }) => header(message, HEADER_EVENT_ID) ?? '(none)');
}

/** The dead-letter topic: event id, order id and the reason (`dlq-reason`). */
export function toDeadLetters(messages: { partition: number; message: KafkaMessage }[]): Observed['deadLetters'] {
  return messages.map(({ message }) => {
    let orderId: string | undefined;
    try {
      orderId = (JSON.parse(message.value?.toString() ?? '') as { orderId?: string }).orderId;
    } catch {
      orderId = undefined;
    }
    return {
      eventId: header(message, HEADER_EVENT_ID) ?? '(none)',
      orderId,
      reason: header(message, HEADER_DLQ_REASON) ?? '',
    };
  });
}

/**
 * The group's committed offsets on `topic` (partition → next offset to read; -1 when none), or
 * undefined when the broker does not answer within a few seconds (a diagnostic, never a verdict).
 */
export async function committedOffsets(
  kafka: Kafka,
  groupId: string,
  topic: string,
): Promise<Map<number, bigint> | undefined> {
  const admin = kafka.admin();
  try {
    await admin.connect();
    const [entry] = await admin.fetchOffsets({ groupId, topics: [topic] });
    return new Map((entry?.partitions ?? []).map((p) => [p.partition, BigInt(p.offset)]));
  } catch {
    return undefined;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}
