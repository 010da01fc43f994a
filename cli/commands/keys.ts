import { InvalidArgumentError, type Command } from 'commander';
import { cleanupExpiredKeys } from '../../src/idempotency/cleanup.js';
import { redactKey } from '../../src/idempotency/key.js';
import { idempotencyTable, listKeys, type KeyListing } from '../../src/idempotency/store.js';
import { IDEMPOTENCY_STATES, type IdempotencyState } from '../../src/constants.js';
import { quoteSchema } from '../../src/schema-name.js';
import { databaseOption, int, q, schemaOption, withPool } from '../shared.js';
import { printJson, printLines } from '../printable.js';

function state(value: string): IdempotencyState {
  if (!(IDEMPOTENCY_STATES as readonly string[]).includes(value)) {
    throw new InvalidArgumentError(`One of ${IDEMPOTENCY_STATES.join(', ')}.`);
  }
  return value as IdempotencyState;
}

function positive(value: string): number {
  const n = int(value);
  if (n < 1 || n > 1_000_000) throw new InvalidArgumentError('An integer from 1 to 1,000,000.');
  return n;
}

/**
 * `outboxkit keys list|cleanup`: idempotency records for operators.
 *
 * Retention: a completed or failed record is replayed for its operation's `retentionMs` (default
 * 24 h) counted from completion; after that a retry with its key executes as a new request, and
 * `keys cleanup` (or `cleanupExpiredKeys()`) deletes it in bounded batches. `processing` and
 * `uncertain` records are never deleted for their age: list them with `keys list --state
 * processing|uncertain`, and resolve uncertain ones with `reconcileUncertain()`.
 * Keys are never printed in full (`redactKey`); the operation id (SHA-256 of the key) identifies a
 * record instead.
 */
export function registerKeys(program: Command): void {
  const keys = program
    .command('keys')
    .description('idempotency records: list stuck or uncertain ones, clean up expired ones');
  keys
    .command('list')
    .description('list idempotency records of one state, oldest first (keys redacted)')
    .requiredOption('--state <state>', `record state: ${IDEMPOTENCY_STATES.join(' | ')}`, state)
    .option('--tenant <tenant>', 'only this tenant')
    .option('--operation <operation>', 'only this operation')
    .option('--limit <n>', 'most rows', positive, 100)
    .option('--json', 'print JSON')
    .addOption(databaseOption())
    .addOption(schemaOption())
    .action(
      async (opts: {
        state: IdempotencyState;
        tenant?: string;
        operation?: string;
        limit: number;
        json?: boolean;
        databaseUrl: string;
        schema: string;
      }) => {
        await withPool(opts.databaseUrl, 'keys', opts.schema, async (pool) => {
          const rows = await listKeys(q(pool), idempotencyTable(quoteSchema(opts.schema)), {
            state: opts.state,
            tenant: opts.tenant,
            operation: opts.operation,
            limit: opts.limit,
          });
          const listed: KeyListing[] = rows.map(({ fullKey, ...r }) => ({ ...r, key: redactKey(fullKey) }));
          if (opts.json) return printJson(listed, 2);
          if (listed.length === 0) return printLines(`no ${opts.state} records`);
          // Tenants and operations come from requests: printLines() escapes their control characters.
          for (const r of listed) {
            const lease = r.leaseExpiresAt ? `  lease until ${r.leaseExpiresAt.toISOString()}` : '';
            const status = r.responseStatus === null ? '' : `  status ${r.responseStatus}`;
            printLines(
              `${r.tenant}  ${r.operation}  key=${r.key}  op=${r.operationId?.slice(0, 16) ?? '-'}  ${r.state}  gen=${r.generation}  age ${Math.round(r.ageSeconds)} s${status}${lease}`,
            );
          }
        });
      },
    );
  keys
    .command('cleanup')
    .description('delete expired completed/failed records in bounded batches (never processing or uncertain ones)')
    .option('--batch-size <n>', 'records deleted per transaction', positive, 1_000)
    .option('--max-batches <n>', 'most batches in this run', positive, 100)
    .addOption(databaseOption())
    .addOption(schemaOption())
    .option('--json', 'print JSON: { "deleted": n }')
    .action(
      async (opts: { batchSize: number; maxBatches: number; databaseUrl: string; schema: string; json?: boolean }) => {
        await withPool(opts.databaseUrl, 'keys', opts.schema, async (pool) => {
          const { deleted } = await cleanupExpiredKeys(pool, {
            schema: opts.schema,
            batchSize: opts.batchSize,
            maxBatches: opts.maxBatches,
          });
          if (opts.json) printJson({ deleted });
          else printLines(`deleted ${deleted} expired idempotency records`);
        });
      },
    );
}
