/**
 * Shared set-up of benchmarks: a fresh migrated database and the services' addresses, the pending
 * events of the relay benchmarks, the events of the consumer benchmarks.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { type Kafka } from 'kafkajs';
import pg from 'pg';
import { v7 as uuidv7 } from 'uuid';
import { ensureServices, ensureWalPostgres } from '../scripts/services.js';
import { migrate } from '../src/migrate.js';
import { HEADER_EVENT_ID, HEADER_EVENT_TYPE } from '../src/outbox/event.js';

export interface BenchDatabase {
  url: string;
  brokers: string[];
  drop(): Promise<void>;
}

/**
 * Creates and migrates a throwaway database for one benchmark; `drop()` removes it (and the
 * replication slots left on it). With `migrated: false` the database is left empty
 * (bench/side-by-side.ts migrates it with the code it measures). With `server: 'wal'` it is made
 * on the PostgreSQL at wal_level=logical (`ensureWalPostgres()`, WAL_DATABASE_URL) instead of the
 * main one; `walPublication` then also creates the WAL source's publication
 * (`migrate({ walPublication: true })`).
 */
export async function benchDatabase(
  options: { migrated?: boolean; server?: 'main' | 'wal'; walPublication?: boolean } = {},
): Promise<BenchDatabase> {
  const services = await ensureServices();
  const serverUrl = options.server === 'wal' ? await ensureWalPostgres() : services.databaseUrl;
  const name = `outboxkit_bench_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${name}`);
  await admin.end();
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  if (options.migrated !== false)
    await migrate({ connectionString: url.toString(), ...(options.walPublication ? { walPublication: true } : {}) });
  return {
    url: url.toString(),
    brokers: services.kafkaBrokers,
    async drop() {
      const c = new pg.Client({ connectionString: serverUrl });
      await c.connect();
      // A database with a replication slot cannot be dropped: its slots go first, after any walsender
      // still reading one (a reader that was just stopped) has ended.
      await c.query(
        'SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots WHERE database = $1 AND active',
        [name],
      );
      await c.query('SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1', [name]);
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      await c.end();
    },
  };
}

/** A one-line description of the machine, for results. */
export async function machine(): Promise<string> {
  const os = await import('node:os');
  return `${os.cpus().length} cores, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}, ${new Date().toISOString().slice(0, 10)}`;
}

/** The business table of the write benchmarks: one row per transaction. */
export const BUSINESS_TABLE_DDL = 'CREATE TABLE biz (id uuid PRIMARY KEY, data text NOT NULL)';

/** One business transaction on a pooled client: BEGIN; a row into biz (a fresh UUID `id`); `body`; COMMIT. */
export async function businessTransaction(
  pool: pg.Pool,
  body: (client: pg.PoolClient, id: string) => Promise<unknown>,
): Promise<void> {
  const client = await pool.connect();
  try {
    const id = randomUUID();
    await client.query('BEGIN');
    await client.query('INSERT INTO biz (id, data) VALUES ($1, $2)', [id, 'some business data']);
    await body(client, id);
    await client.query('COMMIT');
  } finally {
    client.release();
  }
}

/**
 * B1's transaction on `pool` with the outbox writer `createOutbox` makes (a tree's built code, or
 * this checkout's): creates the business table, checkpoints, and returns the operation (one
 * business row plus `enqueue()` of one 256-byte JSON event, NOTIFY on, a fresh key each).
 */
export async function b1Operation(
  pool: pg.Pool,
  createOutbox: (options: { notify: boolean }) => {
    enqueue(tx: pg.PoolClient, event: { topic: string; key: string; type: string; payload: unknown }): Promise<unknown>;
  },
): Promise<() => Promise<void>> {
  await pool.query(BUSINESS_TABLE_DDL);
  await pool.query('CHECKPOINT');
  const outbox = createOutbox({ notify: true });
  const payload = paddedJson({ orderId: 'x' }, 256);
  return () =>
    businessTransaction(pool, (c, id) =>
      outbox.enqueue(c, { topic: 'orders', key: id, type: 'order.created', payload }),
    );
}

/** A JSON object of `fields` padded (member `pad`) to `bytes` bytes of JSON text, for fixed-size events. */
export function paddedJson(fields: Record<string, unknown>, bytes: number): Record<string, unknown> {
  const pad = bytes - Buffer.byteLength(JSON.stringify({ ...fields, pad: '' }));
  if (pad < 0) throw new Error(`${JSON.stringify(fields)} is longer than ${bytes} bytes of JSON`);
  return { ...fields, pad: 'x'.repeat(pad) };
}

/**
 * Inserts `count` pending events of 256 bytes on `topic` into the outbox in one statement, keys
 * `key-<i mod keys>` with their lanes from `laneOf` (the writer's, so the relay's lanes cover them).
 */
