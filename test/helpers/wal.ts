/**
 * The WAL source's tests run against a PostgreSQL at wal_level=logical: WAL_DATABASE_URL, else
 * the project's own cluster on 127.0.0.1:5433 that `npm run services:up` (and test/global-setup.ts)
 * start. When it does not answer, these helpers fail the test with the reason; they never skip it.
 */
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, inject } from 'vitest';
import { ensureLogicalSlot, ensurePublication } from '../../relay/wal/slot-sql.js';
import type { WalRelayOptions } from '../../relay/wal/wal-relay.js';
import { ensureWalPostgres } from '../../scripts/services.js';
import { migrate } from '../../src/migrate.js';
import { kill } from './processes.js';
import {
  createWalSlotReader,
  type WalSlotReader,
  type WalSlotReaderOptions,
  type WalTransaction,
} from '../../relay/wal/slot-reader.js';
import { createDatabaseOn, type TestDatabase } from './db.js';
import { waitFor } from './wait-for.js';

/**
 * Returns the WAL server's URL once it answers at wal_level=logical.
 *
 * @throws Error naming `npm run services:up` and WAL_DATABASE_URL when it does not.
 */
export async function requireWalDatabaseUrl(): Promise<string> {
  // The cluster project has no global setup: its WAL tests bring the server up themselves.
  const url = inject('walDatabaseUrl') ?? (await ensureWalPostgres());
  const setupError = inject('walDatabaseError') ?? null;
  const fix =
    'Run `npm run services:up` (it starts a PostgreSQL at wal_level=logical on 127.0.0.1:5433), ' +
    'or set WAL_DATABASE_URL to such a server.';
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3_000 });
  client.on('error', () => {});
  try {
    await client.connect();
    const { rows } = await client.query<{ wal_level: string }>('show wal_level');
    const level = rows[0]?.wal_level;
    if (level !== 'logical') {
      throw new Error(`The WAL tests' PostgreSQL at ${url} runs at wal_level=${level ?? '?'}, not logical. ${fix}`);
    }
    return url;
  } catch (err) {
    if (err instanceof Error && err.message.includes(fix)) throw err;
    throw new Error(
      `The WAL tests' PostgreSQL does not answer at ${url}: ${String(err)}.` +
        `${setupError === null ? '' : ` The test setup said: ${setupError.replace(/\.$/, '')}.`} ${fix}`,
      { cause: err },
    );
  } finally {
    await client.end().catch(() => {});
  }
}

/**
 * A fresh, empty database on the WAL server for one test file (replication slots belong to a
 * database). Drop every slot on it before `drop()`: PostgreSQL refuses to drop a database that a
 * slot uses.
 */
export async function createWalTestDatabase(options: { poolSize?: number } = {}): Promise<TestDatabase> {
  const db = await createDatabaseOn(await requireWalDatabaseUrl(), {
    prefix: 'outboxkit_w',
    poolSize: options.poolSize,
  });
  const dropDatabase = db.drop.bind(db);
  return {
    ...db,
    async drop() {
      // A slot a failed test left behind would otherwise block DROP DATABASE (and retain WAL).
      await db.pool.query(
        `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
          WHERE database = current_database() AND active_pid IS NOT NULL`,
      );
      await waitFor(
        async () => {
          const { rows } = await db.pool.query<{ n: number }>(
            `SELECT count(*)::int AS n FROM pg_replication_slots WHERE database = current_database() AND active`,
          );
          return rows[0]?.n === 0;
        },
        { timeoutMs: 10_000, message: 'walsenders of the test database did not end' },
      );
      await db.pool.query(
        `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()`,
      );
      await dropDatabase();
    },
  };
}

/** A pg_lsn as a number of bytes; accepts the library's padded form (`00000000/019782D0`). */
export function lsnToBigInt(lsn: string): bigint {
  const m = /^([0-9A-F]{1,8})\/([0-9A-F]{1,8})$/i.exec(lsn);
  if (!m?.[1] || !m[2]) throw new Error(`not an LSN: ${lsn}`);
  return (BigInt(`0x${m[1]}`) << 32n) | BigInt(`0x${m[2]}`);
}

/** A number of bytes as PostgreSQL prints a pg_lsn (`0/19782D0`). */
export function bigIntToLsn(n: bigint): string {
  return `${(n >> 32n).toString(16).toUpperCase()}/${(n & 0xffffffffn).toString(16).toUpperCase()}`;
}

