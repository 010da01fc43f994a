/**
 * WAL source vs table source (issue 19, point 9): `npm run bench -- wal`. Every measurement runs
 * on the same server, the PostgreSQL at wal_level=logical (`ensureWalPostgres()`,
 * WAL_DATABASE_URL), in one run: two fresh databases on it, one for each mode (`table`: migrated;
 * `wal`: migrated with the WAL publication, `migrate({ walPublication: true })`), so that the
 * ratios compare like with like. Rounds alternate the order of what they compare.
 *
 * - **B1** (transactions/s), 1 and 32 clients, no relay running: `BEGIN`, one business INSERT,
 *   the outbox write, `COMMIT` (bench/outbox.ts's transaction). Compared, each pair by
 *   `compare()` of bench/lib.ts (a warm-up, then interleaved rounds, the median per-round ratio):
 *   `createOutbox({ source: 'wal' }).enqueue()` against the same transaction writing the same row
 *   by hand (one plain pg `INSERT … VALUES` of the columns `insertEventsSql()` writes with
 *   `keyLocks` null: a UUIDv7 event id, topic, key, lane, type, the JSON payload's bytes, headers
 *   `{}`), goal ≥ 0.95; the WAL writer and the table writer (`enqueue()`, NOTIFY on, the default)
 *   each against the transaction without any outbox row; the WAL writer against the table writer.
 * - **B2** (events/s): BENCH_EVENTS pending events of 256 bytes over 1,000 keys
 *   (bench/relay-support.ts), committed BENCH_TX_EVENTS per transaction (the WAL relay reads
 *   transactions), drained into a 6-partition topic by the built `outboxkit relay` daemon, table
 *   mode and `--source wal`, timed from the first published event to the last (pending rows
 *   polled every 50 ms: the WAL relay deletes the rows it published); raw kafkajs producing the
 *   same messages with the relay's producer settings (`rawKafkajsProduce()`); and each relay with
 *   a producer that acknowledges at once (its database half alone: `drainWithNullPublisher()`,
 *   `drainWalWithNullPublisher()`). Goal: WAL relay / raw ≥ 0.80. The relay daemon's CPU-seconds
 *   per 1,000 events (utime + stime of /proc/<pid>/stat from its first published event to its
 *   last) and its largest RSS while draining. The WAL relay's slot is made by a first start of the
 *   daemon, before anything is seeded; before each WAL drain the (idle, empty) slot is advanced to
 *   the server's current position with `pg_replication_slot_advance()`, so that the drain does
 *   not first decode what the table mode's rounds wrote in the other database.
 * - **B3** (ms): open-loop writers (16 at a time, one `enqueue()` per transaction) at each rate of
 *   BENCH_RATES; the time from COMMIT sent to receipt by a kafkajs consumer in a process of its
 *   own, through the table relay (NOTIFY on) and through the WAL relay (`cli/main.ts relay`,
 *   defaults, both running throughout), against raw produce → receipt (bench/latency.ts's method
 *   and pieces, bench/latency-support.ts). What each relay adds at p50 and p99, over all rounds'
 *   events. Goal at 1,000 events/s: the WAL relay adds p50 ≤ 5 ms, p99 ≤ 20 ms. Both relays' RSS
 *   is read every second (these run under tsx: B2's figure is the built daemon's).
 *
 * Knobs (env): BENCH_ONLY (`b1,b2,b3`), BENCH_B1_ROUNDS (5), BENCH_B1_MS (ms per side and round,
 * 2,000), BENCH_SYNC_COMMIT (`on`; `off` runs B1's sessions with synchronous_commit off),
 * BENCH_EVENTS (60,000), BENCH_ROUNDS (B2 rounds, 3), BENCH_TX_EVENTS (events per seeded
 * transaction, 1), BENCH_RATES (events/s, `200,1000`), BENCH_SECONDS (measured per path, rate and
 * round, 10), BENCH_WARMUP_S (2), BENCH_B3_ROUNDS (2). A short try: BENCH_B1_ROUNDS=1
 * BENCH_B1_MS=500 BENCH_EVENTS=3000 BENCH_ROUNDS=1 BENCH_SECONDS=3 BENCH_B3_ROUNDS=1.
 *
 * Needs `npm run build` (B2 measures the built CLI). Other sessions' work on the same server
 * and machine counts in every figure: the load average is printed at each stage.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import os from 'node:os';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { v7 as uuidv7 } from 'uuid';
import { createOutbox } from '../src/index.js';
import { laneOf } from '../src/outbox/event.js';
import {
  BENCH_APPLICATION,
  CpuMeter,
  f0,
  f1,
  f2,
  f3,
  knob,
  loadAverage,
  log,
  percentile,
  root,
  sleep,
  stopChild,
  table,
  waitFor,
  type Child,
} from './e2e-support.js';
import { compare, median, type Comparison } from './lib.js';
import {
  measurePhase,
  type Phase,
  rawSend,
  relaySend,
  startLatencyConsumer,
  startLatencyRelay,
} from './latency-support.js';
import {
  B2_BATCH,
  B2_KEYS,
  B2_PARTITIONS,
  builtCli,
  drainWalWithNullPublisher,
  drainWithDaemon,
  drainWithNullPublisher,
  rawKafkajsProduce,
  rssMb,
  seedB2Transactions,
} from './relay-support.js';
import {
  benchDatabase,
  BUSINESS_TABLE_DDL,
  businessTransaction,
  machine,
  startRelayDaemon,
  type BenchDatabase,
} from './support.js';

const ONLY = new Set((process.env.BENCH_ONLY ?? 'b1,b2,b3').split(',').map((s) => s.trim().toLowerCase()));
const B1_ROUNDS = knob('BENCH_B1_ROUNDS', 5);
const B1_MS = knob('BENCH_B1_MS', 2_000);
const SYNC_COMMIT_OFF = process.env.BENCH_SYNC_COMMIT === 'off';
const EVENTS = knob('BENCH_EVENTS', 60_000);
const ROUNDS = knob('BENCH_ROUNDS', 3);
const TX_EVENTS = Math.max(1, knob('BENCH_TX_EVENTS', 1));
const RATES = (process.env.BENCH_RATES ?? '200,1000')
  .split(',')
  .map((r) => Number(r.trim()))
  .filter((r) => r > 0);
const SECONDS = knob('BENCH_SECONDS', 10);
const WARMUP_S = knob('BENCH_WARMUP_S', 2);
const B3_ROUNDS = knob('BENCH_B3_ROUNDS', 2);
const say = (m: string) => log('wal', m);
const verdict = (ok: boolean) => (ok ? 'met' : '**not met**');

export async function run(): Promise<string> {
  builtCli();
  const startedAt = new Date();
  const loads: string[] = [`start ${loadAverage()}`];
  const tableDb = await benchDatabase({ server: 'wal' });
  const walDb = await benchDatabase({ server: 'wal', walPublication: true });
  const slot = `bench_wal_${randomBytes(4).toString('hex')}`;
  const sections: string[] = [];
  try {
    const server = await describeServer(walDb.url);
    if (ONLY.has('b1')) {
      sections.push(await b1(walDb));
      loads.push(`after B1 ${loadAverage()}`);
    }
    if (ONLY.has('b2') || ONLY.has('b3')) await primeSlot(walDb, slot);
    if (ONLY.has('b2')) {
      sections.push(await b2(tableDb, walDb, slot));
      loads.push(`after B2 ${loadAverage()}`);
    }
    if (ONLY.has('b3')) {
      sections.push(await b3(tableDb, walDb, slot));
      loads.push(`after B3 ${loadAverage()}`);
    }
    const endedAt = new Date();
    return [
      `Run ${startedAt.toISOString().slice(0, 16).replace('T', ' ')}–${endedAt.toISOString().slice(11, 16)} UTC, commit ${commit()}; machine: ${await machine()}; ${server}.`,
      `Load average (1, 5, 15 min): ${loads.join('; ')}.`,
      '',
      sections.join('\n\n'),
    ].join('\n');
  } finally {
    await tableDb.drop().catch((err: unknown) => say(`dropping the table-mode database failed: ${String(err)}`));
    await walDb.drop().catch((err: unknown) => say(`dropping the WAL-mode database failed: ${String(err)}`));
  }
}

/** The commit measured (`+ changes` when the tree has uncommitted changes). */
function commit(): string {
  const git = (...args: string[]) => execFileSync('git', args, { cwd: root, encoding: 'utf8' }).trim();
  try {
    const dirty = git('status', '--porcelain', '--untracked-files=no') !== '';
    return `${git('rev-parse', '--short', 'HEAD')}${dirty ? ' + uncommitted changes' : ''}`;
  } catch {
    return 'unknown';
  }
}