export async function seedPending(
  pool: pg.Pool,
  options: { topic: string; count: number; keys: number; laneOf: (key: string) => number },
): Promise<void> {
  const keys = Array.from({ length: options.keys }, (_, i) => `key-${i}`);
  await pool.query(
    `INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload)
     SELECT gen_random_uuid(), $1, k.key, k.lane, 'bench', convert_to(rpad('x', 256, 'x'), 'UTF8')
       FROM generate_series(1, $2::int) i
       JOIN unnest($3::text[], $4::smallint[]) WITH ORDINALITY AS k(key, lane, n) ON k.n = (i % $5) + 1`,
    [options.topic, options.count, keys, keys.map(options.laneOf), options.keys],
  );
}

/** Events neither published nor parked. */
export async function pendingCount(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query<{ n: number }>(
    // The pending index's predicate: counting does not scan the whole table during the drain.
    'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL AND parked_at IS NULL',
  );
  return rows[0]!.n;
}

/**
 * Polls the pending count every 50 ms until none of `count` seeded events is left, calling
 * `onTick` before each poll (it may throw to give up) and `onFirst` when the first published event
 * is seen. Returns the drain's duration in ms, from
 * the first poll that saw fewer than `count` (the first published event; start-up and lane
 * acquisition are not drain) to the poll that saw none.
 */
export async function timeDrain(
  pool: pg.Pool,
  count: number,
  onTick: () => void = () => {},
  onFirst: () => void = () => {},
): Promise<number> {
  let t0 = 0;
  let left = count;
  while (left > 0) {
    onTick();
    await new Promise((r) => setTimeout(r, 50));
    left = await pendingCount(pool);
    if (t0 === 0 && left < count) {
      t0 = performance.now();
      onFirst();
    }
  }
  return performance.now() - t0;
}

/**
 * Spawns the built relay daemon (`node <cli> relay`, no TypeScript loader in its memory) on
 * `databaseUrl`, metrics off, warnings only, its output inherited; `args` are more flags of
 * `outboxkit relay` (e.g. `['--kafka-client', 'platformatic']`).
 * BENCH_RELAY_NODE_ARGS adds Node.js flags, e.g. '--cpu-prof --cpu-prof-dir=/tmp/prof'.
 */
export function startRelayDaemon(
  cli: string,
  databaseUrl: string,
  brokers: string[],
  args: readonly string[] = [],
): ChildProcess {
  return spawn(
    process.execPath,
    [
      ...(process.env.BENCH_RELAY_NODE_ARGS ?? '').split(' ').filter(Boolean),
      cli,
      'relay',
      '--metrics-port',
      '-1',
      '--log-level',
      'warn',
      ...args,
    ],
    { env: { ...process.env, DATABASE_URL: databaseUrl, KAFKA_BROKERS: brokers.join(',') }, stdio: 'inherit' },
  );
}

/**
 * Produces `count` events to `topic` (idempotent producer, acks=all, 2,000 a request) as the
 * outbox relay publishes them: key `order-<i mod 10,000>`, the `event-id` (UUIDv7) and
 * `event-type` headers, `value(i)` as the value.
 */
export async function produceEvents(
  kafka: Kafka,
  topic: string,
  count: number,
  value: (i: number) => string,
): Promise<void> {
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  try {
    for (let i = 0; i < count; i += 2_000) {
      await producer.send({
        topic,
        acks: -1,
        messages: Array.from({ length: Math.min(2_000, count - i) }, (_, j) => ({
          key: `order-${(i + j) % 10_000}`,
          value: value(i + j),
          headers: { [HEADER_EVENT_ID]: uuidv7(), [HEADER_EVENT_TYPE]: 'order.created' },
        })),
      });
    }
  } finally {
    await producer.disconnect();
  }
}

/**
 * Open-loop writers: `clients` clients call `write()` on a fixed schedule, `rate` calls per second
 * in all, so that a slow call shows as latency instead of lowering the rate. A call's latency (ms)
 * goes to `latencies[w]` when `window()` gave the same `w` at its start and at its end (`null`: not
 * counted). `stop()` resolves once every client has finished its call in flight.
 */
export function openLoopWriters<W extends string>(options: {
  clients: number;
  rate: number;
  write: () => Promise<unknown>;
  window: () => W | null;
  latencies: Record<W, number[]>;
}): { failures(): number; stop(): Promise<void> } {
  const { clients, rate, write, window, latencies } = options;
  let stopping = false;
  let failures = 0;
  const client = async (c: number) => {
    const interval = (1000 * clients) / rate;
    let next = performance.now() + (c * interval) / clients;
    while (!stopping) {
      const wait = next - performance.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      next += interval;
      const w = window();
      const started = performance.now();
      try {
        await write();
        if (w !== null && w === window()) latencies[w].push(performance.now() - started);
      } catch {
        failures++;
      }
    }
  };
  const running = Array.from({ length: clients }, (_, c) => client(c));
  return {
    failures: () => failures,
    async stop() {
      stopping = true;
      await Promise.all(running);
    },
  };
}
