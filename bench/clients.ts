/**
 * The two Kafka clients side by side (issue 18 point 6; `npm run bench -- clients`): kafkajs and
 * @platformatic/kafka, measured in one process, alternated in rounds, on B2, relay memory, B3 and B4
 * as bench/relay.ts, bench/latency.ts and bench/consumer.ts define them (their pieces:
 * relay-support.ts, latency-support.ts, consumer-support.ts). Needs `npm run build` first.
 *
 * Each round measures, for each client (kafkajs first in odd rounds, platformatic first in even ones):
 * - **B2**: `BENCH_EVENTS` (default 50,000) pending events drained by the built daemon
 *   `dist/cli/main.js relay --kafka-client <client>` (events/s from its first published event to its
 *   last; then `ANALYZE` and `CHECKPOINT` after each seed) and its largest RSS while draining (MB,
 *   no heap flags); the round's baselines as B2 defines them, once per round for both clients (raw
 *   kafkajs producing the same messages with the relay's settings, and the relay with a null
 *   publisher), so that the B2 ratio relay / min(raw, null) of both clients shares its denominator;
 * - **B3**: the relay daemon (`cli/main.ts relay --kafka-client <client>`, defaults: LISTEN/NOTIFY)
 *   started, then at each rate of `BENCH_RATES` (default `200,1000` events/s) the raw path (kafkajs
 *   producer → consumer) and the relay path (COMMIT sent → relay → consumer), `BENCH_WARMUP_S`
 *   (default 2) + `BENCH_SECONDS` (default 5) each; added latency = relay path − raw path at p50 and
 *   p99, the raw path measured right before the relay path it is subtracted from. The receiving
 *   consumer (a plain kafkajs consumer process) is the same for both clients;
 * - **B4**: `BENCH_CONSUMER_EVENTS` (default 10,000) events read by the dedup consumer
 *   (`createDedupConsumer({ kafka })` with a kafkajs `Kafka` or `createPlatformaticClient()`;
 *   `transactionScope: 'message'`, new events) in a fresh group (msg/s, first to last applied event);
 *   the round's baseline, once per round: the plain kafkajs `eachBatch` consumer (scope `message`).
 *
 * `BENCH_ROUNDS` (default 3) rounds; `BENCH_ONLY=b2,b3,b4` picks benchmarks. Each benchmark has a
 * database of its own. Prints per-round values, the median per client, and per metric the median of
 * the per-round ratios platformatic / kafkajs.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { createPlatformaticClient } from '../src/kafka/platformatic/client.js';
import type { KafkaClient } from '../src/kafka/types.js';
import type { KafkaClientName } from '../relay/options.js';
import {
  B4_PARTITIONS,
  B4_POOL_SIZE,
  BENCH_EFFECTS_DDL,
  timeBaselineConsumer,
  timeDedupConsumer,
} from './consumer-support.js';
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
  stopChild,
  table,
} from './e2e-support.js';
import {
  added,
  measurePhase,
  type Phase,
  rawSend,
  relaySend,
  startLatencyConsumer,
  startLatencyRelay,
} from './latency-support.js';
import { median } from './lib.js';
import {
  B2_BATCH,
  B2_KEYS,
  B2_PARTITIONS,
  b2Ratio,
  builtCli,
  drainWithDaemon,
  drainWithNullPublisher,
  rawKafkajsProduce,
  seedB2,
} from './relay-support.js';
import { benchDatabase, type BenchDatabase, machine, produceEvents } from './support.js';

const CLIENTS: readonly KafkaClientName[] = ['kafkajs', 'platformatic'];
const ROUNDS = knob('BENCH_ROUNDS', 3);
const B2_EVENTS = knob('BENCH_EVENTS', 50_000);
const B4_EVENTS = knob('BENCH_CONSUMER_EVENTS', 10_000);
const RATES = (process.env.BENCH_RATES ?? '200,1000')
  .split(',')
  .map((r) => Number(r.trim()))
  .filter((r) => r > 0);
const SECONDS = knob('BENCH_SECONDS', 5);
const WARMUP_S = knob('BENCH_WARMUP_S', 2);
const ONLY = new Set((process.env.BENCH_ONLY ?? 'b2,b3,b4').split(',').map((s) => s.trim()));

/** One client's figures in one round (NaN: not measured). */
interface ClientRound {
  b2EventsPerS: number;
  b2Ratio: number;
  rssMb: number;
  /** Added latency (ms) by rate: p50 and p99, and the relay's CPU cores on the relay path. */
  b3: Map<number, { p50: number; p99: number; relayCores: number; raw: Phase; viaRelay: Phase }>;
  b4MsgPerS: number;
  b4Ratio: number;
}

