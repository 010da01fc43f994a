/**
 * Partition progress in PostgreSQL (`recordProgress: true`): an optimisation of the dedup
 * consumer that skips the records Kafka redelivers after a crash without an inbox claim each.
 * Kafka's committed offsets stay authoritative: progress never moves a consumer, it only lets it
 * skip records it can prove it handled.
 *
 * **What a progress row states.** For (consumer group, topic, partition): every record of the
 * partition's log at an offset in `[rangeStart, lastOffset]` was handled by the group (applied,
 * found in the inbox, or dead-lettered), and the record at `lastOffset` carried the event id
 * `lastEventId` and the Kafka timestamp `lastTimestamp`. The row is written in the transaction of
 * the effects of the message at `lastOffset`, so it commits with them or not at all.
 *
 * **Why the range is sound.** One partition is consumed in offset order, one message at a time,
 * and a message is handled before the next one starts. A *stream* is what one process fetched of
 * a partition without a break: its first fetch offset `start`, then batches that each begin at
 * the offset after the last handled one. A fetch returns every record from its fetch
 * offset on (records it leaves out are control records, aborted or compacted ones: nothing to
 * handle), so when a stream has handled the message at offset `o`, every record of `[start, o]` is
 * handled. A new stream begins after every group join, a crash of the kafkajs consumer, a seek, or
 * a fetch that does not continue the stream.
 *
 * **Why a recreated topic or an offset reset never makes it skip an unseen record.** A stream
 * only trusts a stored row once one of its own batches contains the row's anchor: a record at
 * `lastOffset` with the same event id and Kafka timestamp. Then this log is the log the row
 * speaks of, and the stream skips the batch's records in `[rangeStart, lastOffset]`; records
 * outside that range go through the inbox as usual. An offset reset to an earlier position of the
 * same log reads records below `rangeStart` through the inbox, then meets the anchor. A topic
 * that was deleted and recreated has other records at those offsets: another event id at
 * `lastOffset`, or, for a later copy of the same event (a relay republish, `outboxkit dlq
 * replay`), another timestamp: Kafka stamps each produce anew (CreateTime by the producer,
 * LogAppendTime by the broker). The one case that can match is a copy that keeps the original
 * timestamps AND lands at the very same offset (a byte-for-byte restore or mirror of the
 * partition), whose earlier records then are the same records too.
 *
 * Not covered (documented in README "Partition progress"): unclean leader election
 * (`unclean.leader.election.enable=true`), which can replace records at offsets already consumed.
 */
import pg from 'pg';
import {
  joinTransaction,
  runTransaction,
  type DatabaseHandle,
  type Queryable,
  type TransactionHandle,
} from '../src/database.js';
import { DEFAULT_SCHEMA } from '../src/constants.js';
import { InvalidOptionsError } from '../src/errors.js';
import { quoteSchema } from '../src/schema-name.js';
import { UUID_TEXT, type InboxRow } from './inbox-sql.js';

/** A stored progress row (see the module doc). Offsets and timestamps as bigint. */
export interface StoredProgress {
  rangeStart: bigint;
  lastOffset: bigint;
  lastEventId: string;
  /** Kafka timestamp of the record at `lastOffset`, in ms since the epoch. */
  lastTimestamp: bigint;
}

/** What this process knows of one partition it consumes (see the module doc: a stream). */
export interface PartitionStream {
  /** Fetch offset of the stream's first batch: the stream has handled every record from here to `lastHandled`. */
  readonly start: bigint;
  /** Offset of the last message the stream handled (`start - 1` before the first). */
  lastHandled: bigint;
  /** The row read when the stream began, until the stream sees its anchor (then `trusted`) or passes it. */
  candidate: StoredProgress | null;
  /** The stored row whose anchor this stream saw: its range is handled in this log. */
  trusted: StoredProgress | null;
  /** The last row this stream wrote (committed): its range is handled in this log. */
  own: StoredProgress | null;
}

/** The identity of one record, as the anchor compares it. */
export interface RecordIdentity {
  offset: bigint;
  /** The event id header, lower case, or null when the record has none usable. */
  eventId: string | null;
  /** Kafka timestamp, in ms since the epoch. */
  timestamp: bigint;
}

/**
 * Whether a batch fetched at `fetchedOffset` continues `stream` (else a new stream begins): only
 * a fetch at the offset right after the last handled message does. kafkajs fetches from the
 * last resolved offset, and the consumer resolves each message as it handles it, so any other
 * fetch offset is a jump: a seek, an offset reset (out of range), or a topic deleted and
 * recreated under the running consumer, whose new log kafkajs reads from its start.
 */
export function continuesStream(stream: PartitionStream | undefined, fetchedOffset: bigint): stream is PartitionStream {
  return stream !== undefined && fetchedOffset === stream.lastHandled + 1n;
}

