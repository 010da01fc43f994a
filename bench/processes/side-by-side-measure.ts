/**
 * One measurement of bench/side-by-side.ts, in a process of its own, of the built code of one tree
 * (its `dist/`, reached through the tree's package.json `exports` and `bin`, as a user's import
 * would): migrates the empty database DATABASE_URL with that tree's `migrate()`, measures, and
 * prints `rate <per second>` as its last line.
 *
 * - `b1 <clients>`: `<clients>` workers (a pool of as many connections) run transactions of one row
 *   into a business table plus `enqueue()` of one event of 256 bytes of JSON (NOTIFY on, the
 *   default), 1 s of warm-up, then BENCH_B1_MS (transactions/s); with BENCH_SYNC_COMMIT=off its
 *   sessions run with `synchronous_commit = off`, so that the disk's flush latency (the same for
 *   both trees, and the noisiest part of a commit on a shared machine) leaves the code's own cost;
 * - `b2`: BENCH_EVENTS pending events of 256 bytes over 1,000 keys (lanes from the tree's
 *   `laneOf`), drained by the tree's `outboxkit relay` daemon (a child process of this one) into
 *   BENCH_TOPIC, timed from its first published event to its last (events/s);
 * - `b4`: the tree's `createDedupConsumer` reads the BENCH_EVENTS events of BENCH_TOPIC in a fresh
 *   group, its handler one INSERT in the consumer's transaction, timed from the first applied event
 *   to the last (events/s).
 *
 * Usage: node --import tsx bench/processes/side-by-side-measure.ts <tree> <b1|b2|b4> [<clients>]
 * Environment: DATABASE_URL, KAFKA_BROKERS, BENCH_TOPIC (b2, b4), BENCH_EVENTS (b2, b4),
 * BENCH_B1_MS and BENCH_SYNC_COMMIT (b1).
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import type * as ConsumerEntry from '../../consumer/index.js';
import type * as Core from '../../src/index.js';
import { clock, clockRate, throughput, withTimeout } from '../lib.js';
import { b1Operation, seedPending, startRelayDaemon, timeDrain } from '../support.js';

/** How long (ms) a drain or a consumer run may take before the measurement fails. */
const RUN_TIMEOUT_MS = 20 * 60_000;
/** bench/consumer.ts's B4 set-up: 3 partitions consumed concurrently, a pool of 4. */
const B4_CONCURRENCY = 3;
const B4_POOL_SIZE = 4;

const [treeArg, kind, clientsArg] = process.argv.slice(2);
if (!kind || !treeArg || !['b1', 'b2', 'b4'].includes(kind) || (kind === 'b1' && !clientsArg))
  throw new Error('usage: side-by-side-measure.ts <tree> <b1|b2|b4> [<clients>]');
const tree: string = treeArg;
const env = (name: string): string => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const databaseUrl = env('DATABASE_URL');
const brokers = env('KAFKA_BROKERS').split(',');

const pkg = JSON.parse(readFileSync(path.join(tree, 'package.json'), 'utf8')) as {
  exports: Record<string, { import: string }>;
  bin: Record<string, string>;
};
/** The file of the tree's package entry point `name` ('.', './consumer'), as a URL to import. */
const entry = (name: string) => pathToFileURL(path.join(tree, pkg.exports[name]!.import)).href;

const core = (await import(entry('.'))) as typeof Core;
await core.migrate({ connectionString: databaseUrl });
// A relay daemon this process started must not outlive it (SIGTERM from bench/side-by-side.ts).
process.once('SIGTERM', () => process.exit(143));

async function b1(clients: number): Promise<number> {
  const syncCommitOff = process.env.BENCH_SYNC_COMMIT === 'off';
  const pool = new pg.Pool({
    connectionString: databaseUrl,
    max: clients,
    ...(syncCommitOff ? { options: '-c synchronous_commit=off' } : {}),
  });
  try {
    const op = await b1Operation(pool, core.createOutbox);
    // A fresh process: its first second is the JIT's.
    await throughput(op, 1_000, clients);
    return await throughput(op, Number(env('BENCH_B1_MS')), clients);
  } finally {
    await pool.end();
  }
}

