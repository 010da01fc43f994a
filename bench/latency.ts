/**
 * B3 relay latency in LISTEN/NOTIFY mode: commit → consumer receipt through the relay, against raw
 * produce → consumer receipt, at the rates of BENCH_RATES (events/s, default `1000,200`), each for
 * BENCH_WARMUP_S (2, not counted) + BENCH_SECONDS (10) per path. Reports what the relay adds at
 * p50 and p99.
 *
 * Processes, as deployed: the relay is the `outboxkit relay` daemon (a child process, defaults:
 * LISTEN/NOTIFY, batch 500, poll 1 s); the receiving consumer is a plain kafkajs consumer in a
 * child process of its own (bench/processes/latency-consumer.ts), the same one for both paths;
 * this process writes (one `enqueue()` per transaction, NOTIFY on, 16 at a time) or produces (a
 * kafkajs producer, acks=all, each message sent as it comes). Times are wall-clock readings
 * (`performance.timeOrigin + performance.now()`) in this process and the consumer's: an offset
 * between the two clocks is in both paths and cancels out of what the relay adds.
 *
 * The relay path's clock starts when COMMIT is sent (the row may be visible to the relay before
 * the COMMIT reply arrives here), so it includes the commit itself; the figures from the COMMIT
 * reply are printed beside it. CPU per process and the machine's busy share are printed for each
 * measured window: on a machine whose cores are saturated, latency is queueing, not the relay.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { enqueue } from '../src/index.js';
import { benchDatabase, machine } from './support.js';
import {
  BENCH_APPLICATION,
  CpuMeter,
  type CpuSample,
  cpuDelta,
  f1,
  f2,
  knob,
  log,
  percentile,
  root,
  sleep,
  startChild,
  stopChild,
  table,
  waitFor,
} from './e2e-support.js';

const RATES = (process.env.BENCH_RATES ?? process.env.BENCH_RATE ?? '1000,200')
  .split(',')
  .map((r) => Number(r.trim()))
  .filter((r) => r > 0);
const SECONDS = knob('BENCH_SECONDS', 10);
const WARMUP_S = knob('BENCH_WARMUP_S', 2);
const KEYS = 100;

const wallNow = () => performance.timeOrigin + performance.now();

/** Calls `tick(i)` `rate` times a second for `seconds`, up to `concurrency` in flight. */
async function paced(rate: number, seconds: number, tick: (i: number) => Promise<void>, concurrency = 16) {
  const total = Math.round(rate * seconds);
  const start = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < total; i = next++) {
        const wait = start + (i * 1000) / rate - performance.now();
        if (wait > 0) await sleep(wait);
        await tick(i);
      }
    }),
  );
}

/** Busy and total jiffies of the whole machine (/proc/stat), for its busy share over a window. */
function machineJiffies(): { busy: number; total: number } {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1, 9).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  return { busy: total - f[3]! - f[4]!, total };
}

interface Phase {
  /** Send (or COMMIT sent) → receipt, ms, measured events only. */
  latency: number[];
  /** COMMIT reply → receipt, ms (relay path only). */
  fromReply: number[];
  /** Events sent in the measured window that were received. */
  received: number;
  measured: number;
  /** CPU cores (CPU-s per s) per group over the measured window. */
  cores: Record<string, number>;
  machineBusy: number;
}