/** A round's baselines, shared by both clients. */
interface RoundBaselines {
  rawEventsPerS: number;
  nullEventsPerS: number;
  b4BaselineMsgPerS: number;
}

function emptyRound(): ClientRound {
  return { b2EventsPerS: NaN, b2Ratio: NaN, rssMb: NaN, b3: new Map(), b4MsgPerS: NaN, b4Ratio: NaN };
}

/** The order of the clients in round `round` (1-based): kafkajs first in odd rounds. */
const orderOf = (round: number): readonly KafkaClientName[] => (round % 2 === 1 ? CLIENTS : [...CLIENTS].reverse());

function commitOf(): string {
  try {
    const head = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], {
      cwd: root,
      encoding: 'utf8',
    });
    return dirty.trim() === '' ? head : `${head} + uncommitted changes`;
  } catch {
    return 'n/a';
  }
}

function platformaticVersion(): string {
  const pkg = JSON.parse(readFileSync(path.join(root, 'node_modules/@platformatic/kafka/package.json'), 'utf8')) as {
    version: string;
    engines?: { node?: string };
  };
  return `${pkg.version} (engines.node ${pkg.engines?.node ?? 'n/a'})`;
}

/** B2 for one round: each client's drain and RSS, then (or, in even rounds, first) the baselines. */
async function b2Round(
  round: number,
  ctx: { db: BenchDatabase; pool: pg.Pool; kafka: Kafka; topic: string },
  out: Map<KafkaClientName, ClientRound>,
): Promise<Pick<RoundBaselines, 'rawEventsPerS' | 'nullEventsPerS'>> {
  const { db, pool, kafka, topic } = ctx;
  const reseed = async () => {
    await pool.query('TRUNCATE outboxkit.outbox_events');
    await seedB2(pool, topic, B2_EVENTS);
    await pool.query('ANALYZE outboxkit.outbox_events');
    await pool.query('CHECKPOINT');
  };
  const baselines = async () => {
    log('clients', `round ${round} B2: raw kafkajs`);
    const raw = await rawKafkajsProduce(kafka, topic, B2_EVENTS);
    log('clients', `round ${round} B2: null publisher`);
    await reseed();
    const nullPublisher = await drainWithNullPublisher(pool);
    return { raw, nullPublisher };
  };
  const first = round % 2 === 0 ? await baselines() : undefined;
  const relayMs = new Map<KafkaClientName, number>();
  for (const client of orderOf(round)) {
    log('clients', `round ${round} B2: relay daemon on ${client}`);
    await reseed();
    const { ms, maxRssMb } = await drainWithDaemon(pool, {
      databaseUrl: db.url,
      brokers: db.brokers,
      count: B2_EVENTS,
      kafkaClient: client,
    });
    relayMs.set(client, ms);
    out.get(client)!.rssMb = maxRssMb;
  }
  const base = first ?? (await baselines());
  for (const [client, ms] of relayMs) {
    const r = out.get(client)!;
    r.b2EventsPerS = B2_EVENTS / (ms / 1000);
    r.b2Ratio = b2Ratio({ relay: ms, raw: base.raw, nullPublisher: base.nullPublisher });
  }
  return { rawEventsPerS: B2_EVENTS / (base.raw / 1000), nullEventsPerS: B2_EVENTS / (base.nullPublisher / 1000) };
}