/** The server's version and its settings that bear on the figures. */
async function describeServer(url: string): Promise<string> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    const { rows } = await c.query<{ v: string; wal_level: string; fsync: string; sc: string; slots: number }>(
      `SELECT current_setting('server_version') AS v, current_setting('wal_level') AS wal_level,
              current_setting('fsync') AS fsync, current_setting('synchronous_commit') AS sc,
              (SELECT count(*)::int FROM pg_replication_slots) AS slots`,
    );
    const r = rows[0]!;
    return `PostgreSQL ${r.v} at ${new URL(url).host} (wal_level=${r.wal_level}, fsync ${r.fsync}, synchronous_commit ${r.sc}, ${r.slots} replication slot(s) on the server at start)`;
  } finally {
    await c.end();
  }
}

// ---------------------------------------------------------------------------------------------
// B1: the writer
// ---------------------------------------------------------------------------------------------

async function b1(db: BenchDatabase): Promise<string> {
  say('B1: the writer, 1 and 32 clients');
  const pool = new pg.Pool({
    connectionString: db.url,
    max: 32,
    ...(SYNC_COMMIT_OFF ? { options: '-c synchronous_commit=off' } : {}),
  });
  try {
    await pool.query(BUSINESS_TABLE_DDL);
    const walOutbox = createOutbox({ source: 'wal' });
    const tableOutbox = createOutbox();
    const payload = { orderId: 'x', amount: 1234, currency: 'EUR', lines: [{ sku: 'a', qty: 1 }] };
    const tx = (body: (c: pg.PoolClient, id: string) => Promise<unknown>) => businessTransaction(pool, body);
    const via = (outbox: typeof walOutbox) => () =>
      tx((c, id) => outbox.enqueue(c, { topic: 'orders', key: id, type: 'order.created', payload }));
    // The row the WAL writer writes (insertEventsSql with keyLocks null), as a user would write it.
    const byHand = () =>
      tx((c, id) =>
        c.query(
          `INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload, headers, aggregate_type, aggregate_id)
           VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, NULL)`,
          [uuidv7(), 'orders', id, laneOf(id), 'order.created', Buffer.from(JSON.stringify(payload)), '{}'],
        ),
      );
    const noOutbox = () => tx(async () => undefined);
    const rows: { c: Comparison; goal?: number }[] = [];
    for (const concurrency of [1, 32]) {
      const o = { concurrency, rounds: B1_ROUNDS, roundMs: B1_MS };
      const n = `${concurrency} client${concurrency === 1 ? '' : 's'}`;
      say(`B1 ${n}`);
      rows.push({
        c: await compare(`WAL enqueue(), ${n}`, via(walOutbox), 'the same INSERT by hand (pg)', byHand, o),
        goal: 0.95,
      });
      rows.push({ c: await compare(`WAL enqueue(), ${n}`, via(walOutbox), 'no outbox row', noOutbox, o) });
      rows.push({
        c: await compare(`table enqueue() (NOTIFY on), ${n}`, via(tableOutbox), 'no outbox row', noOutbox, o),
      });
      rows.push({
        c: await compare(`WAL enqueue(), ${n}`, via(walOutbox), 'table enqueue() (NOTIFY on)', via(tableOutbox), o),
      });
    }
    return [
      `### B1: the writer (transactions/s)`,
      '',
      `${B1_ROUNDS} rounds of ${B1_MS} ms per side after 500 ms of warm-up each, order alternating; synchronous_commit ${SYNC_COMMIT_OFF ? 'off' : 'as the server has it'}; no relay running; one database.`,
      '',
      table(
        ['candidate', 'baseline', 'ratio (median)', 'per round', 'candidate tx/s', 'baseline tx/s', 'goal'],
        rows.map(({ c, goal }) => [
          c.name,
          c.baseline,
          `**${f3(c.ratio)}**`,
          c.ratios.map(f2).join(' '),
          f0(c.candidateOpsPerSec),
          f0(c.baselineOpsPerSec),
          goal === undefined ? 'report' : `≥ ${goal}: ${verdict(c.ratio >= goal)}`,
        ]),
      ),
    ].join('\n');
  } finally {
    // B1's rows are not B2's: a WAL relay's first start would resync them (publish them from the table).
    await pool.query('TRUNCATE outboxkit.outbox_events, outboxkit.outbox_key_locks').catch(() => undefined);
    await pool.query('DROP TABLE IF EXISTS biz').catch(() => undefined);
    await pool.end();
  }
}

