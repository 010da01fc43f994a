/**
 * The home of the `consumer_progress` table's statements (`recordProgress`; the rules of what a
 * row states are in progress.ts): one builder per statement, returning `{ text, values }`.
 * `schemaSql` is the quoted schema (`quoteSchema()`).
 */
import type { Queryable } from '../src/database.js';
import type { SqlStatement } from '../src/postgres.js';
import { bindParameters, inboxInsertText, type InboxRow, type SqlValueWriter } from './inbox-sql.js';

/** A stored progress row (see progress.ts). Offsets and timestamps as bigint. */
export interface StoredProgress {
  rangeStart: bigint;
  lastOffset: bigint;
  lastEventId: string;
  /** Kafka timestamp of the record at `lastOffset`, in ms since the epoch. */
  lastTimestamp: bigint;
}

/** Reads the stored progress of one partition. */
export function readProgressSql({
  schemaSql,
  groupId,
  topic,
  partition,
}: {
  schemaSql: string;
  groupId: string;
  topic: string;
  partition: number;
}): SqlStatement {
  return {
    text: `SELECT range_start::text, last_offset::text, last_event_id::text, last_timestamp::text
       FROM ${schemaSql}.consumer_progress WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
    values: [groupId, topic, partition],
  };
}

/** Runs {@link readProgressSql}: the partition's stored progress, or null. */
export async function readProgress(
  q: Queryable,
  args: { schemaSql: string; groupId: string; topic: string; partition: number },
): Promise<StoredProgress | null> {
  const { text, values } = readProgressSql(args);
  const { rows } = await q.query<{
    range_start: string;
    last_offset: string;
    last_event_id: string;
    last_timestamp: string;
  }>(text, values);
  const row = rows[0];
  if (row === undefined) return null;
  return {
    rangeStart: BigInt(row.range_start),
    lastOffset: BigInt(row.last_offset),
    lastEventId: row.last_event_id,
    lastTimestamp: BigInt(row.last_timestamp),
  };
}

/** Fails unless the progress table exists in the schema (`recordProgress` needs migration 0001). */
export function probeProgressSql(schemaSql: string): SqlStatement {
  return { text: `SELECT 1 FROM ${schemaSql}.consumer_progress LIMIT 0`, values: [] };
}

/** The upsert's tail: a partition's row is replaced by the newer one. */
const UPSERT_TAIL =
  'ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET range_start = EXCLUDED.range_start, ' +
  'last_offset = EXCLUDED.last_offset, last_event_id = EXCLUDED.last_event_id, ' +
  'last_timestamp = EXCLUDED.last_timestamp, updated_at = EXCLUDED.updated_at';

/**
 * The inbox claim that also writes the partition's progress (`recordProgress`), as one
 * statement: the inbox claim's INSERT ({@link inboxInsertText}) and the progress upsert, which
 * writes only when the claim inserted the inbox row, so that a duplicate still writes nothing (no
 * transaction id, no WAL flush at its COMMIT). Call it only in the transaction of the effects of
 * the message at `progress.lastOffset`: the row commits with them or not at all. Its result is
 * one row `claimed` (1 or 0), read as the plain claim's (`isClaimed()`).
 *
 * @param args.progress - the row to write; its event id may be another record's than the
 *   claimed one (the anchor of a trusted row the batch joined, see `progressAfter()`).
 */
export function claimWithProgressSql(
  { schemaSql, row, progress }: { schemaSql: string; row: InboxRow; progress: StoredProgress },
  values: SqlValueWriter = bindParameters(),
): SqlStatement {
  const claim = inboxInsertText(schemaSql, row, values);
  return {
    text:
      `WITH claim AS (${claim} RETURNING 1), progress AS (INSERT INTO ${schemaSql}.consumer_progress ` +
      '(consumer_group, topic, partition, range_start, last_offset, last_event_id, last_timestamp, updated_at) ' +
      `SELECT ${values.text(row.groupId)}, ${values.text(row.topic)}, ${values.integer(row.partition, 'the partition')}, ` +
      `${values.int64(progress.rangeStart, 'the range start')}, ${values.int64(progress.lastOffset, 'the last offset')}, ` +
      `${values.uuid(progress.lastEventId, 'the progress event id')}, ${values.int64(progress.lastTimestamp, 'the last timestamp')}, ` +
      `now() WHERE EXISTS (SELECT 1 FROM claim) ${UPSERT_TAIL}) ` +
      'SELECT count(*)::int AS claimed FROM claim',
    values: values.values,
  };
}

/** Deletes a consumer group's progress rows, every topic's (`topic` null) or one topic's. */
export function deleteProgressSql({
  schemaSql,
  consumerGroup,
  topic,
}: {
  schemaSql: string;
  consumerGroup: string;
  topic: string | null;
}): SqlStatement {
  return {
    text: `DELETE FROM ${schemaSql}.consumer_progress WHERE consumer_group = $1 AND ($2::text IS NULL OR topic = $2::text)`,
    values: [consumerGroup, topic],
  };
}
