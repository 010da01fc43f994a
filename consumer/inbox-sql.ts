/**
 * The home of the `inbox` table's statements: one builder per statement, returning
 * `{ text, values }` ({@link SqlStatement}), and the two ways a builder writes its values (bind
 * parameters, or literals for the simple query protocol). `schemaSql` is the quoted schema
 * (`quoteSchema()`). The progress claim (progress-sql.ts) is built on {@link inboxInsertText}.
 */
import pg from 'pg';
import type { Queryable } from '../src/database.js';
import { InvalidOptionsError } from '../src/errors.js';
import type { SqlStatement } from '../src/postgres.js';

/** The inbox row that records that a consumer group applied an event. */
export interface InboxRow {
  groupId: string;
  eventId: string;
  topic: string;
  partition: number;
  /** Decimal string. */
  offset: string;
}

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

/**
 * How a statement builder writes each value into its text: {@link bindParameters} or
 * {@link inlineLiterals}. `name` names the value in the error of a value that may not be inlined.
 */
export interface SqlValueWriter {
  /** Any text. */
  text(value: string): string;
  /** A UUID in lower case (as `readEventId()` returns it). */
  uuid(value: string, name: string): string;
  /** A non-negative integer (a partition). */
  integer(value: number, name: string): string;
  /** An int64: a bigint, or the decimal text of a non-negative one (a Kafka offset). */
  int64(value: bigint | string, name: string): string;
  /** The bind parameters written so far, in order (none when inlined). */
  readonly values: unknown[];
}

/** Values as bind parameters (`$1::text`, `$2::uuid`, ...), for the extended query protocol. */
export function bindParameters(): SqlValueWriter {
  const values: unknown[] = [];
  // The cast types each parameter, also where nothing else would (the SELECT list of an INSERT).
  const bind = (value: unknown, type: string): string => `$${values.push(value)}::${type}`;
  return {
    values,
    text: (value) => bind(value, 'text'),
    uuid: (value) => bind(value, 'uuid'),
    integer: (value) => bind(value, 'int'),
    int64: (value) => bind(typeof value === 'bigint' ? value.toString() : value, 'bigint'),
  };
}

/** A UUID as `readEventId()` returns it (lower case); anything else never reaches inlined SQL. */
export const UUID_TEXT = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** A Kafka offset as kafkajs gives it: the decimal text of a non-negative int64. */
const OFFSET_TEXT = /^[0-9]{1,19}$/;

/**
 * Values as literals in the statement's text, for the simple query protocol: it takes no bind
 * parameters, and a statement written so can travel in one query string with `BEGIN` or
 * `SAVEPOINT` (one round trip instead of two). Values are inlined here and only here: text through
 * `pg.escapeLiteral`, every other value only after it matches its strict shape (a bigint prints
 * as digits).
 *
 * @throws {@link InvalidOptionsError} from a method, "Refusing to inline ...", when a UUID is not in lower case, an
 *   integer not a non-negative safe integer, or an int64's text not a non-negative int64 in
 *   decimal (the consumer validates them first; this is the last guard before SQL).
 */
export function inlineLiterals(): SqlValueWriter {
  const refuse = (name: string, value: unknown): never => {
    throw new InvalidOptionsError(`Refusing to inline ${name} ${JSON.stringify(value)}.`);
  };
  return {
    values: [],
    text: (value) => pg.escapeLiteral(value),
    uuid: (value, name) => (UUID_TEXT.test(value) ? `'${value}'` : refuse(name, value)),
    integer: (value, name) => (Number.isSafeInteger(value) && value >= 0 ? String(value) : refuse(name, value)),
    int64: (value, name) =>
      typeof value === 'bigint' ? value.toString() : OFFSET_TEXT.test(value) ? value : refuse(name, value),
  };
}

// ---------------------------------------------------------------------------------------------
// Statements of the inbox transaction
// ---------------------------------------------------------------------------------------------

/**
 * Bounds every lock wait of the rest of the transaction (the inbox claim and the handler's own
 * statements) to `lockTimeoutMs`; 0 means no bound. `set_config(..., true)` is `SET LOCAL` that
 * takes a value like any other: the setting ends with the transaction and never leaks into the
 * pooled session.
 */
export function lockTimeoutSql(lockTimeoutMs: number, values: SqlValueWriter = bindParameters()): SqlStatement {
  return {
    text: `SELECT set_config('lock_timeout', ${values.text(`${lockTimeoutMs}ms`)}, true)`,
    values: values.values,
  };
}

/**
 * The claim's INSERT without its RETURNING clause, which {@link inboxClaimSql} and the progress
 * claim (`claimWithProgressSql()`) each add. One atomic statement: a check-then-insert would let
 * two deliveries of one event both see "absent". A concurrent delivery of the same event whose
 * transaction is still open holds the primary key: this insert waits for it (bounded by the lock
 * timeout), then does nothing if that transaction committed, or inserts if it rolled back.
 * `ON CONFLICT DO NOTHING` also makes a second delivery inside one batch a plain skip, never a
 * "cannot affect row a second time" error (test/consumer/c15-duplicate-in-batch.test.ts).
 */