// ---------------------------------------------------------------------------------------------
// B2: the drain
// ---------------------------------------------------------------------------------------------

/** The WAL relay's flags for `slot`. */
const walArgs = (slot: string) => ['--source', 'wal', '--wal-slot', slot];

/**
 * Makes `slot` the way a user gets it: the built WAL relay daemon's first start creates and
 * records it (a resync of the empty outbox); stopped once a walsender reads it.
 */
async function primeSlot(db: BenchDatabase, slot: string): Promise<void> {
  const c = new pg.Client({ connectionString: db.url, application_name: BENCH_APPLICATION });
  await c.connect();
  const child = startRelayDaemon(builtCli(), db.url, db.brokers, walArgs(slot));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  try {
    await waitFor(
      `the WAL relay to read slot ${slot}`,
      async () => {
        if (child.exitCode !== null) throw new Error(`the WAL relay exited (${child.exitCode})`);
        return (
          (await c.query('SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active', [slot])).rowCount! > 0
        );
      },
      { timeoutMs: 60_000, everyMs: 250 },
    );
  } finally {
    child.kill('SIGTERM');
    await exited;
    await c.end();
  }
}

/**
 * Moves the idle `slot` to the server's current WAL position (its database's outbox must be
 * empty: nothing is skipped), once its former reader's walsender is gone.
 */
