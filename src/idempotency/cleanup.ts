/**
 * Retention cleanup of idempotency records.
 */
import { joinTransaction, runTransaction, type DatabaseHandle, type TransactionHandle } from '../database.js';
import { InvalidOptionsError, optionNames, refuseUnknownOptions } from '../errors.js';
import { DEFAULT_SCHEMA } from '../constants.js';
import { quoteSchema } from '../schema-name.js';
import { toSchemaMissing } from './pg-errors.js';
import { deleteExpiredKeys, idempotencyTable } from './store.js';

/** Options of {@link cleanupExpiredKeys}. */
export interface CleanupOptions {
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /** Records deleted per transaction. @defaultValue 1_000 */
  batchSize?: number;
  /**
   * Most batches in one call, so that one call stays bounded even with a large backlog; call
   * again (for example on a timer) to continue. @defaultValue 100
   */
  maxBatches?: number;
}

/** Every option name of {@link CleanupOptions}; the compiler keeps it in step with the interface. */
const CLEANUP_OPTION_NAMES = optionNames<CleanupOptions>({ schema: true, batchSize: true, maxBatches: true });

/** Default options of {@link cleanupExpiredKeys}. */
export const CLEANUP_DEFAULTS = Object.freeze({ schema: DEFAULT_SCHEMA, batchSize: 1_000, maxBatches: 100 });

/**
 * Deletes expired `completed` and `failed` idempotency records (those past `expires_at`), in
 * batches of `batchSize`, each in its own short transaction, until a batch finds fewer than
 * `batchSize` records or `maxBatches` batches ran. `processing` and `uncertain` records are never
 * deleted, whatever their age. After deletion, a retry with the same key executes as a new request.
 *
 * @param db - a `pg.Pool` or a drizzle database.
 * @returns the number of records deleted.
 * @throws {@link InvalidOptionsError} on an unknown option name, an invalid schema name or batch
 *   bound (before any query).
 * @throws {@link SchemaMissingError} when outboxkit's tables do not exist in `schema` (run
 *   `outboxkit migrate`).
 */
export async function cleanupExpiredKeys(
  db: DatabaseHandle,
  options: CleanupOptions = {},
): Promise<{ deleted: number }> {
  refuseUnknownOptions(options ?? {}, CLEANUP_OPTION_NAMES, 'cleanupExpiredKeys');
  const resolved = { ...CLEANUP_DEFAULTS, ...options };
  const table = idempotencyTable(quoteSchema(resolved.schema));
  for (const name of ['batchSize', 'maxBatches'] as const) {
    const v = resolved[name];
    if (!Number.isInteger(v) || v < 1 || v > 1_000_000) {
      throw new InvalidOptionsError(`${name} must be an integer from 1 to 1,000,000, got ${String(v)}.`);
    }
  }
  let deleted = 0;
  for (let batch = 0; batch < resolved.maxBatches; batch++) {
    const n = await runTransaction(db, (tx) =>
      deleteExpiredKeys(joinTransaction(tx as TransactionHandle, 'cleanupExpiredKeys()'), table, resolved.batchSize),
    ).catch((err: unknown) => {
      throw toSchemaMissing(err, resolved.schema);
    });
    deleted += n;
    if (n < resolved.batchSize) break;
  }
  return { deleted };
}