/** The server's current WAL write position (`pg_current_wal_lsn()`), in bytes. */
export async function currentWalLsn(pool: pg.Pool): Promise<bigint> {
  const { rows } = await pool.query<{ lsn: string }>('SELECT pg_current_wal_lsn()::text AS lsn');
  return lsnToBigInt(rows[0]!.lsn);
}

/** The slot's `confirmed_flush_lsn` as bytes (pg_replication_slots). */
export async function confirmedFlush(pool: pg.Pool, slot: string): Promise<bigint> {
  const { rows } = await pool.query<{ lsn: string }>(
    'SELECT confirmed_flush_lsn::text AS lsn FROM pg_replication_slots WHERE slot_name = $1',
    [slot],
  );
  const lsn = rows[0]?.lsn;
  if (lsn === undefined) throw new Error(`no replication slot ${slot}`);
  return lsnToBigInt(lsn);
}

/** Whether a walsender holds the slot now (pg_replication_slots.active). */
export async function slotActive(pool: pg.Pool, slot: string): Promise<boolean> {
  const { rows } = await pool.query<{ active: boolean }>(
    'SELECT active FROM pg_replication_slots WHERE slot_name = $1',
    [slot],
  );
  return rows[0]?.active === true;
}

/** Waits until no walsender holds the slot (a stopped reader's connection has ended). */
export async function waitForSlotInactive(pool: pg.Pool, slot: string): Promise<void> {
  await waitFor(async () => !(await slotActive(pool, slot)), { timeoutMs: 10_000, message: `slot ${slot} busy` });
}

/** A slot name of its own for one test: `<prefix>_` and 8 random hex digits. */
export function randomSlotName(prefix: string): string {
  return `${prefix}_${randomBytes(4).toString('hex')}`;
}

/**
 * Creates `outbox_events` in the public schema, shaped like outboxkit.outbox_events (without the
 * relay's columns), for tests that read the stream without the migrations.
 *
 * @param options.headers - Whether to add the `headers jsonb` column. @defaultValue false
 */
export async function createOutboxEventsTable(pool: pg.Pool, options: { headers?: boolean } = {}): Promise<void> {
  await pool.query(`
    CREATE TABLE outbox_events (
      seq bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
      event_id uuid NOT NULL UNIQUE DEFAULT gen_random_uuid(),
      topic text NOT NULL,
      key text,
      type text NOT NULL,
      payload bytea NOT NULL,${options.headers === true ? "\n      headers jsonb NOT NULL DEFAULT '{}'::jsonb," : ''}
      created_at timestamptz NOT NULL DEFAULT now()
    )`);
}

/**
 * The client connections and replication slots one WAL test opens: `connect()` and `trackSlot()`
 * record them, `release()` (in `afterEach`, after the test's readers are stopped) ends the clients
 * and drops the slots.
 */
export class WalTestResources {
  private readonly clients: pg.Client[] = [];
  private readonly slots: string[] = [];

  /** A client connection of its own (for transactions that interleave), ended by `release()`. */
  async connect(url: string): Promise<pg.Client> {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    this.clients.push(c);
    return c;
  }

  /** Records a slot for `release()` to drop. */
  trackSlot(slot: string): void {
    this.slots.push(slot);
  }

  /**
   * Ends the clients, then drops each slot once no walsender holds it (waits up to 10 s a slot).
   * Stop the readers first: a slot a reader still holds is never released.
   */
  async release(pool: pg.Pool): Promise<void> {
    for (const c of this.clients.splice(0)) await c.end().catch(() => {});
    for (const slot of this.slots.splice(0)) {
      await waitForSlotInactive(pool, slot);
      await pool.query('SELECT pg_drop_replication_slot($1)', [slot]);
    }
  }
}

/** A started WAL slot reader and the transactions it has handed over. */
export interface RecordingReader {
  reader: WalSlotReader;
  /** Transactions handed over, in order. */
  txs: WalTransaction[];
}

/**
 * Creates and starts a WAL slot reader that records every transaction it hands over, then runs
 * `options.handler` (when given) on it and the reader (so a handler can confirm before this
 * function has returned the reader). The reader is pushed onto `started` before it starts, so
 * the test's `afterEach` stops it even when start() fails.
 */