async function b2(events: number): Promise<number> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 2 });
  try {
    await seedPending(pool, { topic: env('BENCH_TOPIC'), count: events, keys: 1_000, laneOf: core.laneOf });
    // Every drain starts from the same state: the table's statistics taken (not by an autovacuum
    // that may or may not come during the drain) and the seed's pages written (not by the
    // checkpointer during the drain).
    await pool.query('ANALYZE outboxkit.outbox_events');
    await pool.query('CHECKPOINT');
    const relay = startRelayDaemon(path.join(tree, pkg.bin.outboxkit!), databaseUrl, brokers);
    const kill = () => relay.kill('SIGKILL');
    process.once('exit', kill);
    const deadline = performance.now() + RUN_TIMEOUT_MS;
    try {
      const ms = await timeDrain(pool, events, () => {
        if (relay.exitCode !== null || relay.signalCode !== null)
          throw new Error(`the relay exited (${relay.exitCode ?? relay.signalCode}) before the drain ended`);
        if (performance.now() > deadline) throw new Error(`the drain did not end within ${RUN_TIMEOUT_MS} ms`);
      });
      const { rows } = await pool.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NOT NULL',
      );
      if (rows[0]!.n !== events) throw new Error(`${events - rows[0]!.n} events were not published (parked)`);
      return events / (ms / 1_000);
    } finally {
      const exited = new Promise((r) => relay.once('exit', r));
      relay.kill('SIGTERM');
      await exited;
      process.off('exit', kill);
    }
  } finally {
    await pool.end();
  }
}

async function b4(events: number): Promise<number> {
  const { createDedupConsumer } = (await import(entry('./consumer'))) as typeof ConsumerEntry;
  const pool = new pg.Pool({ connectionString: databaseUrl, max: B4_POOL_SIZE });
  try {
    await pool.query('CREATE TABLE bench_effects (event_id uuid NOT NULL, payload text NOT NULL)');
    await pool.query('CHECKPOINT');
    const c = clock(events);
    let unexpected = 0;
    const consumer = createDedupConsumer({
      kafka: new Kafka({ clientId: 'outboxkit-bench', brokers, logLevel: logLevel.NOTHING }),
      groupId: `bench-side-by-side-${randomBytes(4).toString('hex')}`,
      topics: [env('BENCH_TOPIC')],
      database: pool,
      fromBeginning: true,
      partitionsConsumedConcurrently: B4_CONCURRENCY,
      transactionScope: 'message',
      handler: async ({ tx, event }) => {
        await tx.query('INSERT INTO bench_effects (event_id, payload) VALUES ($1, $2)', [
          event.id,
          event.value!.toString(),
        ]);
      },
    });
    consumer.on('consumer:applied', () => c.tick());
    consumer.on('consumer:duplicate', () => unexpected++);
    consumer.on('consumer:dead-lettered', () => unexpected++);
    await consumer.start();
    try {
      await withTimeout(c.done, RUN_TIMEOUT_MS, 'the dedup consumer');
    } finally {
      await consumer.stop();
    }
    if (unexpected > 0) throw new Error(`${unexpected} events were not applied (duplicate or dead-lettered)`);
    return clockRate(c);
  } finally {
    await pool.end();
  }
}

const rate =
  kind === 'b1'
    ? await b1(Number(clientsArg))
    : kind === 'b2'
      ? await b2(Number(env('BENCH_EVENTS')))
      : await b4(Number(env('BENCH_EVENTS')));
process.stdout.write(`rate ${rate}\n`);
// Nothing of the measured code may keep this process, and so the run, waiting.
process.exit(0);
