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
import { randomUUID } from 'node:crypto';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { benchDatabase, machine } from './support.js';
import { BENCH_APPLICATION, CpuMeter, f1, f2, knob, log, percentile, stopChild, table } from './e2e-support.js';
import {
  LATENCY_KEYS as KEYS,
  measurePhase,
  type Phase,
  rawSend,
  relaySend,
  startLatencyConsumer,
  startLatencyRelay,
} from './latency-support.js';

const RATES = (process.env.BENCH_RATES ?? process.env.BENCH_RATE ?? '1000,200')
  .split(',')
  .map((r) => Number(r.trim()))
  .filter((r) => r > 0);
const SECONDS = knob('BENCH_SECONDS', 10);
const WARMUP_S = knob('BENCH_WARMUP_S', 2);

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
  const consumer = await startLatencyConsumer(
    db.brokers,
    topics.flatMap((t) => [t.raw, t.relay]),
  );

  // The relay daemon, with its defaults; idle while the raw path runs.
  const relay = await startLatencyRelay(db, monitor);

  const cpu = new CpuMeter(monitor, dbName);
  cpu.track('relay', relay.pid);
  cpu.track('consumer', consumer.pid);
  cpu.start();
  const groups = ['bench', 'relay', 'consumer', 'postgres', 'broker'];
  const phase = (rate: number, send: Parameters<typeof measurePhase>[0]['send']) =>
    measurePhase({ rate, warmupS: WARMUP_S, seconds: SECONDS, consumer, cpu, groups, send });

  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  const results: { rate: number; raw: Phase; viaRelay: Phase }[] = [];
  for (const t of topics) {
    log('latency', `${t.rate} events/s: raw produce → consume`);
    const raw = await phase(t.rate, rawSend(producer, t.raw));
    log('latency', `${t.rate} events/s: commit → relay → consume`);
    const viaRelay = await phase(t.rate, relaySend(writer, t.relay));
    results.push({ rate: t.rate, raw, viaRelay });
  }

  cpu.stop();
  await producer.disconnect();
  await stopChild(relay);
  await consumer.stop();
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