/** A new stream whose first batch was fetched at `fetchedOffset`, with the row stored for its partition. */
export function newStream(fetchedOffset: bigint, stored: StoredProgress | null): PartitionStream {
  return { start: fetchedOffset, lastHandled: fetchedOffset - 1n, candidate: stored, trusted: null, own: null };
}

/**
 * Looks for the candidate row's anchor among a batch's records (sorted by offset, as a fetch
 * returns them): when the record at the anchor's offset has the same event id and timestamp, the
 * stream trusts the row from now on. A batch whose records pass the anchor's offset without it
 * (another record there, or none: compacted) ends the candidate: it is never trusted.
 *
 * @param identityAt - the identity of the batch's record at an offset, or undefined when the
 *   batch has none there (called for the anchor's offset only).
 * @param lastOffset - the batch's last record offset.
 * @returns true when the stream trusts a row after this call.
 */
export function verifyAnchor(
  stream: PartitionStream,
  identityAt: (offset: bigint) => RecordIdentity | undefined,
  lastOffset: bigint,
): boolean {
  const candidate = stream.candidate;
  if (stream.trusted !== null || candidate === null) return stream.trusted !== null;
  const r = identityAt(candidate.lastOffset);
  if (r !== undefined && r.eventId === candidate.lastEventId && r.timestamp === candidate.lastTimestamp) {
    stream.trusted = candidate;
    stream.candidate = null;
    return true;
  }
  // Another record at the anchor's offset (another log: a recreated topic; or a later copy), or
  // none although the batch reaches past it: never trusted.
  if (r !== undefined || lastOffset >= candidate.lastOffset) stream.candidate = null;
  return false;
}

function covers(row: StoredProgress | null, offset: bigint): boolean {
  return row !== null && offset >= row.rangeStart && offset <= row.lastOffset;
}

/** Whether the record at `offset` is proven handled (skip it without a transaction). */
export function isProvenHandled(stream: PartitionStream | undefined, offset: bigint): boolean {
  return stream !== undefined && (covers(stream.trusted, offset) || covers(stream.own, offset));
}

/**
 * The row to write in the transaction of the message `record` when it is applied. The stream
 * has handled every record from `start` to this one, and what it wrote before joins on (its own
 * row ends before this record, with nothing unhandled between). The trusted row joins on too
 * once the stream reaches it (this record is at most one before its range): its anchor is in the
 * stream, so the union is one range. Before that, the stream's own range is written (a true
 * statement too; the trusted row still proves its records in memory).
 */
export function progressAfter(stream: PartitionStream, record: RecordIdentity & { eventId: string }): StoredProgress {
  let rangeStart = stream.start;
  if (stream.own !== null && stream.own.rangeStart < rangeStart) rangeStart = stream.own.rangeStart;
  let row: StoredProgress = {
    rangeStart,
    lastOffset: record.offset,
    lastEventId: record.eventId,
    lastTimestamp: record.timestamp,
  };
  const t = stream.trusted;
  if (t !== null && record.offset + 1n >= t.rangeStart) {
    if (t.rangeStart < row.rangeStart) row = { ...row, rangeStart: t.rangeStart };
    if (t.lastOffset > record.offset) row = { ...t, rangeStart: row.rangeStart };
  }
  return row;
}

/** Records that the stream handled the message at `offset` (applied, duplicate, skipped or dead-lettered). */
export function markHandled(stream: PartitionStream | undefined, offset: bigint): void {
  if (stream !== undefined && offset > stream.lastHandled) stream.lastHandled = offset;
}

/** After the transaction holding `row` committed: the stream's own row. */
export function markWritten(stream: PartitionStream | undefined, row: StoredProgress): void {
  if (stream !== undefined) stream.own = row;
}

// ---------------------------------------------------------------------------------------------
// SQL
// ---------------------------------------------------------------------------------------------

