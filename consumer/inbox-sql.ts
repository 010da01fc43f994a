/**
 * The consumer's SQL: one named function per statement, run inside the handler's transaction.
 */
import pg from 'pg';
import type { Queryable } from '../src/database.js';

/** The inbox row that records that a consumer group applied an event. */
export interface InboxRow {
  groupId: string;
  eventId: string;
  topic: string;
  partition: number;
  offset: string;
}

/**
 * Bounds every lock wait of the rest of the transaction (the inbox insert and the handler's own
 * statements) to `lockTimeoutMs`; 0 means no bound. `set_config(..., true)` is `SET LOCAL` with a
 * bind parameter: the setting ends with the transaction and never leaks into the pooled session.
 */
export async function setTransactionLockTimeout(q: Queryable, lockTimeoutMs: number): Promise<void> {
  await q.query(`SELECT set_config('lock_timeout', $1, true)`, [`${lockTimeoutMs}ms`]);
}

/**
 * Claims (group, event id) in the inbox. One atomic statement: a check-then-insert would let two
 * deliveries of one event both see "absent". A concurrent delivery of the same event whose
 * transaction is still open holds the primary key: this insert waits for it (bounded by the lock
 * timeout), then does nothing if that transaction committed, or inserts if it rolled back.
 * `ON CONFLICT DO NOTHING` also makes a second delivery inside one batch a plain skip (case C15),
 * never a "cannot affect row a second time" error.
 *
 * @param schemaSql - the quoted schema name (`quoteSchema()`).
 * @returns true when this transaction inserted the row (the event is new for the group).
 */
export async function claimInboxRow(q: Queryable, schemaSql: string, row: InboxRow): Promise<boolean> {
  const result = await q.query(
    `INSERT INTO ${schemaSql}.inbox (consumer_group, event_id, topic, partition, "offset")
     VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (consumer_group, event_id) DO NOTHING
     RETURNING 1 AS claimed`,
    [row.groupId, row.eventId, row.topic, row.partition, row.offset],
  );
  return result.rowCount === 1;
}

/** Where and when a consumer group applied an event, as its inbox row records it. */
export interface InboxEntry {
  topic: string;
  partition: number;
  /** Decimal string. */
  offset: string;
  processedAt: Date;
}

/**
 * The inbox row of (group, event id), read after the claim found it taken, to tell a redelivery of
 * the message that was applied (same topic, partition and offset) from another message with the
 * same event id. Runs only for duplicates, in their transaction; a statement of its own, so that
 * under READ COMMITTED it sees a row a concurrent delivery committed while the claim waited on it
 * (the claim's own snapshot does not).
 *
 * @param schemaSql - the quoted schema name (`quoteSchema()`).
 * @returns the row, or null when it cannot be seen (deleted meanwhile, or a REPEATABLE READ
 *   snapshot taken before it committed).
 */
export async function readInboxEntry(
  q: Queryable,
  schemaSql: string,
  groupId: string,
  eventId: string,
): Promise<InboxEntry | null> {
  // The time as epoch ms: drizzle's node-postgres driver returns timestamps as text.
  const { rows } = await q.query<{ topic: string; partition: number; offset: string; processed_ms: number }>(
    `SELECT topic, partition, "offset"::text AS "offset",
            (extract(epoch FROM processed_at) * 1000)::float8 AS processed_ms
       FROM ${schemaSql}.inbox WHERE consumer_group = $1 AND event_id = $2`,
    [groupId, eventId],
  );
  const row = rows[0];
  if (row === undefined) return null;
  return { topic: row.topic, partition: row.partition, offset: row.offset, processedAt: new Date(row.processed_ms) };
}

/** A UUID as `readEventId()` returns it (lower case); anything else never reaches inlined SQL. */
export const UUID_TEXT = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** A Kafka offset as kafkajs gives it: the decimal text of a non-negative int64. */
const OFFSET_TEXT = /^[0-9]{1,19}$/;