export function inboxInsertText(schemaSql: string, row: InboxRow, values: SqlValueWriter): string {
  return (
    `INSERT INTO ${schemaSql}.inbox (consumer_group, event_id, topic, partition, "offset") ` +
    `VALUES (${values.text(row.groupId)}, ${values.uuid(row.eventId, 'the event id')}, ${values.text(row.topic)}, ` +
    `${values.integer(row.partition, 'the partition')}, ${values.int64(row.offset, 'the offset')}) ` +
    'ON CONFLICT (consumer_group, event_id) DO NOTHING'
  );
}

/**
 * Claims (group, event id) in the inbox (see {@link inboxInsertText}). Its result is one row
 * `claimed` (1) when this transaction inserted the row, none when the event was applied already;
 * read it with {@link isClaimed}.
 */
export function inboxClaimSql(
  { schemaSql, row }: { schemaSql: string; row: InboxRow },
  values: SqlValueWriter = bindParameters(),
): SqlStatement {
  return { text: `${inboxInsertText(schemaSql, row, values)} RETURNING 1 AS claimed`, values: values.values };
}

/**
 * Whether a claim (the inbox claim, or the progress claim) inserted its inbox row: both answer
 * `claimed` = 1 then.
 */
export function isClaimed(result: { rows: readonly unknown[] }): boolean {
  return Number((result.rows[0] as { claimed?: unknown } | undefined)?.claimed) === 1;
}

/** {@link isClaimed} of the last statement of a simple-protocol query string (the claim ends it). */
export function claimedByLast(results: pg.QueryResult | pg.QueryResult[]): boolean {
  const last = Array.isArray(results) ? results[results.length - 1] : results;
  return last !== undefined && isClaimed(last);
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

/** Where and when a consumer group applied an event, as its inbox row records it. */
export interface InboxEntry {
  topic: string;
  partition: number;
  /** Decimal string. */
  offset: string;
  processedAt: Date;
}

/**
 * Reads the inbox row of (group, event id), after the claim found it taken, to tell a redelivery
 * of the message that was applied (same topic, partition and offset) from another message with
 * the same event id. Runs only for duplicates, in their transaction; a statement of its own, so
 * that under READ COMMITTED it sees a row a concurrent delivery committed while the claim waited
 * on it (the claim's own snapshot does not). The time comes as epoch ms: drizzle's node-postgres
 * driver returns timestamps as text.
 */
export function inboxEntrySql({
  schemaSql,
  groupId,
  eventId,
}: {
  schemaSql: string;
  groupId: string;
  eventId: string;
}): SqlStatement {
  return {
    text: `SELECT topic, partition, "offset"::text AS "offset",
            (extract(epoch FROM processed_at) * 1000)::float8 AS processed_ms
       FROM ${schemaSql}.inbox WHERE consumer_group = $1 AND event_id = $2`,
    values: [groupId, eventId],
  };
}

/**
 * Runs {@link inboxEntrySql}.
 *
 * @returns the row, or null when it cannot be seen (deleted meanwhile, or a REPEATABLE READ
 *   snapshot taken before it committed).
 */
export async function readInboxEntry(
  q: Queryable,
  args: { schemaSql: string; groupId: string; eventId: string },
): Promise<InboxEntry | null> {
  const { text, values } = inboxEntrySql(args);
  const { rows } = await q.query<{ topic: string; partition: number; offset: string; processed_ms: number }>(
    text,
    values,
  );
  const row = rows[0];
  if (row === undefined) return null;
  return { topic: row.topic, partition: row.partition, offset: row.offset, processedAt: new Date(row.processed_ms) };
}

// ---------------------------------------------------------------------------------------------
// Start-up check and retention
// ---------------------------------------------------------------------------------------------

/** Fails unless the inbox table exists in the schema and the database answers. */
export function probeInboxSql(schemaSql: string): SqlStatement {
  return { text: `SELECT 1 FROM ${schemaSql}.inbox LIMIT 0`, values: [] };
}

/**
 * Deletes inbox rows processed more than `retentionMs` ago, at most `batchSize` of them (bounded
 * lock time and WAL per statement), oldest first through `inbox_processed_idx`. `SKIP LOCKED`
 * lets two cleanups run at once without waiting on each other's rows. Its row count is the
 * number of rows deleted.
 *
 * @param args.consumerGroup - only this group's rows, or every group's when null.
 */
export function deleteExpiredInboxRowsSql({
  schemaSql,
  retentionMs,
  batchSize,
  consumerGroup,
}: {
  schemaSql: string;
  retentionMs: number;
  batchSize: number;
  consumerGroup: string | null;
}): SqlStatement {
  return {
    text: `DELETE FROM ${schemaSql}.inbox WHERE (consumer_group, event_id) IN (
       SELECT consumer_group, event_id FROM ${schemaSql}.inbox
        WHERE processed_at < now() - make_interval(secs => $1::double precision / 1000)
          AND ($3::text IS NULL OR consumer_group = $3::text)
        ORDER BY processed_at LIMIT $2
        FOR UPDATE SKIP LOCKED)`,
    values: [retentionMs, batchSize, consumerGroup],
  };
}
