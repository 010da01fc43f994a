/**
 * The outbox writer's SQL, one builder per statement, each returning `{ text, values }` (and the
 * prepared statement's `name` where it pays): the home of `outbox_events` writes. `table` is the
 * quoted table (`"outboxkit".outbox_events`, from `quoteSchema()`).
 */
import { statementName, type SqlStatement } from '../postgres.js';
import type { PreparedEvent } from './event.js';

/** Parameters of one event in the INSERT. */
const COLUMNS = 9;
/** Most events in one INSERT: PostgreSQL allows 65,535 parameters per statement. */
export const MAX_EVENTS_PER_INSERT = Math.floor(65_535 / COLUMNS);
/** Inserts of at most this many events use a prepared statement (the common case: parsed once per connection). */
const MAX_PREPARED_EVENTS = 8;

/**
 * Inserts `events` (at most {@link MAX_EVENTS_PER_INSERT}), returning `event_id` and `seq` of each
 * row written; an `event_id` that exists already is skipped (`ON CONFLICT DO NOTHING`, so the
 * caller's transaction stays usable and the caller can tell which were skipped). With `channel`,
 * the same statement sends `NOTIFY channel` (folded by PostgreSQL into one per transaction).
 *
 * Concurrency: the advisory lock sits in the WHERE clause of the SELECT that feeds the INSERT, so
 * for each row it is taken before the identity default (seq) of that row is evaluated. A second
 * writer of the same key blocks here until the first commits, and so draws a larger seq: seq
 * order is commit order per key (docs/guarantees.md, G3). A NULL key has no order to keep and
 * takes no lock. The caller sorts events by key, so that writers lock keys in one global order.
 */
export function insertEventsSql(table: string, events: readonly PreparedEvent[], channel: string | null): SqlStatement {
  const rows: string[] = [];
  const values: unknown[] = [];
  for (const [r, e] of events.entries()) {
    const b = r * COLUMNS;
    rows.push(
      `($${b + 1}::uuid, $${b + 2}::text, $${b + 3}::text, $${b + 4}::smallint, $${b + 5}::text, $${b + 6}::bytea, $${b + 7}::jsonb, $${b + 8}::text, $${b + 9}::text)`,
    );
    values.push(
      e.eventId,
      e.topic,
      e.key,
      e.lane,
      e.type,
      e.payload,
      JSON.stringify(e.headers),
      e.aggregateType,
      e.aggregateId,
    );
  }
  const insert = `INSERT INTO ${table} (event_id, topic, key, lane, type, payload, headers, aggregate_type, aggregate_id)
    SELECT v.* FROM (VALUES ${rows.join(', ')}) AS v(event_id, topic, key, lane, type, payload, headers, aggregate_type, aggregate_id)
    WHERE v.key IS NULL OR pg_advisory_xact_lock(hashtextextended(v.key, 7)) IS NOT NULL
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id, seq::text AS seq`;
  const text =
    channel === null
      ? insert
      : `WITH ins AS (${insert}), wake AS (SELECT pg_notify('${channel}', '')) SELECT ins.event_id, ins.seq FROM ins, wake`;
  return events.length <= MAX_PREPARED_EVENTS
    ? { text, values, name: statementName('enqueue', text) }
    : { text, values };
}

/**
 * Deletes the rows `seqs` that this transaction inserted, so that a call whose event id existed
 * already writes nothing (its rows are visible to this transaction only).
 */
export function deleteEventsSql(table: string, seqs: readonly string[]): SqlStatement {
  return { text: `DELETE FROM ${table} WHERE seq = ANY($1::bigint[])`, values: [seqs] };
}

/**
 * For a handle that cannot tell its transaction status (node-postgres before 8.21, drizzle over
 * postgres-js): refused outside a transaction block (SQLSTATE 25P01); inside one, the very lock
 * the INSERT takes next (ROW EXCLUSIVE: no other conflict, and no privilege beyond the INSERT's).
 */
export function verifyInTransactionSql(table: string): string {
  return `LOCK TABLE ${table} IN ROW EXCLUSIVE MODE`;
}