async function advanceSlot(pool: pg.Pool, slot: string): Promise<void> {
  const { rows } = await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_events');
  if (rows[0]!.n !== 0) throw new Error(`the WAL-mode outbox holds ${rows[0]!.n} rows before a round`);
  await waitFor(
    `slot ${slot} to be free`,
    async () =>
      (await pool.query('SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND NOT active', [slot])).rowCount! >
      0,
    { timeoutMs: 60_000, everyMs: 100 },
  );
  await pool.query('SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())', [slot]);
}

/** ANALYZE and CHECKPOINT after a seed, so that no drain meets the first autovacuum or the seed's checkpoint. */
async function settle(pool: pg.Pool): Promise<void> {
  await pool.query('ANALYZE outboxkit.outbox_events');
  await pool.query('CHECKPOINT');
}

type B2Run = 'table relay' | 'WAL relay' | 'raw kafkajs' | 'table relay, null publisher' | 'WAL relay, null publisher';
const B2_RUNS: readonly B2Run[] = [
  'table relay',
  'WAL relay',
  'raw kafkajs',
  'table relay, null publisher',
  'WAL relay, null publisher',
];

interface B2Round {
  /** Events/s of each run. */
  rate: Record<B2Run, number>;
  cpuPer1k: { table: number; wal: number };
  /** The relay daemon's CPU-seconds per second of drain: 1 is one core, all a JavaScript thread has. */
  cores: { table: number; wal: number };
  rssMb: { table: number; wal: number };
}

