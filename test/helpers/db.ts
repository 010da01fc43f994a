/**
 * Per-file databases: each test file gets its own database, cloned from the migrated template that
 * test/global-setup.ts prepares, and dropped by the helper that created it.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { inject } from 'vitest';

export interface TestDatabase {
  /** Connection string of this test's database. */
  url: string;
  /** A pool on it (closed by `drop()`). */
  pool: pg.Pool;
  /** Closes the pool and drops the database. */
  drop(): Promise<void>;
}

function withDatabase(base: string, name: string): string {
  const url = new URL(base);
  url.pathname = `/${name}`;
  return url.toString();
}

/** Creates a fresh migrated database for one test file. Call `drop()` in afterAll. */
export function createTestDatabase(options: { poolSize?: number } = {}): Promise<TestDatabase> {
  return createDatabaseOn(inject('databaseUrl'), {
    prefix: 'outboxkit_t',
    template: inject('templateDatabase'),
    poolSize: options.poolSize,
  });
}

/**
 * Creates a database named `<prefix>_<random>` on the server of `base` (a connection string), from
 * `template` if given (else empty: no outboxkit schema), with a pool on it. Call `drop()` after.
 */
export async function createDatabaseOn(
  base: string,
  options: { prefix: string; template?: string; poolSize?: number },
): Promise<TestDatabase> {
  const name = `${options.prefix}_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: base });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${name}${options.template ? ` TEMPLATE ${options.template}` : ''}`);
  } finally {
    await admin.end();
  }
  const url = withDatabase(base, name);
  const pool = new pg.Pool({ connectionString: url, max: options.poolSize ?? 10 });
  let dropped = false;
  return {
    url,
    pool,
    async drop() {
      if (dropped) return;
      dropped = true;
      // pool.end() resolves before its sockets are closed; DROP ... WITH (FORCE) may then kill one,
      // and an unheard pool 'error' would fail the run after every test passed.
      pool.on('error', () => {});
      await pool.end();
      const c = new pg.Client({ connectionString: base });
      await c.connect();
      try {
        await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      } finally {
        await c.end();
      }
    },
  };
}

/** Outbox rows of `topic` not yet published, in the default schema. */
export async function pendingOn(pool: pg.Pool, topic: string): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NULL',
    [topic],
  );
  return rows[0]!.n;
}
