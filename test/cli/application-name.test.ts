/**
 * The CLI names its PostgreSQL connections (application_name), so that pg_stat_activity tells the
 * relay daemon's pool, its LISTEN connection and operator commands from the application's own
 * connections. Operator commands are caught while they wait on a lock the test holds.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { spawnCli, spawnRelay, kill } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
/** The test's own connection, named (`test-*`) so that it is not mistaken for the CLI's. */
let observer: pg.Client;

beforeAll(async () => {
  db = await createTestDatabase();
  // The test database's pool is never used here: every other connection to it is the CLI's.
  observer = new pg.Client({ connectionString: db.url, application_name: 'test-observer' });
  await observer.connect();
});
afterAll(async () => {
  await observer?.end();
  await db?.drop();
});

/**
 * application_name of every connection to the test database but the test's own (`test-*`), with
 * how many. Outside a transaction: pg_stat_activity is a snapshot per transaction.
 */
async function sessions(): Promise<Map<string, number>> {
  const { rows } = await observer.query<{ name: string; n: number }>(
    `SELECT application_name AS name, count(*)::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND application_name NOT LIKE 'test-%' GROUP BY application_name`,
  );
  return new Map(rows.map((r) => [r.name, r.n]));
}

describe('application_name of the CLI connections', () => {
  it('the relay daemon: outboxkit-relay for its pool, outboxkit-relay-listener for LISTEN, no unnamed connection', async () => {
    const relay = spawnRelay(db.url);
    try {
      // Lanes taken: the pool has run the relay's statements, and the listener is up.
      await waitFor(
        async () => {
          const { rows } = await observer.query<{ n: number }>(
            'SELECT count(*)::int AS n FROM outboxkit.relay_lanes WHERE owner_id IS NOT NULL',
          );
          return rows[0]!.n === 64;
        },
        { timeoutMs: 30_000, message: () => `the relay takes its lanes (${relay.output.join('')})` },
      );
      const named = await waitFor(async () => {
        const s = await sessions();
        return (s.get('outboxkit-relay') ?? 0) >= 1 && s.get('outboxkit-relay-listener') === 1 ? s : undefined;
      });
      expect([...named.keys()].sort()).toEqual(['outboxkit-relay', 'outboxkit-relay-listener']);
    } finally {
      await kill(relay.proc, 'SIGTERM');
    }
  });

  it('operator commands: outboxkit-<command> (lanes release and migrate, caught waiting on a lock), unless PGAPPNAME names them', async () => {
    // `lanes release` updates the lanes of its relay id: it waits on the row lock held here.
    await observer.query(
      `INSERT INTO outboxkit.relay_lanes (lane, owner_id) VALUES (0, 'nobody')
       ON CONFLICT (lane) DO UPDATE SET owner_id = 'nobody'`,
    );
    const locker = new pg.Client({ connectionString: db.url, application_name: 'test-locker' });
    locker.on('error', () => {}); // a failed test leaves it to the database drop
    await locker.connect();
    onTestFinished(() => locker.end().catch(() => undefined));
    await locker.query('BEGIN');
    await locker.query('SELECT lane FROM outboxkit.relay_lanes FOR UPDATE');
    const release = spawnCli(['lanes', 'release', 'nobody', '--database-url', db.url]);
    try {
      const waiting = await waitFor(
        async () => {
          const s = await sessions();
          return s.size > 0 ? s : undefined;
        },
        { message: () => `lanes release waits on the lock (${release.output.join('')})` },
      );
      expect([...waiting.keys()]).toEqual(['outboxkit-lanes']);
    } finally {
      await locker.query('COMMIT');
    }
    expect((await release.exited).code).toBe(0);

    // `migrate` takes the migrator's advisory lock first: it waits on the one held here.
    await locker.query(`SELECT pg_advisory_lock(hashtextextended('outboxkit:migrate:outboxkit', 0))`);
    const migrate = spawnCli(['migrate', '--database-url', db.url]);
    try {
      const waiting = await waitFor(
        async () => {
          const s = await sessions();
          return s.size > 0 ? s : undefined;
        },
        { message: () => `migrate waits on the lock (${migrate.output.join('')})` },
      );
      expect([...waiting.keys()]).toEqual(['outboxkit-migrate']);
    } finally {
      await locker.query(`SELECT pg_advisory_unlock(hashtextextended('outboxkit:migrate:outboxkit', 0))`);
    }
    expect((await migrate.exited).code).toBe(0);

    // The CLI's name is only a fallback: PGAPPNAME (libpq's variable, read by pg) wins.
    await locker.query(`SELECT pg_advisory_lock(hashtextextended('outboxkit:migrate:outboxkit', 0))`);
    const named = spawnCli(['migrate', '--database-url', db.url], { PGAPPNAME: 'deploy-job' });
    try {
      const waiting = await waitFor(
        async () => {
          const s = await sessions();
          return s.size > 0 ? s : undefined;
        },
        { message: () => `migrate waits on the lock (${named.output.join('')})` },
      );
      expect([...waiting.keys()]).toEqual(['deploy-job']);
    } finally {
      await locker.query(`SELECT pg_advisory_unlock(hashtextextended('outboxkit:migrate:outboxkit', 0))`);
    }
    expect((await named.exited).code).toBe(0);
  });
});