/** Reads the stored progress of one partition, or null. */
export async function readProgress(
  q: Queryable,
  schemaSql: string,
  groupId: string,
  topic: string,
  partition: number,
): Promise<StoredProgress | null> {
  const { rows } = await q.query<{
    range_start: string;
    last_offset: string;
    last_event_id: string;
    last_timestamp: string;
  }>(
    `SELECT range_start::text, last_offset::text, last_event_id::text, last_timestamp::text
       FROM ${schemaSql}.consumer_progress WHERE consumer_group = $1 AND topic = $2 AND partition = $3`,
    [groupId, topic, partition],
  );
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
export async function probeProgress(q: Queryable, schemaSql: string): Promise<void> {
  await q.query(`SELECT 1 FROM ${schemaSql}.consumer_progress LIMIT 0`);
}

/** The upsert's tail, shared by both statement forms. */
const UPSERT_TAIL =
  'ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET range_start = EXCLUDED.range_start, ' +
  'last_offset = EXCLUDED.last_offset, last_event_id = EXCLUDED.last_event_id, ' +
  'last_timestamp = EXCLUDED.last_timestamp, updated_at = EXCLUDED.updated_at';

/**
 * Writes a partition's progress (drizzle databases; a `pg.Pool` uses {@link claimWithProgressText}).
 * Call only in the transaction of the effects of the message at `row.lastOffset`.
 */
export async function writeProgress(
  q: Queryable,
  schemaSql: string,
  groupId: string,
  topic: string,
  partition: number,
  row: StoredProgress,
): Promise<void> {
  await q.query(
    `INSERT INTO ${schemaSql}.consumer_progress
       (consumer_group, topic, partition, range_start, last_offset, last_event_id, last_timestamp, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, now()) ${UPSERT_TAIL}`,
    [
      groupId,
      topic,
      partition,
      row.rangeStart.toString(),
      row.lastOffset.toString(),
      row.lastEventId,
      row.lastTimestamp.toString(),
    ],
  );
}

/**
 * The inbox claim and the progress write as one statement with every value inlined (for the
 * simple query protocol, in the same string as BEGIN or SAVEPOINT): the progress row is written
 * only when the claim inserted the inbox row, so a duplicate still writes nothing (no
 * transaction id, no WAL flush at its COMMIT). Its result is one row `claimed` (1 or 0); read it
 * with `claimedByLast()`.
 *
 * @param claimText - the inbox claim's text builder (`inboxClaimText()`); its values are checked there.
 * @throws {Error} from the returned function when a value is not of its strict shape.
 */
export function claimWithProgressText(
  schemaSql: string,
  groupId: string,
  claimText: (row: InboxRow) => string,
): (row: InboxRow, progress: StoredProgress) => string {
  const group = pg.escapeLiteral(groupId);
  const topics = new Map<string, string>();
  return (row, progress) => {
    const claim = claimText(row).replace(/ RETURNING 1 AS claimed$/, ' RETURNING 1');
    let topic = topics.get(row.topic);
    if (topic === undefined) {
      topic = pg.escapeLiteral(row.topic);
      topics.set(row.topic, topic);
    }
    // claimText() checked the row's values; the progress offsets and timestamp are bigints
    // (printed as digits); its event id (the row's own, or the trusted row's anchor) is checked here.
    if (!UUID_TEXT.test(progress.lastEventId)) {
      throw new Error(`Refusing to inline the progress event id ${JSON.stringify(progress.lastEventId)}.`);
    }
    return (
      `WITH claim AS (${claim}), progress AS (INSERT INTO ${schemaSql}.consumer_progress ` +
      '(consumer_group, topic, partition, range_start, last_offset, last_event_id, last_timestamp, updated_at) ' +
      `SELECT ${group}, ${topic}, ${row.partition}, ${progress.rangeStart}, ${progress.lastOffset}, ` +
      `'${progress.lastEventId}', ${progress.lastTimestamp}, now() WHERE EXISTS (SELECT 1 FROM claim) ${UPSERT_TAIL}) ` +
      'SELECT count(*)::int AS claimed FROM claim'
    );
  };
}

/** Options of {@link resetConsumerProgress}. */
export interface ResetConsumerProgressOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /** The consumer group whose progress rows are deleted (required). */
  groupId: string;
  /** Only this topic's rows. @defaultValue every topic of the group */
  topic?: string;
}

/**
 * Deletes a consumer group's partition progress rows (`recordProgress`), all of them or one
 * topic's. Never needed for correctness: a row is trusted only after its anchor record was read
 * again. Use it after recreating a topic, so that no member reads rows that can no longer match.
 *
 * @param db - a `pg.Pool` or a drizzle database.
 * @returns how many rows were deleted.
 * @throws {@link InvalidOptionsError} when `groupId` is missing or empty, or the schema name is invalid.
 */
export async function resetConsumerProgress(
  db: DatabaseHandle,
  options: ResetConsumerProgressOptions,
): Promise<number> {
  const { groupId, topic } = options ?? ({} as ResetConsumerProgressOptions);
  if (typeof groupId !== 'string' || groupId.length === 0) {
    throw new InvalidOptionsError('resetConsumerProgress: groupId must be a non-empty string.');
  }
  if (topic !== undefined && (typeof topic !== 'string' || topic.length === 0)) {
    throw new InvalidOptionsError('resetConsumerProgress: topic must be a non-empty string when given.');
  }
  const schemaSql = quoteSchema(options.schema ?? DEFAULT_SCHEMA);
  return runTransaction(db, async (tx) => {
    const { rowCount } = await joinTransaction(tx as TransactionHandle, 'resetConsumerProgress').query(
      `DELETE FROM ${schemaSql}.consumer_progress WHERE consumer_group = $1 AND ($2::text IS NULL OR topic = $2::text)`,
      [groupId, topic ?? null],
    );
    return rowCount;
  });
}