export async function startRecordingReader(
  options: Omit<WalSlotReaderOptions, 'handler'> & {
    handler?: (tx: WalTransaction, reader: WalSlotReader) => Promise<void>;
  },
  started: WalSlotReader[],
): Promise<RecordingReader> {
  const txs: WalTransaction[] = [];
  const { handler, ...rest } = options;
  const reader = createWalSlotReader({
    ...rest,
    handler: async (tx) => {
      txs.push(tx);
      await handler?.(tx, reader);
    },
  });
  started.push(reader);
  await reader.start();
  return { reader, txs };
}

/**
 * Waits until one of `txs` holds `key` among `describe(tx)`, and returns the first such.
 *
 * @param options.timeoutMs - ms. @defaultValue 15_000
 * @throws Error naming the key and what was handed over, past the timeout.
 */
export async function waitForTransaction<K>(
  txs: readonly WalTransaction[],
  describe: (tx: WalTransaction) => K[],
  key: K,
  options: { timeoutMs?: number } = {},
): Promise<WalTransaction> {
  return waitFor(() => txs.find((tx) => describe(tx).includes(key)), {
    timeoutMs: options.timeoutMs ?? 15_000,
    message: () => `${String(key)} was not handed over; got ${JSON.stringify(txs.map(describe))}`,
  });
}

/**
 * What the WAL relay test files share: a database on the WAL server (`poolSize` connections),
 * migrated, with the publication `publication` of `outboxkit.outbox_events`; after each test the
 * child processes it started are SIGKILLed, its relays stopped, its slots dropped (once free) and
 * the outbox and `wal_slots` emptied; after the file the database is dropped. Call at the top level
 * of the file; `db` is set from `beforeAll` on.
 */
export function walRelayTestFile(publication: string, options: { poolSize?: number } = {}) {
  const file = {
    db: undefined as unknown as TestDatabase,
    relays: [] as { stop(options?: { timeoutMs?: number }): Promise<void> }[],
    slots: [] as string[],
    children: [] as ChildProcess[],
    /**
     * A WAL relay's options on this file's database and publication and the test broker, with
     * short timings so that a failure and the recovery show within a test: status every 200 ms,
     * a 3 s broker timeout, retries from 50 ms up to 500 ms. `overrides` replace any of them.
     */
    relayOptions(slot: string, overrides: Partial<WalRelayOptions> = {}): WalRelayOptions {
      return {
        connection: file.db.url,
        slot,
        publication,
        brokers: inject('kafkaBrokers'),
        statusIntervalMs: 200,
        brokerTimeoutMs: 3_000,
        retryInitialMs: 50,
        retryMaxMs: 500,
        ...overrides,
      };
    },
    /**
     * A slot named `<prefix>_<8 hex digits>`, made now (before the test's rows) and recorded in
     * `wal_slots` as a relay records one it made, with no resync pending: a relay streams it
     * without a resync. Dropped after the test.
     */
    async createStreamingSlot(prefix: string): Promise<string> {
      const slot = randomSlotName(prefix);
      await ensureLogicalSlot(file.db.pool, slot);
      file.slots.push(slot);
      await file.db.pool.query('INSERT INTO outboxkit.wal_slots (slot_name, resync_pending) VALUES ($1, false)', [
        slot,
      ]);
      return slot;
    },
  };
  beforeAll(async () => {
    file.db = await createWalTestDatabase({ poolSize: options.poolSize ?? 4 });
    await migrate({ connectionString: file.db.url });
    await ensurePublication(file.db.pool, publication, ['outboxkit.outbox_events']);
  }, 60_000);
  afterEach(async () => {
    const { pool } = file.db;
    for (const c of file.children.splice(0)) await kill(c, 'SIGKILL');
    for (const r of file.relays.splice(0)) await r.stop({ timeoutMs: 2_000 });
    for (const slot of file.slots.splice(0)) {
      await waitFor(async () => !(await slotActive(pool, slot)), { timeoutMs: 10_000, message: `slot ${slot} busy` });
      await pool.query('SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1', [
        slot,
      ]);
    }
    await pool.query('DELETE FROM outboxkit.outbox_events');
    await pool.query('DELETE FROM outboxkit.wal_slots');
    await pool.query('DELETE FROM outboxkit.wal_slot_leases');
  });
  afterAll(async () => {
    await file.db?.drop();
  });
  return file;
}
