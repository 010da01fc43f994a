/**
 * The outbox writer's SQL, one builder per statement, each returning `{ text, values }` (and the
 * prepared statement's `name` where it pays): the home of `outbox_events` writes. `table` is the
 * quoted table (`"outboxkit".outbox_events`, from `quoteSchema()`).
 */
import { KEY_LOCK_HASH_SEED } from '../constants.js';
import { statementName, type SqlStatement } from '../postgres.js';
import type { PreparedEvent } from './event.js';

/** Parameters of one event in the INSERT. */
const COLUMNS = 9;
/** Most events in one INSERT: PostgreSQL allows 65,535 parameters per statement (one more holds the keys). */
export const MAX_EVENTS_PER_INSERT = Math.floor((65_535 - 1) / COLUMNS);
/** Inserts of at most this many events use a prepared statement (the common case: parsed once per connection). */
const MAX_PREPARED_EVENTS = 8;

/**
 * Inserts `events` (at most {@link MAX_EVENTS_PER_INSERT}), returning `event_id` and `seq` of each
 * row written. With `idsGiven` (some event's id came from the caller) an `event_id` that exists
 * already is skipped (`ON CONFLICT DO NOTHING`, so the caller's transaction stays usable and the
 * caller can tell which were skipped); without it every id is a new UUIDv7 that no row can have,
 * and the plain INSERT spares the server the speculative insertion ON CONFLICT needs. With `channel`,
 * the same statement sends `NOTIFY channel` (folded by PostgreSQL into one per transaction).
 *
 * Concurrency: the statement first row-locks each distinct key's row in `keyLocks` (inserting it
 * when the key is new), in the order the events are given, and draws no `seq` before every lock
 * is held: the INSERT's WHERE clause is a one-time filter over the locking CTE, evaluated before
 * the first row is produced. A second writer of the same key blocks until the first commits, and
 * so draws a larger seq: seq order is commit order per key (docs/guarantees.md, G3). A NULL key
 * has no order to keep and takes no lock. The caller sorts events by key, so that writers lock
 * keys in one global order.
 *
 * Row locks live in the rows (their xmax), not in PostgreSQL's shared lock table: a statement takes
 * the same few relation locks whatever its number of keys (docs/guarantees.md, "Bulk
 * transactions"). Distinct keys with equal hashes share a row (grouped here, so the statement
 * never touches a row twice): they only wait for each other.
 *
 * With `keyLocks` null (the WAL source, `createOutbox({ source: 'wal' })`) the statement is the
 * plain INSERT: no key is locked, because the relay reads the rows from a logical replication
 * slot, which hands over whole transactions in commit order, so two writers of one key need not
 * wait for each other (docs/wal-source.md, fact 1). `seq` then orders nothing across
 * transactions.
 */
export function insertEventsSql(
  table: string,
  keyLocks: string | null,
  events: readonly PreparedEvent[],
  channel: string | null,
  idsGiven = true,
): SqlStatement {
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
  // Distinct keys in the order given (the caller's sort order). One key (the common call) is
  // locked by a single-row INSERT; several by one array parameter, grouped by hash (two keys of one
  // hash share a row, which one statement must not touch twice) in their first position's order.
  const keys = keyLocks === null ? [] : [...new Set(events.flatMap((e) => (e.key === null ? [] : [e.key])))];
  let source: string | null = null;
  if (keys.length === 1) {
    values.push(keys[0]);
    source = `VALUES (hashtextextended($${values.length}::text, ${KEY_LOCK_HASH_SEED}))`;
  } else if (keys.length > 1) {
    values.push(keys);
    source = `SELECT h FROM (
        SELECT hashtextextended(u.k, ${KEY_LOCK_HASH_SEED}) AS h, min(u.o) AS o
          FROM unnest($${values.length}::text[]) WITH ORDINALITY AS u(k, o) GROUP BY 1) AS s
       ORDER BY o`;
  }
  const insert = `INSERT INTO ${table} (event_id, topic, key, lane, type, payload, headers, aggregate_type, aggregate_id)
    SELECT v.* FROM (VALUES ${rows.join(', ')}) AS v(event_id, topic, key, lane, type, payload, headers, aggregate_type, aggregate_id)
    ${source === null ? '' : 'WHERE (SELECT count(*) FROM locked) >= 0'}
    ${idsGiven ? 'ON CONFLICT (event_id) DO NOTHING' : ''}
    RETURNING event_id, seq::text AS seq`;
  // Events without a key lock nothing, nor does any event of the WAL source.
  const ctes =
    source === null || keyLocks === null
      ? []
      : [
          `locked AS (
      INSERT INTO ${keyLocks} (key_hash)
      ${source}
      ON CONFLICT (key_hash) DO UPDATE SET key_hash = EXCLUDED.key_hash WHERE false
      RETURNING 1)`,
        ];
  if (channel !== null) ctes.push(`ins AS (${insert})`, `wake AS (SELECT pg_notify('${channel}', ''))`);
  const text =
    channel === null
      ? `${ctes.length > 0 ? `WITH ${ctes.join(',\n    ')}\n    ` : ''}${insert}`
      : `WITH ${ctes.join(',\n    ')}\n    SELECT ins.event_id, ins.seq FROM ins, wake`;
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

/**
 * The savepoint that makes a WAL-source call all or nothing. The table source undoes a call whose
 * event id existed already with {@link deleteEventsSql}; for the WAL source that is not enough,
 * because the publication streams the INSERTs and not the DELETE (it publishes inserts only), so
 * a caller that catches the error and commits would have the relay publish events the call said
 * it did not write. Rows undone by `ROLLBACK TO SAVEPOINT` are never streamed (docs/wal-source.md,
 * fact 2). A name of our own: PostgreSQL allows a name to be reused, and `ROLLBACK TO` and
 * `RELEASE` take the latest savepoint of that name, so a caller's savepoints are untouched.
 */
export const ENQUEUE_SAVEPOINT = {
  begin: 'SAVEPOINT outboxkit_enqueue',
  undo: 'ROLLBACK TO SAVEPOINT outboxkit_enqueue',
  release: 'RELEASE SAVEPOINT outboxkit_enqueue',
} as const;