export async function run(): Promise<string> {
  const db = await benchDatabase();
  const dbName = new URL(db.url).pathname.slice(1);
  const writer = new pg.Pool({ connectionString: db.url, max: 20, application_name: 'latency-writer' });
  const monitor = new pg.Pool({ connectionString: db.url, max: 2, application_name: BENCH_APPLICATION });
  const kafka = new Kafka({ clientId: 'bench-latency', brokers: db.brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const topics = RATES.map((rate) => ({
    rate,
    raw: `bench-raw-${rate}-${randomUUID().slice(0, 8)}`,
    relay: `bench-relay-${rate}-${randomUUID().slice(0, 8)}`,
  }));
  await admin.createTopics({
    waitForLeaders: true,
    topics: topics.flatMap((t) => [t.raw, t.relay]).map((topic) => ({ topic, numPartitions: 3 })),
  });

  // The receiving consumer: one process, subscribed to every topic, joined before anything is sent.
  const received = new Map<string, number>();
  const consumer = spawn(
    process.execPath,
    [
      '--import',
      'tsx',
      path.join(root, 'bench/processes/latency-consumer.ts'),
      db.brokers.join(','),
      ...topics.flatMap((t) => [t.raw, t.relay]),
    ],
    { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  let consumerReady = false;
  createInterface({ input: consumer.stdout! }).on('line', (line) => {
    if (line === 'ready') consumerReady = true;
    else if (line.startsWith('r ')) {
      const [, id, at] = line.split(' ');
      if (!received.has(id!)) received.set(id!, Number(at));
    }
  });
  await waitFor('the consumer to join its group', () => consumerReady, { timeoutMs: 60_000 });

  // The relay daemon, with its defaults; idle while the raw path runs.
  const relay = startChild('relay', path.join(root, 'cli/main.ts'), ['relay', '--metrics-port', '-1'], {
    DATABASE_URL: db.url,
    KAFKA_BROKERS: db.brokers.join(','),
    OUTBOXKIT_LOG_LEVEL: 'warn',
  });
  await waitFor(
    'the relay to hold its lanes',
    async () => (await monitor.query('SELECT 1 FROM outboxkit.relay_lanes WHERE owner_id IS NOT NULL')).rowCount! > 0,
    { timeoutMs: 60_000, children: [relay] },
  );

  const cpu = new CpuMeter(monitor, dbName);
  cpu.track('relay', relay.pid);
  cpu.track('consumer', consumer.pid!);
  cpu.start();
  const groups = ['bench', 'relay', 'consumer', 'postgres', 'broker'];

  /** Runs one path at `rate`; `send(i)` returns the wall-clock start of event i's latency and its id. */
  async function phase(
    rate: number,
    send: (i: number) => Promise<{ id: string; at: number; reply?: number }>,
  ): Promise<Phase> {
    const warmup = Math.round(rate * WARMUP_S);
    const sent: { id: string; at: number; reply?: number }[] = [];
    let start: { cpu: CpuSample; jiffies: ReturnType<typeof machineJiffies>; at: number } | undefined;
    const startWindow = async () => {
      start = { cpu: await cpu.sample(), jiffies: machineJiffies(), at: performance.now() };
    };
    let starting: Promise<void> | undefined;
    await paced(rate, WARMUP_S + SECONDS, async (i) => {
      if (i === warmup) starting = startWindow();
      const s = await send(i);
      if (i >= warmup) sent.push(s);
    });
    await starting;
    const endCpu = await cpu.sample();
    const endJiffies = machineJiffies();
    const seconds = (performance.now() - start!.at) / 1000;
    await waitFor(`${sent.length} events to reach the consumer`, () => sent.every((s) => received.has(s.id)), {
      timeoutMs: 60_000,
      everyMs: 100,
    }).catch((err: Error) => log('latency', err.message));
    const cores: Record<string, number> = {};
    for (const g of groups) cores[g] = cpuDelta(start!.cpu, endCpu, [g]) / seconds;
    const got = sent.filter((s) => received.has(s.id));
    return {
      latency: got.map((s) => received.get(s.id)! - s.at),
      fromReply: got.filter((s) => s.reply !== undefined).map((s) => received.get(s.id)! - s.reply!),
      received: got.length,
      measured: sent.length,
      cores,
      machineBusy: (endJiffies.busy - start!.jiffies.busy) / (endJiffies.total - start!.jiffies.total),
    };
  }

  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  const results: { rate: number; raw: Phase; viaRelay: Phase }[] = [];
  for (const t of topics) {
    log('latency', `${t.rate} events/s: raw produce → consume`);
    // The floor: a plain kafkajs producer (acks=all) sending each message as it comes,
    // concurrently (the relay's producer sends one request at a time with what accumulated).
    const raw = await phase(t.rate, async (i) => {
      const id = randomUUID();
      const at = wallNow();
      await producer.send({
        topic: t.raw,
        acks: -1,
        messages: [{ key: `k${i % KEYS}`, value: Buffer.from('{"n":1}'), headers: { 'event-id': id } }],
      });
      return { id, at };
    });
    log('latency', `${t.rate} events/s: commit → relay → consume`);
    const viaRelay = await phase(t.rate, async (i) => {
      const c = await writer.connect();
      try {
        await c.query('BEGIN');
        const [e] = await enqueue(c, { topic: t.relay, key: `k${i % KEYS}`, type: 't', payload: { n: 1 } });
        const at = wallNow();
        await c.query('COMMIT');
        return { id: e!.eventId, at, reply: wallNow() };
      } finally {
        c.release();
      }
    });
    results.push({ rate: t.rate, raw, viaRelay });
  }

  cpu.stop();
  await producer.disconnect();
  await stopChild(relay);
  consumer.kill('SIGTERM');
  await new Promise((r) => consumer.once('exit', r));
  await admin.deleteTopics({ topics: topics.flatMap((t) => [t.raw, t.relay]) });
  await admin.disconnect();
  await writer.end();
  await monitor.end();
  await db.drop();

  const p = (xs: number[], q: number) => percentile(xs, q);
  const rows = results.flatMap(({ rate, raw, viaRelay }) => [
    [rate, 'raw produce → consume', f1(p(raw.latency, 50)), f1(p(raw.latency, 99)), `${raw.received}/${raw.measured}`],
    [
      rate,
      'COMMIT sent → relay → consume',
      f1(p(viaRelay.latency, 50)),
      f1(p(viaRelay.latency, 99)),
      `${viaRelay.received}/${viaRelay.measured}`,
    ],
    [rate, 'COMMIT reply → relay → consume', f1(p(viaRelay.fromReply, 50)), f1(p(viaRelay.fromReply, 99)), ''],
    [
      rate,
      '**added by the relay** (from COMMIT sent)',
      `**${f1(p(viaRelay.latency, 50) - p(raw.latency, 50))}**`,
      `**${f1(p(viaRelay.latency, 99) - p(raw.latency, 99))}**`,
      '',
    ],
  ]);
  const cpuRows = results.flatMap(({ rate, raw, viaRelay }) =>
    (
      [
        ['raw', raw],
        ['relay', viaRelay],
      ] as const
    ).map(([path, ph]) => [rate, path, `${f1(ph.machineBusy * 100)} %`, ...groups.map((g) => f2(ph.cores[g] ?? 0))]),
  );
  return [
    `Machine: ${await machine()}; ${WARMUP_S} s warm-up + ${SECONDS} s measured per path and rate, ${KEYS} keys, 3 partitions, NOTIFY on; relay daemon and consumer in processes of their own.`,
    '',
    table(['events/s', 'path', 'p50 ms', 'p99 ms', 'received'], rows),
    '',
    'Targets (at 1,000 events/s): added p50 ≤ 2 ms, added p99 ≤ 10 ms.',
    '',
    'CPU over each measured window (cores = CPU-s per s; the machine has ' +
      `${(await import('node:os')).cpus().length}): this process is the writer (relay path) or the producer (raw path).`,
    '',
    table(['events/s', 'path', 'machine busy', ...groups.map((g) => `${g} cores`)], cpuRows),
  ].join('\n');
}
