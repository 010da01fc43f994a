import { execFile } from 'node:child_process';
import { cpSync, mkdtempSync, appendFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate, defaultMigrationsFolder } from '../src/migrate.js';
import { isOutboxkitError } from '../src/errors.js';
import { createTestDatabase, type TestDatabase } from './helpers/db.js';
import { finished, jsonError, spawnCli } from './helpers/processes.js';

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

describe('migrate() on a schema that lost a table a recorded migration created', () => {
  // Breach caught: "schema is up to date" over a dropped table (its migration is recorded, so never
  // applied again), while the writers, the relays and `outboxkit status` fail on it and say to migrate.
  it('OUTBOXKIT_SCHEMA_MISSING naming the table and the record to delete; done, migrate creates it again', async () => {
    await migrate({ connectionString: db.url, schema: 'dropped_one' });
    await db.pool.query('DROP TABLE dropped_one.wal_slots');
    const message =
      'outboxkit\'s table "dropped_one".wal_slots is missing, though migration 0006_wal_slots, which created it, ' +
      'is recorded as applied in "dropped_one".outboxkit_migrations: dropped since, and migrate never applies a ' +
      'recorded migration again. Restore it from a backup, or, to create it again empty, delete the record of ' +
      '0006_wal_slots (DELETE FROM "dropped_one".outboxkit_migrations WHERE tag IN (\'0006_wal_slots\')) and run ' +
      '`outboxkit migrate --schema dropped_one` or migrate() again.';
    const err = await migrate({ connectionString: db.url, schema: 'dropped_one' }).catch((e: unknown) => e);
    expect(isOutboxkitError(err, 'OUTBOXKIT_SCHEMA_MISSING')).toBe(true);
    expect((err as Error).message).toBe(message);

    const r = await finished(spawnCli(['migrate', '--schema', 'dropped_one', '--database-url', db.url, '--json']));
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(jsonError(r)).toEqual({ code: 'OUTBOXKIT_SCHEMA_MISSING', message });

    // What the message says to do.
    await db.pool.query(`DELETE FROM "dropped_one".outboxkit_migrations WHERE tag IN ('0006_wal_slots')`);
    expect((await migrate({ connectionString: db.url, schema: 'dropped_one' })).applied).toEqual(['0006_wal_slots']);
    expect(await tables('dropped_one')).toContain('wal_slots');
  });

  it('a table whose migration created others still there: the migration file to run by hand; nothing applied', async () => {
    await migrate({ connectionString: db.url, schema: 'dropped_init' });
    // relay_lanes: no later migration changes it, so 0000_init alone is named.
    await db.pool.query('DROP TABLE dropped_init.relay_lanes');
    // 0007 pending: refused before it is applied.
    await db.pool.query('DROP TABLE dropped_init.wal_slot_leases');
    await db.pool.query(`DELETE FROM dropped_init.outboxkit_migrations WHERE tag = '0007_wal_slot_leases'`);
    const err = await migrate({ connectionString: db.url, schema: 'dropped_init' }).catch((e: unknown) => e);
    expect(isOutboxkitError(err, 'OUTBOXKIT_SCHEMA_MISSING')).toBe(true);
    expect((err as Error).message).toBe(
      'outboxkit\'s table "dropped_init".relay_lanes is missing, though migration 0000_init, which created it, ' +
        'is recorded as applied in "dropped_init".outboxkit_migrations: dropped since, and migrate never applies a ' +
        'recorded migration again. Restore it from a backup, or, to create it again empty, run the statements that ' +
        'create and change it in migrations/0000_init.sql (in outboxkit\'s package), with "dropped_init" in place of ' +
        '"outboxkit": 0000_init also names tables that are still there, so it cannot run again as a whole.',
    );
    expect(await tables('dropped_init')).not.toContain('wal_slot_leases');
  });
});