async function b2(tableDb: BenchDatabase, walDb: BenchDatabase, slot: string): Promise<string> {
  const kafka = new Kafka({ clientId: 'bench-wal', brokers: walDb.brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const topic = `bench-wal-b2-${randomUUID().slice(0, 8)}`;
  await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: B2_PARTITIONS }] });
  const tablePool = new pg.Pool({ connectionString: tableDb.url, max: 4, application_name: BENCH_APPLICATION });
  const walPool = new pg.Pool({ connectionString: walDb.url, max: 4, application_name: BENCH_APPLICATION });
  const seed = (url: string) => seedB2Transactions(url, { topic, count: EVENTS, perTransaction: TX_EVENTS });
  const rounds: B2Round[] = [];
  try {
    for (let r = 0; r < ROUNDS; r++) {
      const order = r % 2 === 0 ? B2_RUNS : [...B2_RUNS].reverse();
      const round: B2Round = {
        rate: {} as Record<B2Run, number>,
        cpuPer1k: { table: NaN, wal: NaN },
        cores: { table: NaN, wal: NaN },
        rssMb: { table: NaN, wal: NaN },
      };
      for (const which of order) {
        let ms: number;
        switch (which) {
          case 'table relay': {
            await tablePool.query('TRUNCATE outboxkit.outbox_events');
            await seed(tableDb.url);
            await settle(tablePool);
            const d = await drainWithDaemon(tablePool, {
              databaseUrl: tableDb.url,
              brokers: tableDb.brokers,
              count: EVENTS,
            });
            ms = d.ms;
            round.cpuPer1k.table = (d.cpuSeconds / EVENTS) * 1_000;
            round.cores.table = d.cpuSeconds / (d.ms / 1_000);
            round.rssMb.table = d.maxRssMb;
            break;
          }
          case 'WAL relay': {
            await advanceSlot(walPool, slot);
            await seed(walDb.url);
            await settle(walPool);
            const d = await drainWithDaemon(walPool, {
              databaseUrl: walDb.url,
              brokers: walDb.brokers,
              count: EVENTS,
              args: walArgs(slot),
            });
            ms = d.ms;
            round.cpuPer1k.wal = (d.cpuSeconds / EVENTS) * 1_000;
            round.cores.wal = d.cpuSeconds / (d.ms / 1_000);
            round.rssMb.wal = d.maxRssMb;
            break;
          }
          case 'raw kafkajs':
            ms = await rawKafkajsProduce(kafka, topic, EVENTS);
            break;
          case 'table relay, null publisher':
            await tablePool.query('TRUNCATE outboxkit.outbox_events');
            await seed(tableDb.url);
            await settle(tablePool);
            ms = await drainWithNullPublisher(tablePool);
            break;
          case 'WAL relay, null publisher':
            await advanceSlot(walPool, slot);
            await seed(walDb.url);
            await settle(walPool);
            ms = await drainWalWithNullPublisher(walPool, {
              databaseUrl: walDb.url,
              brokers: walDb.brokers,
              slot,
              count: EVENTS,
            });
            break;
        }
        round.rate[which] = EVENTS / (ms / 1_000);
        say(`B2 round ${r + 1}/${ROUNDS}: ${which} ${f0(round.rate[which])} events/s`);
      }
      rounds.push(round);
    }
  } finally {
    await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
    await admin.disconnect();
    await tablePool.end();
    await walPool.end();
  }

  const rates = (w: B2Run) => rounds.map((x) => x.rate[w]);
  const ratios = (a: B2Run, b: B2Run) => rounds.map((x) => x.rate[a] / x.rate[b]);
  const walRaw = median(ratios('WAL relay', 'raw kafkajs'));
  const ratioRow = (a: B2Run, b: B2Run, goal?: string) => {
    const xs = ratios(a, b);
    return [`${a} / ${b}`, `**${f3(median(xs))}**`, xs.map(f2).join(' '), goal ?? 'report'];
  };
  const cpu = (m: 'table' | 'wal') => rounds.map((x) => x.cpuPer1k[m]);
  const rss = (m: 'table' | 'wal') => rounds.map((x) => x.rssMb[m]);
  return [
    `### B2: the drain (events/s)`,
    '',
    `${EVENTS} events of 256 bytes, ${TX_EVENTS} per transaction, ${B2_KEYS} keys, topic of ${B2_PARTITIONS} partitions, batch ${B2_BATCH}; ${ROUNDS} rounds, the runs of odd rounds in the order of the table, of even ones reversed; relays: the built \`outboxkit relay\` daemon (child process), defaults.`,
    '',
    table(
      ['run', 'events/s (median)', 'per round'],
      B2_RUNS.map((w) => [w, f0(median(rates(w))), rates(w).map(f0).join(' ')]),
    ),
    '',
    table(
      ['ratio', 'median', 'per round', 'goal'],
      [
        ratioRow('WAL relay', 'raw kafkajs', `≥ 0.80: ${verdict(walRaw >= 0.8)}`),
        ratioRow('table relay', 'raw kafkajs'),
        ratioRow('WAL relay', 'table relay'),
        ratioRow('WAL relay, null publisher', 'raw kafkajs'),
        ratioRow('WAL relay', 'WAL relay, null publisher'),
      ],
    ),
    '',
    table(
      [
        'relay daemon',
        'CPU-s per 1,000 events (median)',
        'per round',
        'CPU while draining (cores) per round',
        'max RSS while draining (MB)',
        'per round',
      ],
      (['table', 'wal'] as const).map((m) => [
        m === 'table' ? 'table relay' : 'WAL relay',
        f3(median(cpu(m))),
        cpu(m).map(f3).join(' '),
        rounds.map((x) => f2(x.cores[m])).join(' '),
        f0(Math.max(...rss(m))),
        rss(m).map(f0).join(' '),
      ]),
    ),
  ].join('\n');
}

