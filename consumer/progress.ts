/**
 * Partition progress in PostgreSQL (`recordProgress: true`): an optimisation of the dedup
 * consumer that skips the records Kafka redelivers after a crash without an inbox claim each.
 * Kafka's committed offsets stay authoritative: progress never moves a consumer, it only lets it
 * skip records it can prove it handled.
 *
 * **What a progress row states.** For (consumer group, topic, partition): every record of the
 * partition's log at an offset in `[rangeStart, lastOffset]` was applied by the group, or found
 * already applied (its inbox row), and the record at `lastOffset` carried the event id
 * `lastEventId` and the Kafka timestamp `lastTimestamp`. Dead-lettered records are never inside
 * a range, so rewinding the offsets re-drives them as without progress. The row is written in
 * the transaction of the effects of the message at `lastOffset`: it commits with them or not at
 * all.
 *
 * **Why a row is true.** One partition is consumed in offset order, one message at a time, and a
 * message is handled before the next one starts. One fetch (a kafkajs batch) returns the records
 * of one log from its fetch offset on; the records it leaves out are control records, aborted or
 * compacted ones: nothing to handle. So within a batch, once the message at offset `o` is
 * handled, every record from the batch's fetch offset (or from just after its last dead-lettered
 * record) to `o` is handled, in that log. A row never spans two batches unless the second one
 * proved the first one's row (below): two fetches of one partition need not read one log (a
 * topic deleted and recreated under a running consumer can go on at the same offset in the new
 * log, without any error).
 *
 * **Why a recreated topic or an offset reset never makes it skip an unseen record.** A batch
 * trusts a row (one read from the database, or the last one this process wrote) only when it
 * holds the row's anchor: a record at `lastOffset` with the same event id and Kafka timestamp.
 * Then this log is the log the row speaks of: the batch's records in `[rangeStart, lastOffset]`
 * are skipped, and the others go through the inbox as usual. An offset reset to an earlier
 * position of the same log reads the records below `rangeStart` through the inbox. A topic that
 * was deleted and recreated has other records at those offsets: another event id at
 * `lastOffset`, or, for a later copy of the same event (a relay republish, `outboxkit dlq
 * replay`), another timestamp: Kafka stamps each produce anew (CreateTime by the producer,
 * LogAppendTime by the broker). The one case that can match is a copy that keeps the original
 * timestamps AND lands at the very same offset (a byte-for-byte restore or mirror of the
 * partition), whose earlier records then are the same records too.
 *
 * Not covered (documented in README "Partition progress"): unclean leader election
 * (`unclean.leader.election.enable=true`), which can replace records at offsets already consumed.
 */
import { joinTransaction, runTransaction, type DatabaseHandle, type TransactionHandle } from '../src/database.js';
import { DEFAULT_SCHEMA } from '../src/constants.js';
import { InvalidOptionsError, refuseUnknownOptions, schemaMissingOr } from '../src/errors.js';
import { quoteSchema } from '../src/schema-name.js';
import { deleteProgressSql, type StoredProgress } from './progress-sql.js';

export type { StoredProgress } from './progress-sql.js';

/** What this process knows of one partition it consumes (see the module doc). */
export interface PartitionProgress {
  /**
   * The latest row known true of some log of the partition: the last one this process wrote
   * (committed), else the one read from the database when it got the partition. A batch trusts
   * it only when it holds its anchor.
   */
  known: StoredProgress | null;
  /** The batch being handled. */
  batch: {
    /**
     * Where a row written now may start: the batch's fetch offset, or the offset after its last
     * dead-lettered record.
     */
    start: bigint;
    /** `known`, when this batch holds its anchor: its records in the row's range are handled. */
    trusted: StoredProgress | null;
  };
}

/** The identity of one record, as the anchor compares it. */
export interface RecordIdentity {
  offset: bigint;
  /** The event id header, lower case, or null when the record has none usable. */
  eventId: string | null;
  /** Kafka timestamp, in ms since the epoch. */
  timestamp: bigint;
}

/** A partition's state when this process gets it, with the row stored for it (if any). */
export function newPartitionProgress(stored: StoredProgress | null): PartitionProgress {
  return { known: stored, batch: { start: 0n, trusted: null } };
}

/**
 * Starts a batch fetched at `fetchedOffset`: it trusts the known row only if it holds that row's
 * anchor (a record at the row's last offset with the same event id and timestamp).
 *
 * @param identityAt - the identity of the batch's record at an offset, or undefined when the
 *   batch has none there (called for the anchor's offset only).
 * @returns true when the batch trusts the known row.
 */