export async function run(): Promise<string> {
  builtCli();
  const startedAt = new Date();
  const loadAtStart = loadAverage();
  const commit = commitOf();
  const dbs: BenchDatabase[] = [];
  const pools: pg.Pool[] = [];
  const rounds: { base: RoundBaselines; clients: Map<KafkaClientName, ClientRound> }[] = [];
  const cleanups: (() => Promise<unknown>)[] = [];
  try {
    // Three databases: B2's drains, B3's relays and B4's inbox do not meet.
    const b2Db = await benchDatabase();
    const b3Db = await benchDatabase();
    const b4Db = await benchDatabase();
    dbs.push(b2Db, b3Db, b4Db);
    const brokers = b2Db.brokers;
    const kjs = new Kafka({ clientId: 'bench-clients', brokers, logLevel: logLevel.NOTHING });
    const platformatic: KafkaClient = createPlatformaticClient({ clientId: 'bench-clients', brokers });
    const admin = kjs.admin();
    await admin.connect();
    cleanups.push(() => admin.disconnect());

    const suffix = randomUUID().slice(0, 8);
    const b2Topic = `bench-clients-b2-${suffix}`;
    const b4Topic = `bench-clients-b4-${suffix}`;
    const b3Topics = RATES.map((rate) => ({
      rate,
      raw: `bench-clients-raw-${rate}-${suffix}`,
      relay: `bench-clients-relay-${rate}-${suffix}`,
    }));
    const allTopics = [b2Topic, b4Topic, `${b4Topic}.dlq`, ...b3Topics.flatMap((t) => [t.raw, t.relay])];
    await admin.createTopics({
      waitForLeaders: true,
      topics: [
        { topic: b2Topic, numPartitions: B2_PARTITIONS },
        { topic: b4Topic, numPartitions: B4_PARTITIONS },
        { topic: `${b4Topic}.dlq`, numPartitions: 1 },
        ...b3Topics.flatMap((t) => [t.raw, t.relay]).map((topic) => ({ topic, numPartitions: 3 })),
      ],
    });
    cleanups.push(() => admin.deleteTopics({ topics: allTopics }).catch(() => undefined));

    const b2Pool = new pg.Pool({ connectionString: b2Db.url, max: 4 });
    const b3Writer = new pg.Pool({ connectionString: b3Db.url, max: 20, application_name: 'latency-writer' });
    const b3Monitor = new pg.Pool({ connectionString: b3Db.url, max: 2, application_name: BENCH_APPLICATION });
    const b4Pool = new pg.Pool({ connectionString: b4Db.url, max: B4_POOL_SIZE });
    pools.push(b2Pool, b3Writer, b3Monitor, b4Pool);

    // B3: the receiving consumer and the CPU meter, for the whole run.
    let latencyConsumer: Awaited<ReturnType<typeof startLatencyConsumer>> | undefined;
    let cpu: CpuMeter | undefined;
    const groups = ['bench', 'relay', 'consumer', 'postgres', 'broker'];
    const producer = kjs.producer({ allowAutoTopicCreation: false });
    if (ONLY.has('b3')) {
      latencyConsumer = await startLatencyConsumer(
        brokers,
        b3Topics.flatMap((t) => [t.raw, t.relay]),
      );
      const c = latencyConsumer;
      cleanups.push(() => c.stop());
      cpu = new CpuMeter(b3Monitor, new URL(b3Db.url).pathname.slice(1));
      cpu.track('consumer', latencyConsumer.pid);
      cpu.start();
      const meter = cpu;
      cleanups.push(async () => meter.stop());
      await producer.connect();
      cleanups.push(() => producer.disconnect());
    }

    // B4: the events, produced once; the handler's table.
    let producedS = NaN;
    if (ONLY.has('b4')) {
      await b4Pool.query(BENCH_EFFECTS_DDL);
      const t0 = performance.now();
      await produceEvents(kjs, b4Topic, B4_EVENTS, (i) =>
        JSON.stringify({ orderId: `order-${i % 10_000}`, amount: i }),
      );
      producedS = (performance.now() - t0) / 1000;
    }
    const b4Source = { pool: b4Pool, topic: b4Topic, events: B4_EVENTS };
    const resetB4 = async () => {
      await b4Pool.query('TRUNCATE bench_effects');
      await b4Pool.query('TRUNCATE outboxkit.inbox');
      await b4Pool.query('CHECKPOINT');
    };

    for (let round = 1; round <= ROUNDS; round++) {
      const clients = new Map<KafkaClientName, ClientRound>(CLIENTS.map((c) => [c, emptyRound()]));
      const base: RoundBaselines = { rawEventsPerS: NaN, nullEventsPerS: NaN, b4BaselineMsgPerS: NaN };
      rounds.push({ base, clients });

      if (ONLY.has('b2')) {
        Object.assign(base, await b2Round(round, { db: b2Db, pool: b2Pool, kafka: kjs, topic: b2Topic }, clients));
      }

      if (ONLY.has('b3')) {
        for (const client of orderOf(round)) {
          log('clients', `round ${round} B3: relay daemon on ${client}`);
          const relay = await startLatencyRelay(b3Db, b3Monitor, {
            kafkaClient: client,
            relayId: `bench-${client}-${round}-${suffix}`,
          });
          cpu!.track('relay', relay.pid);
          try {
            for (const t of b3Topics) {
              const phase = (send: Parameters<typeof measurePhase>[0]['send']) =>
                measurePhase({
                  rate: t.rate,
                  warmupS: WARMUP_S,
                  seconds: SECONDS,
                  consumer: latencyConsumer!,
                  cpu: cpu!,
                  groups,
                  send,
                });
              log('clients', `round ${round} B3 ${client}: ${t.rate} events/s raw, then via the relay`);
              const raw = await phase(rawSend(producer, t.raw));
              const viaRelay = await phase(relaySend(b3Writer, t.relay));
              clients.get(client)!.b3.set(t.rate, {
                p50: added(raw, viaRelay, 50),
                p99: added(raw, viaRelay, 99),
                relayCores: viaRelay.cores.relay ?? NaN,
                raw,
                viaRelay,
              });
            }
          } finally {
            await stopChild(relay);
          }
        }
      }

      if (ONLY.has('b4')) {
        const baseline = async () => {
          log('clients', `round ${round} B4: plain kafkajs baseline`);
          await resetB4();
          base.b4BaselineMsgPerS = await timeBaselineConsumer(kjs, b4Source, 'message');
        };
        if (round % 2 === 0) await baseline();
        for (const client of orderOf(round)) {
          log('clients', `round ${round} B4: dedup consumer on ${client}`);
          await resetB4();
          clients.get(client)!.b4MsgPerS = await timeDedupConsumer(
            client === 'kafkajs' ? kjs : platformatic,
            b4Source,
            {
              groupId: `bench-clients-${client}-${randomBytes(4).toString('hex')}`,
              expect: 'applied',
              scope: 'message',
            },
          );
        }
        if (round % 2 === 1) await baseline();
        for (const c of clients.values()) c.b4Ratio = c.b4MsgPerS / base.b4BaselineMsgPerS;
      }

      const line = CLIENTS.map((c) => {
        const r = clients.get(c)!;
        const b3 = [...r.b3].map(([rate, x]) => `${rate}/s +${f1(x.p50)}/+${f1(x.p99)} ms`).join(', ');
        return `${c}: B2 ${f0(r.b2EventsPerS)}/s (${f3(r.b2Ratio)}), RSS ${f0(r.rssMb)} MB, B3 ${b3}, B4 ${f0(r.b4MsgPerS)}/s (${f3(r.b4Ratio)})`;
      }).join('; ');
      log('clients', `round ${round} done: ${line}`);
    }

    return report({ startedAt, loadAtStart, commit, machine: await machine(), producedS, rounds });
  } finally {
    for (const c of cleanups.reverse()) await c().catch(() => undefined);
    for (const p of pools) await p.end().catch(() => undefined);
    for (const d of dbs) await d.drop().catch(() => undefined);
  }
}