// ---------------------------------------------------------------------------------------------
// B3: added latency
// ---------------------------------------------------------------------------------------------

type B3Path = 'raw' | 'table' | 'wal';
const B3_PATHS: readonly B3Path[] = ['raw', 'table', 'wal'];
const B3_GROUPS = ['bench', 'relay', 'consumer', 'postgres', 'broker'];

async function b3(tableDb: BenchDatabase, walDb: BenchDatabase, slot: string): Promise<string> {
  say(`B3: latency at ${RATES.join(', ')} events/s`);
  const kafka = new Kafka({ clientId: 'bench-wal-latency', brokers: walDb.brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const hex = randomUUID().slice(0, 8);
  const topicOf = (path: B3Path, rate: number) => `bench-wal-b3-${path}-${rate}-${hex}`;
  const topics = RATES.flatMap((rate) => B3_PATHS.map((p) => topicOf(p, rate)));
  await admin.createTopics({ waitForLeaders: true, topics: topics.map((topic) => ({ topic, numPartitions: 3 })) });
  const pools = {
    tableWriter: new pg.Pool({ connectionString: tableDb.url, max: 20, application_name: 'latency-writer' }),
    walWriter: new pg.Pool({ connectionString: walDb.url, max: 20, application_name: 'latency-writer' }),
    tableMonitor: new pg.Pool({ connectionString: tableDb.url, max: 2, application_name: BENCH_APPLICATION }),
    walMonitor: new pg.Pool({ connectionString: walDb.url, max: 2, application_name: BENCH_APPLICATION }),
  };
  const children: Child[] = [];
  let consumer: Awaited<ReturnType<typeof startLatencyConsumer>> | undefined;
  let rssTimer: NodeJS.Timeout | undefined;
  const producer = kafka.producer({ allowAutoTopicCreation: false });
  const meters: CpuMeter[] = [];
  try {
    await producer.connect();
    consumer = await startLatencyConsumer(walDb.brokers, topics);
    const tableRelay = await startLatencyRelay(tableDb, pools.tableMonitor);
    children.push(tableRelay);
    // The slot is idle and its outbox empty (after B2, or as primed): nothing is skipped.
    await advanceSlot(pools.walMonitor, slot);
    const walRelay = await startLatencyRelay(walDb, pools.walMonitor, { walSlot: slot });
    children.push(walRelay);
    const maxRss = { table: 0, wal: 0 };
    rssTimer = setInterval(() => {
      try {
        maxRss.table = Math.max(maxRss.table, rssMb(tableRelay.pid));
        maxRss.wal = Math.max(maxRss.wal, rssMb(walRelay.pid));
      } catch {
        // A relay that ended: its exit is reported by the phase that waits for its events.
      }
    }, 1_000);
    // One meter per database: its `postgres` group is that database's backends (the WAL mode's
    // walsender among them) plus the server's auxiliary processes; `relay` is that mode's relay.
    const meter = (monitor: pg.Pool, db: BenchDatabase, relay: Child) => {
      const m = new CpuMeter(monitor, new URL(db.url).pathname.slice(1));
      m.track('relay', relay.pid);
      m.track('consumer', consumer!.pid);
      m.start();
      meters.push(m);
      return m;
    };
    const cpu = {
      table: meter(pools.tableMonitor, tableDb, tableRelay),
      wal: meter(pools.walMonitor, walDb, walRelay),
    };
    const walOutbox = createOutbox({ source: 'wal' });
    const send = (path: B3Path, rate: number) =>
      path === 'raw'
        ? rawSend(producer, topicOf('raw', rate))
        : path === 'table'
          ? relaySend(pools.tableWriter, topicOf('table', rate))
          : relaySend(pools.walWriter, topicOf('wal', rate), walOutbox);
    const phases = new Map<string, Phase[]>();
    for (let r = 0; r < B3_ROUNDS; r++) {
      for (const rate of RATES) {
        for (const path of r % 2 === 0 ? B3_PATHS : [...B3_PATHS].reverse()) {
          say(`B3 round ${r + 1}/${B3_ROUNDS}, ${rate} events/s: ${path}`);
          const ph = await measurePhase({
            rate,
            warmupS: WARMUP_S,
            seconds: SECONDS,
            consumer,
            cpu: path === 'wal' ? cpu.wal : cpu.table,
            groups: B3_GROUPS,
            send: send(path, rate),
          });
          const k = `${rate} ${path}`;
          phases.set(k, [...(phases.get(k) ?? []), ph]);
        }
      }
    }
    clearInterval(rssTimer);
    rssTimer = undefined;

    const all = (rate: number, path: B3Path) => phases.get(`${rate} ${path}`) ?? [];
    const lat = (rate: number, path: B3Path) => all(rate, path).flatMap((p) => p.latency);
    const p = (rate: number, path: B3Path, q: number) => percentile(lat(rate, path), q);
    const received = (rate: number, path: B3Path) =>
      `${all(rate, path).reduce((a, x) => a + x.received, 0)}/${all(rate, path).reduce((a, x) => a + x.measured, 0)}`;
    const name = {
      raw: 'raw produce → consume',
      table: 'COMMIT sent → table relay → consume',
      wal: 'COMMIT sent → WAL relay → consume',
    };
    const rows = RATES.flatMap((rate) => [
      ...B3_PATHS.map((path) => [rate, name[path], f1(p(rate, path, 50)), f1(p(rate, path, 99)), received(rate, path)]),
      ...(['table', 'wal'] as const).map((path) => [
        rate,
        `**added by the ${path === 'wal' ? 'WAL' : 'table'} relay**`,
        `**${f1(p(rate, path, 50) - p(rate, 'raw', 50))}**`,
        `**${f1(p(rate, path, 99) - p(rate, 'raw', 99))}**`,
        '',
      ]),
    ]);
    const top = Math.max(...RATES);
    const walP50 = p(top, 'wal', 50) - p(top, 'raw', 50);
    const walP99 = p(top, 'wal', 99) - p(top, 'raw', 99);
    const cpuRows = RATES.flatMap((rate) =>
      B3_PATHS.map((path) => {
        const ph = all(rate, path);
        const mean = (f: (x: Phase) => number) => ph.reduce((a, x) => a + f(x), 0) / ph.length;
        return [
          rate,
          path,
          `${f1(mean((x) => x.machineBusy) * 100)} %`,
          ...B3_GROUPS.map((g) => f2(mean((x) => x.cores[g] ?? 0))),
        ];
      }),
    );
    return [
      `### B3: added latency (ms)`,
      '',
      `${B3_ROUNDS} round(s) of ${WARMUP_S} s warm-up + ${SECONDS} s measured per path and rate, order alternating; 16 writers at a time, one enqueue() per transaction, 100 keys, topics of 3 partitions; both relays (\`cli/main.ts relay\` under tsx, defaults; table mode with NOTIFY) and the consumer in processes of their own; percentiles over every round's events.`,
      '',
      table(['events/s', 'path', 'p50 ms', 'p99 ms', 'received'], rows),
      '',
      `Goal at ${top} events/s, the WAL relay adds p50 ≤ 5 ms: ${verdict(walP50 <= 5)}; p99 ≤ 20 ms: ${verdict(walP99 <= 20)}.`,
      `Relay RSS during B3 (read every second, under tsx): table relay max ${f0(maxRss.table)} MB, WAL relay max ${f0(maxRss.wal)} MB.`,
      '',
      `CPU over the measured windows (mean over rounds; cores = CPU-s per s, of ${os.cpus().length}): \`relay\` and \`postgres\` are the path's mode's (the raw path shows the table mode's, idle); \`bench\` is this process (the writers, or the producer).`,
      '',
      table(['events/s', 'path', 'machine busy', ...B3_GROUPS.map((g) => `${g} cores`)], cpuRows),
    ].join('\n');
  } finally {
    if (rssTimer) clearInterval(rssTimer);
    for (const m of meters) m.stop();
    for (const c of children) await stopChild(c).catch(() => undefined);
    await consumer?.stop().catch(() => undefined);
    await producer.disconnect().catch(() => undefined);
    await admin.deleteTopics({ topics }).catch(() => undefined);
    await admin.disconnect().catch(() => undefined);
    for (const pool of Object.values(pools)) await pool.end().catch(() => undefined);
    // Let the WAL relay's walsender go before the slot is dropped with its database.
    await sleep(500);
  }
}