export function beginBatch(
  p: PartitionProgress,
  fetchedOffset: bigint,
  identityAt: (offset: bigint) => RecordIdentity | undefined,
): boolean {
  const known = p.known;
  let trusted: StoredProgress | null = null;
  if (known !== null) {
    const r = identityAt(known.lastOffset);
    if (r !== undefined && r.eventId === known.lastEventId && r.timestamp === known.lastTimestamp) trusted = known;
  }
  p.batch = { start: fetchedOffset, trusted };
  return trusted !== null;
}

/** Whether the current batch's record at `offset` is proven handled (skip it without a transaction). */
export function isProvenHandled(p: PartitionProgress | undefined, offset: bigint): boolean {
  const t = p?.batch.trusted;
  return t != null && offset >= t.rangeStart && offset <= t.lastOffset;
}

/**
 * The row to write in the transaction of the batch's message `record` when it is applied: from
 * the batch's start to this record, joined with the trusted row once the batch reaches it (this
 * record is at most one before its range; the anchor is in the batch, so the union is one range
 * of one log), ending at the trusted row's anchor if that lies further on.
 */
export function progressAfter(p: PartitionProgress, record: RecordIdentity & { eventId: string }): StoredProgress {
  let row: StoredProgress = {
    rangeStart: p.batch.start,
    lastOffset: record.offset,
    lastEventId: record.eventId,
    lastTimestamp: record.timestamp,
  };
  const t = p.batch.trusted;
  if (t !== null && record.offset + 1n >= t.rangeStart) {
    const rangeStart = t.rangeStart < row.rangeStart ? t.rangeStart : row.rangeStart;
    row = t.lastOffset > record.offset ? { ...t, rangeStart } : { ...row, rangeStart };
  }
  return row;
}

/** After the transaction holding `row` committed: the partition's known row. */
export function markWritten(p: PartitionProgress | undefined, row: StoredProgress): void {
  if (p !== undefined) p.known = row;
}

/**
 * A record of the batch was dead-lettered: no row written later in the batch may cover it, so
 * that rewinding the offsets re-drives it (as without progress).
 */
export function markDeadLettered(p: PartitionProgress | undefined, offset: bigint): void {
  if (p !== undefined && offset + 1n > p.batch.start) p.batch.start = offset + 1n;
}

/** Options of {@link resetConsumerProgress}. */
export interface ResetConsumerProgressOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /** The consumer group whose progress rows are deleted (required; the name `cleanupInbox()` uses). */
  consumerGroup: string;
  /** Only this topic's rows. @defaultValue every topic of the group */
  topic?: string;
}

const RESET_OPTIONS = ['schema', 'consumerGroup', 'topic'];

/**
 * Deletes a consumer group's partition progress rows (`recordProgress`), all of them or one
 * topic's. Never needed for correctness: a row is trusted only by a fetched batch that holds its
 * anchor record again.
 *
 * @param db - a `pg.Pool` or a drizzle database.
 * @returns how many rows were deleted.
 * @throws {@link InvalidOptionsError} when `db` is not a pool or drizzle database, an option name
 *   is unknown, `consumerGroup` is missing or empty, `topic` is empty, or the schema name is invalid.
 * @throws {@link SchemaMissingError} when the progress table does not exist (migration 0001).
 */
export async function resetConsumerProgress(
  db: DatabaseHandle,
  options: ResetConsumerProgressOptions,
): Promise<number> {
  const fail = (message: string): never => {
    throw new InvalidOptionsError(`resetConsumerProgress: ${message}`);
  };
  const isPool = typeof (db as { connect?: unknown })?.connect === 'function';
  const isDrizzle = typeof (db as { transaction?: unknown })?.transaction === 'function';
  if (!isPool && !isDrizzle) fail('db must be a pg.Pool or a drizzle database.');
  if (typeof options !== 'object' || options === null) fail('options must be an object.');
  refuseUnknownOptions(options, RESET_OPTIONS, 'resetConsumerProgress');
  const { consumerGroup, topic } = options;
  if (typeof consumerGroup !== 'string' || consumerGroup.length === 0)
    fail('consumerGroup must be a non-empty string.');
  if (topic !== undefined && (typeof topic !== 'string' || topic.length === 0))
    fail('topic must be a non-empty string when given.');
  const schema = options.schema ?? DEFAULT_SCHEMA;
  const schemaSql = quoteSchema(schema);
  try {
    return await runTransaction(db, async (tx) => {
      const { text, values } = deleteProgressSql({ schemaSql, consumerGroup, topic: topic ?? null });
      const { rowCount } = await joinTransaction(tx as TransactionHandle, 'resetConsumerProgress').query(text, values);
      return rowCount;
    });
  } catch (err) {
    throw schemaMissingOr(err, schema);
  }
}