/**
 * Builds the text of {@link claimInboxRow} with every value inlined, so that it can travel in one
 * simple-protocol query string together with `BEGIN` (or `SAVEPOINT`): one round trip instead of
 * two. The simple query protocol takes no bind parameters, so the values are inlined here and
 * only here: the group and the topic through `pg.escapeLiteral` (quoted once per consumer and per
 * topic), the event id, partition and offset only after they match their strict shapes.
 *
 * @param schemaSql - the quoted schema name (`quoteSchema()`).
 * @param groupId - the consumer group, any text.
 * @returns a function of one row (its `groupId` is ignored: fixed here) to the statement text.
 * @throws {Error} from the returned function when the event id is not a lower-case UUID, the
 *   partition not a non-negative integer or the offset not a non-negative int64 in decimal (the
 *   consumer validates them first; this is the last guard before SQL).
 */
export function inboxClaimText(schemaSql: string, groupId: string): (row: InboxRow) => string {
  const head = `INSERT INTO ${schemaSql}.inbox (consumer_group, event_id, topic, partition, "offset") VALUES (${pg.escapeLiteral(groupId)}, '`;
  const topics = new Map<string, string>();
  return (row) => {
    if (!UUID_TEXT.test(row.eventId) || !Number.isSafeInteger(row.partition) || row.partition < 0) {
      throw new Error(
        `Refusing to inline an inbox row with event id ${JSON.stringify(row.eventId)}, partition ${row.partition}.`,
      );
    }
    if (!OFFSET_TEXT.test(row.offset)) throw new Error(`Refusing to inline the offset ${JSON.stringify(row.offset)}.`);
    let topic = topics.get(row.topic);
    if (topic === undefined) {
      topic = pg.escapeLiteral(row.topic);
      topics.set(row.topic, topic);
    }
    return (
      `${head}${row.eventId}', ${topic}, ${row.partition}, ${row.offset}) ` +
      'ON CONFLICT (consumer_group, event_id) DO NOTHING RETURNING 1 AS claimed'
    );
  };
}

/**
 * Whether the claim (the last statement of a simple-protocol query string) inserted its row: an
 * `INSERT` of one row, or the one-row `SELECT ... AS claimed` of the claim that also writes the
 * partition's progress (`claimWithProgressText()` in progress.ts).
 */
export function claimedByLast(results: pg.QueryResult | pg.QueryResult[]): boolean {
  const last = Array.isArray(results) ? results[results.length - 1] : results;
  if (last?.command === 'SELECT') return Number((last.rows[0] as { claimed?: unknown } | undefined)?.claimed) === 1;
  return last?.command === 'INSERT' && last.rowCount === 1;
}

/**
 * Proves that the transaction still works after the handler returned. A handler that caught a
 * failed statement and carried on leaves the transaction aborted, and PostgreSQL answers COMMIT
 * of an aborted transaction with a silent ROLLBACK: the consumer would then acknowledge an event
 * whose effects and inbox row were discarded. This statement fails (SQLSTATE 25P02) instead.
 */
export async function assertTransactionUsable(q: Queryable): Promise<void> {
  await q.query('SELECT 1');
}

/** Fails unless the inbox table exists in the schema and the database answers. */
export async function probeInbox(q: Queryable, schemaSql: string): Promise<void> {
  await q.query(`SELECT 1 FROM ${schemaSql}.inbox LIMIT 0`);
}

/**
 * Deletes inbox rows processed more than `retentionMs` ago, at most `batchSize` of them (bounded
 * lock time and WAL per statement), oldest first through `inbox_processed_idx`. `SKIP LOCKED`
 * lets two cleanups run at once without waiting on each other's rows.
 *
 * @param consumerGroup - only this group's rows, or every group's when null.
 * @returns how many rows were deleted.
 */
export async function deleteExpiredInboxRows(
  q: Queryable,
  schemaSql: string,
  retentionMs: number,
  batchSize: number,
  consumerGroup: string | null,
): Promise<number> {
  const { rowCount } = await q.query(
    `DELETE FROM ${schemaSql}.inbox WHERE (consumer_group, event_id) IN (
       SELECT consumer_group, event_id FROM ${schemaSql}.inbox
        WHERE processed_at < now() - make_interval(secs => $1::double precision / 1000)
          AND ($3::text IS NULL OR consumer_group = $3::text)
        ORDER BY processed_at LIMIT $2
        FOR UPDATE SKIP LOCKED)`,
    [retentionMs, batchSize, consumerGroup],
  );
  return rowCount;
}