function report(run: {
  startedAt: Date;
  loadAtStart: string;
  commit: string;
  machine: string;
  producedS: number;
  rounds: { base: RoundBaselines; clients: Map<KafkaClientName, ClientRound> }[];
}): string {
  const { rounds } = run;
  // Metrics: name, unit, better (higher or lower), value of a client's round.
  type Metric = {
    name: string;
    better: 'higher' | 'lower';
    /** An added latency (ms): a difference, whose ratio says nothing near or below zero. */
    latency?: boolean;
    of: (r: ClientRound) => number;
    fmt: (x: number) => string;
  };
  const metrics: Metric[] = [];
  if (ONLY.has('b2')) {
    metrics.push(
      { name: 'B2 relay drain, events/s', better: 'higher', of: (r) => r.b2EventsPerS, fmt: f0 },
      { name: 'B2 ratio relay / min(raw kafkajs, null publisher)', better: 'higher', of: (r) => r.b2Ratio, fmt: f3 },
      { name: 'relay max RSS while draining, MB', better: 'lower', of: (r) => r.rssMb, fmt: f0 },
    );
  }
  if (ONLY.has('b3')) {
    for (const rate of RATES) {
      metrics.push(
        {
          name: `B3 added p50 at ${rate}/s, ms`,
          better: 'lower',
          latency: true,
          of: (r) => r.b3.get(rate)?.p50 ?? NaN,
          fmt: f1,
        },
        {
          name: `B3 added p99 at ${rate}/s, ms`,
          better: 'lower',
          latency: true,
          of: (r) => r.b3.get(rate)?.p99 ?? NaN,
          fmt: f1,
        },
        {
          name: `relay CPU at ${rate}/s, cores`,
          better: 'lower',
          of: (r) => r.b3.get(rate)?.relayCores ?? NaN,
          fmt: f2,
        },
      );
    }
  }
  if (ONLY.has('b4')) {
    metrics.push(
      { name: 'B4 dedup consumer, msg/s', better: 'higher', of: (r) => r.b4MsgPerS, fmt: f0 },
      { name: 'B4 ratio dedup / plain kafkajs baseline', better: 'higher', of: (r) => r.b4Ratio, fmt: f3 },
    );
  }

  const perRound = rounds.flatMap(({ clients }, i) =>
    orderOf(i + 1).map((c) => [`${i + 1}`, c, ...metrics.map((m) => m.fmt(m.of(clients.get(c)!)))]),
  );
  const ratioOf = (m: Metric, i: number) => {
    const k = m.of(rounds[i]!.clients.get('kafkajs')!);
    const p = m.of(rounds[i]!.clients.get('platformatic')!);
    // A ratio of added latencies near or below zero says nothing (their difference is given).
    return m.latency && k <= 0.5 ? NaN : p / k;
  };
  const summary = metrics.map((m) => {
    const med = (c: KafkaClientName) => median(rounds.map((r) => m.of(r.clients.get(c)!)).filter(Number.isFinite));
    const ratios = rounds.map((_, i) => ratioOf(m, i));
    const finite = ratios.filter(Number.isFinite);
    return [
      m.name,
      m.fmt(med('kafkajs')),
      m.fmt(med('platformatic')),
      ratios.map(f2).join(' '),
      `**${finite.length > 0 ? f2(median(finite)) : 'n/a'}**`,
      m.latency
        ? f1(
            median(
              rounds
                .map((r) => m.of(r.clients.get('platformatic')!) - m.of(r.clients.get('kafkajs')!))
                .filter(Number.isFinite),
            ),
          )
        : '—',
      m.better,
    ];
  });
  const baseRows = rounds.map(({ base }, i) => [
    `${i + 1}`,
    orderOf(i + 1).join(', '),
    f0(base.rawEventsPerS),
    f0(base.nullEventsPerS),
    f0(base.b4BaselineMsgPerS),
  ]);
  const rawRows = rounds.flatMap(({ clients }, i) =>
    orderOf(i + 1).flatMap((c) =>
      [...clients.get(c)!.b3].map(([rate, x]) => [
        `${i + 1}`,
        c,
        rate,
        `${f1(percentile(x.raw.latency, 50))} / ${f1(percentile(x.raw.latency, 99))}`,
        `${f1(percentile(x.viaRelay.latency, 50))} / ${f1(percentile(x.viaRelay.latency, 99))}`,
        `${x.viaRelay.received}/${x.viaRelay.measured}`,
        `${f1(x.viaRelay.machineBusy * 100)} %`,
      ]),
    ),
  );
  const ended = new Date();
  return [
    `Started ${run.startedAt.toISOString().slice(0, 16).replace('T', ' ')} UTC, ended ${ended.toISOString().slice(11, 16)} UTC; ` +
      `commit ${run.commit}; ${run.machine}; load average at start ${run.loadAtStart}, at end ${loadAverage()}.`,
    `@platformatic/kafka ${platformaticVersion()}, kafkajs ${kafkajsVersion()}.`,
    `Sizes: ${ROUNDS} rounds; B2 ${B2_EVENTS.toLocaleString('en-US')} events of 256 bytes, ${B2_KEYS} keys, ${B2_PARTITIONS} partitions, batch ${B2_BATCH}; ` +
      `B3 ${RATES.join(' and ')} events/s, ${WARMUP_S} s warm-up + ${SECONDS} s per path; ` +
      `B4 ${B4_EVENTS.toLocaleString('en-US')} events, ${B4_PARTITIONS} partitions, scope message (produced in ${f1(run.producedS)} s).`,
    '',
    'Per round (clients in the order they ran):',
    '',
    table(['round', 'client', ...metrics.map((m) => m.name)], perRound),
    '',
    'Medians per client, and platformatic / kafkajs per round and its median:',
    '',
    table(
      [
        'metric',
        'kafkajs (median)',
        'platformatic (median)',
        'platformatic / kafkajs per round',
        'median ratio',
        'median difference (ms)',
        'better',
      ],
      summary,
    ),
    '',
    'Round baselines (shared by both clients):',
    '',
    table(
      ['round', 'order', 'B2 raw kafkajs events/s', 'B2 null publisher events/s', 'B4 plain kafkajs msg/s'],
      baseRows,
    ),
    ...(rawRows.length > 0
      ? [
          '',
          'B3 paths (p50 / p99 ms; raw measured right before its relay path):',
          '',
          table(['round', 'client', 'events/s', 'raw', 'via relay (COMMIT sent)', 'received', 'machine busy'], rawRows),
        ]
      : []),
  ].join('\n');
}

function kafkajsVersion(): string {
  const pkg = JSON.parse(readFileSync(path.join(root, 'node_modules/kafkajs/package.json'), 'utf8')) as {
    version: string;
  };
  return pkg.version;
}
