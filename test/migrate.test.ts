import { execFile } from 'node:child_process';
import { cpSync, mkdtempSync, appendFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate, defaultMigrationsFolder } from '../src/migrate.js';
import { isOutboxkitError } from '../src/errors.js';
import { createTestDatabase, type TestDatabase } from './helpers/db.js';

const run = promisify(execFile);
let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

async function tables(schema: string): Promise<string[]> {
  const { rows } = await db.pool.query<{ t: string }>(
    `SELECT table_name AS t FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`,
    [schema],
  );
  return rows.map((r) => r.t);
}

describe('migrate()', () => {
  // The test server runs wal_level = replica (the WAL tests have a cluster of their own): a WAL
  // publication there would let WAL writers fill a table no WAL relay can read.
  it('refuses walPublication on a server without wal_level = logical, before writing anything', async () => {
    const { rows } = await db.pool.query<{ v: string }>(`SELECT current_setting('wal_level') AS v`);
    expect(rows[0]!.v).not.toBe('logical');
    const err = await migrate({ connectionString: db.url, schema: 'walless', walPublication: true }).catch(
      (e: unknown) => e,
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_UNSUPPORTED_SERVER')).toBe(true);
    expect((err as Error).message).toMatch(/wal_level = logical.*wal_level = replica/);
    expect(await tables('walless')).toEqual([]);
    const pubs = await db.pool.query(`SELECT 1 FROM pg_publication WHERE pubname = 'walless_outbox_events'`);
    expect(pubs.rowCount).toBe(0);
  });

  it('is a no-op on an up-to-date schema', async () => {
    expect((await migrate({ connectionString: db.url })).applied).toEqual([]);
  });

  it('creates the tables in another schema, from several processes at once', async () => {
    const cli = path.resolve('cli/main.ts');
    const results = await Promise.all(
      Array.from({ length: 4 }, () =>
        run(process.execPath, ['--import', 'tsx', cli, 'migrate', '--schema', 'billing_ok', '--database-url', db.url], {
          env: { ...process.env, OUTBOXKIT_LOG_LEVEL: 'info' },
        }),
      ),
    );
    const appliedCounts = results.map((r) => (r.stdout.match(/"applied":\["[^\]]+\]/) ? 1 : 0));
    expect(appliedCounts.reduce((a: number, b: number) => a + b, 0)).toBe(1);
    expect((await tables('billing_ok')).sort()).toEqual([
      'consumer_progress',
      'idempotency_keys',
      'inbox',
      'outbox_events',
      'outbox_key_locks',
      'outboxkit_migrations',
      'relay_instances',
      'relay_lanes',
      'wal_slot_leases',
      'wal_slots',
    ]);
  });

  it('shares a schema with another tool that has its own `migrations` table', async () => {
    await db.pool.query(
      'CREATE SCHEMA shared_app; CREATE TABLE shared_app.migrations (id serial PRIMARY KEY, name text)',
    );
    const { applied } = await migrate({ connectionString: db.url, schema: 'shared_app' });
    expect(applied).toEqual([
      '0000_init',
      '0001_consumer_progress',
      '0002_operation_id',
      '0003_operation_id_backfill',
      '0004_relay_blocked_partitions',
      '0005_outbox_key_locks',
      '0006_wal_slots',
      '0007_wal_slot_leases',
      '0008_wal_held',
    ]);
    expect((await tables('shared_app')).sort()).toContain('outboxkit_migrations');
  });

  it('refuses to continue when an applied migration file was edited', async () => {
    const folder = mkdtempSync(path.join(tmpdir(), 'outboxkit-mig-'));
    cpSync(defaultMigrationsFolder(), folder, { recursive: true });
    appendFileSync(path.join(folder, '0000_init.sql'), '\n-- edited\n');
    const err = await migrate({ connectionString: db.url, migrationsFolder: folder }).catch((e: unknown) => e);
    expect(isOutboxkitError(err, 'OUTBOXKIT_MIGRATION_FAILED')).toBe(true);
    expect(String((err as Error).message)).toMatch(/changed after it was applied/);
  });

  it('rejects an invalid schema name before connecting', async () => {
    const err = await migrate({ connectionString: 'postgres://nobody@127.0.0.1:1/x', schema: 'Robert"); DROP' }).catch(
      (e: unknown) => e,
    );
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
  });
});
