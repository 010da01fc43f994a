/**
 * Retention cleanup of the consumer inbox (docs/guarantees.md, G4: inbox retention is
 * configurable, must exceed the longest redelivery horizon, and cleanup runs in bounded batches).
 */
import { joinTransaction, runTransaction, type DatabaseHandle, type TransactionHandle } from '../src/database.js';
import { InvalidOptionsError } from '../src/errors.js';
import { DEFAULT_SCHEMA } from '../src/constants.js';
import { quoteSchema } from '../src/schema-name.js';
import { deleteExpiredInboxRowsSql } from './inbox-sql.js';

/**
 * Default inbox retention: 8 days, one day above Kafka's default topic retention
 * (`log.retention.hours=168`, Kafka broker configuration), so that every message a topic can
 * still redeliver (offset reset, rebalance, crash) finds its inbox row.
 */
export const DEFAULT_INBOX_RETENTION_MS = 8 * 24 * 60 * 60 * 1_000;

/** Options of {@link cleanupInbox}. */
export interface CleanupInboxOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /**
   * Rows processed longer ago than this, in ms, are deleted. After deletion a redelivered event
   * is applied again, so keep it above the consumed topics' `retention.ms` and the relay's
   * republish window. @defaultValue 691_200_000 (8 days)
   */
  retentionMs?: number;
  /** Rows deleted per transaction. @defaultValue 1_000 */
  batchSize?: number;
  /**
   * Most batches in one call, so that one call stays bounded even with a large backlog; call
   * again (for example on a timer) to continue. @defaultValue 100
   */
  maxBatches?: number;
  /** Only this consumer group's rows. @defaultValue every group */
  consumerGroup?: string;
}

/** Default options of {@link cleanupInbox}. */
export const CLEANUP_INBOX_DEFAULTS = Object.freeze({
  schema: DEFAULT_SCHEMA,
  retentionMs: DEFAULT_INBOX_RETENTION_MS,
  batchSize: 1_000,
  maxBatches: 100,
});

function checkInteger(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw new InvalidOptionsError(
      `cleanupInbox: ${name} must be an integer from ${min} to ${max}, got ${JSON.stringify(value)}.`,
    );
  }
  return value;
}

/**
 * Deletes inbox rows older than the retention, in batches of `batchSize`, each in its own short
 * transaction, until a batch finds fewer than `batchSize` rows or `maxBatches` batches ran.
 *
 * @param db - a `pg.Pool` or a drizzle database.
 * @returns how many rows were deleted, and whether rows may be left (`maxBatches` reached).
 * @throws {@link InvalidOptionsError} on an invalid schema name, retention or batch bound.
 */
export async function cleanupInbox(
  db: DatabaseHandle,
  options: CleanupInboxOptions = {},
): Promise<{ deleted: number; more: boolean }> {
  const d = CLEANUP_INBOX_DEFAULTS;
  const schemaSql = quoteSchema(options.schema ?? d.schema);
  const retentionMs = checkInteger('retentionMs', options.retentionMs ?? d.retentionMs, 1, Number.MAX_SAFE_INTEGER);
  const batchSize = checkInteger('batchSize', options.batchSize ?? d.batchSize, 1, 1_000_000);
  const maxBatches = checkInteger('maxBatches', options.maxBatches ?? d.maxBatches, 1, 1_000_000);
  const group = options.consumerGroup ?? null;
  if (group !== null && (typeof group !== 'string' || group.length === 0)) {
    throw new InvalidOptionsError('cleanupInbox: consumerGroup must be a non-empty string.');
  }
  let deleted = 0;
  for (let batch = 0; batch < maxBatches; batch++) {
    const { text, values } = deleteExpiredInboxRowsSql({ schemaSql, retentionMs, batchSize, consumerGroup: group });
    const n = await runTransaction(
      db,
      async (tx) => (await joinTransaction(tx as TransactionHandle, 'cleanupInbox()').query(text, values)).rowCount,
    );
    deleted += n;
    if (n < batchSize) return { deleted, more: false };
  }
  return { deleted, more: true };
}
