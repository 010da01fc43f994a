/**
 * The WAL relay on a server that cannot decode its WAL (`wal_level` below `logical`: the machine's
 * main PostgreSQL runs `replica`) fails its start at once with `UnsupportedServerError`, not
 * retriable, naming the setting; it used to retry creating its slot forever. Nothing is created.
 */
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';

import { createWalRelay } from '../../relay/wal/wal-relay.js';
import { UnsupportedServerError } from '../../src/errors.js';
import { migrate } from '../../src/migrate.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { spawnCli } from '../helpers/processes.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
  await migrate({ connectionString: db.url });
}, 60_000);

afterAll(async () => {
  await db?.drop();
});

describe('WAL relay on a server without wal_level = logical', () => {
  it('start() rejects with UnsupportedServerError (not retriable) and creates no slot', async (ctx) => {
    const { rows } = await db.pool.query<{ v: string }>(`SELECT current_setting('wal_level') AS v`);
    // Needs a server that cannot decode (this machine's main one runs replica; DATABASE_URL may not).
    if (rows[0]!.v === 'logical') ctx.skip();
    const relay = createWalRelay({
      connection: db.url,
      slot: 'outboxkit_wal_level_test',
      publication: 'outboxkit_wal_level_test',
      brokers: inject('kafkaBrokers'),
    });
    const error = await relay.start().then(
      () => undefined,
      (err: unknown) => err,
    );
    await relay.stop({ timeoutMs: 2_000 }).catch(() => undefined);
    expect(error).toBeInstanceOf(UnsupportedServerError);
    expect((error as UnsupportedServerError).retriable).toBe(false);
    expect((error as Error).message).toMatch(/wal_level = logical.*wal_level = replica/);
    const slots = await db.pool.query(
      `SELECT 1 FROM pg_replication_slots WHERE slot_name = 'outboxkit_wal_level_test'`,
    );
    expect(slots.rowCount).toBe(0);
  });

  // Breach caught (a new-user trial): the CLI created the publication, then the relay refused the
  // server, leaving a publication that streams nothing to anyone (and that the table relay warns of).
  it('outboxkit relay --source wal exits with OUTBOXKIT_UNSUPPORTED_SERVER and creates no publication', async (ctx) => {
    const { rows } = await db.pool.query<{ v: string }>(`SELECT current_setting('wal_level') AS v`);
    if (rows[0]!.v === 'logical') ctx.skip();
    const cli = spawnCli(['relay', '--source', 'wal', '--metrics-port', '-1'], {
      DATABASE_URL: db.url,
      KAFKA_BROKERS: inject('kafkaBrokers').join(','),
    });
    expect((await cli.exited).code).toBe(1);
    expect(cli.output.join('')).toMatch(/OUTBOXKIT_UNSUPPORTED_SERVER.*wal_level = replica/);
    expect((await db.pool.query('SELECT 1 FROM pg_publication')).rowCount).toBe(0);
  });
});
