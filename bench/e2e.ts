/**
 * B5 · the whole orders pipeline end to end (issue #7): `npm run bench -- e2e`.
 *
 * Processes (child processes of this bench, as in `npm run demo`): the orders service
 * (examples/orders/server.ts: Fastify, idempotency keys, `enqueue()` with NOTIFY), the relay daemon
 * (`cli/main.ts relay`, defaults: LISTEN/NOTIFY, batch 500), the shipping dedup consumer
 * (examples/orders/shipping.ts). The load generator runs in this process: an open-loop paced
 * `POST /orders`, a fresh `Idempotency-Key` per request, at most 64 in flight.
 *
 * 1. Highest sustainable rate: a step-up search (each step a warm-up then a window; sustainable =
 *    ≥ 95 % of the offered rate answered 201, no error, and the least-squares slope of the events
 *    in flight — outbox backlog plus consumer lag — at most max(2 % of the rate, 5)/s), doubling
 *    by ×1.5, then bisecting; the best rate is then confirmed over a longer window (a minute by
 *    default), stepping down by 15 % if it fails.
 * 2. CPU-seconds per 1,000 events, at half that rate: each stage alone, then the whole pipeline at
 *    the same rate; ratio = pipeline / (W + R + C), read two ways:
 *    - at the same rate (the like-with-like reading): (W) HTTP + outbox writes with relay and
 *      consumer stopped; (R) the relay publishing events that a feeder in this process commits at
 *      that rate (one `enqueue()` per transaction, to a topic nobody reads), minus the feeder
 *      alone; (C) the consumer applying events that a kafkajs producer in this process sends at
 *      that rate, minus that producer alone. Each stage then does its own work at the pipeline's
 *      pace (one pass, one fetch per event or so), and what the feed itself costs PostgreSQL and
 *      the broker is taken out;
 *    - draining a backlog: (R) a relay draining W's backlog, (C) the consumer consuming it; each
 *      then works in large batches, which the pipeline at a low rate never does.
 *    Figures include the bench database's PostgreSQL backends, PostgreSQL's auxiliary processes
 *    and the broker's JVM; the load generator and the feeders (this process, and their own
 *    database connections) are excluded.
 * 3. Latency at half the rate (the pipeline window above) and at 1,000 orders/s if sustainable:
 *    order row insert → shipment row insert, both `clock_timestamp()` of the database.
 *
 * Knobs (env): BENCH_E2E_STEP_S (15), BENCH_E2E_CONFIRM_S (60), BENCH_E2E_START_RATE (200),
 * BENCH_E2E_MAX_RATE (4000), BENCH_E2E_BISECT (2), BENCH_E2E_CPU_S (30), BENCH_E2E_LATENCY_S (30),
 * BENCH_E2E_CPU_RATE (default: half the confirmed rate), BENCH_E2E_RELAYS (1),
 * BENCH_E2E_PARTITIONS (3), BENCH_E2E_MAX_IN_FLIGHT (64).
 * Smoke run (≈ 2 min): BENCH_E2E_STEP_S=5 BENCH_E2E_CONFIRM_S=10 BENCH_E2E_CPU_S=8
 * BENCH_E2E_LATENCY_S=8 BENCH_E2E_BISECT=1.
 */
import {
  cpuDelta,
  f0,
  f1,
  f2,
  f3,
  knob,
  LoadGenerator,
  loadAverage,
  log,
  measureWindow,
  Pipeline,
  sleep,
  table,
  waitFor,
  type CpuSample,
  type LatencyFigures,
  type Window,
} from './e2e-support.js';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { v7 as uuidv7 } from 'uuid';
import { enqueue, HEADER_EVENT_ID, HEADER_EVENT_TYPE, withPgTransaction } from '../src/index.js';
import { BENCH_APPLICATION, PacedFeeder } from './e2e-support.js';
import { machine } from './support.js';

const STEP_S = knob('BENCH_E2E_STEP_S', 15);
const CONFIRM_S = knob('BENCH_E2E_CONFIRM_S', 60);
const START_RATE = knob('BENCH_E2E_START_RATE', 200);
const MAX_RATE = knob('BENCH_E2E_MAX_RATE', 4_000);
const BISECT = knob('BENCH_E2E_BISECT', 2);
const CPU_S = knob('BENCH_E2E_CPU_S', 30);
const LATENCY_S = knob('BENCH_E2E_LATENCY_S', 30);
const CPU_RATE = knob('BENCH_E2E_CPU_RATE', 0);
const RELAYS = knob('BENCH_E2E_RELAYS', 1);
const PARTITIONS = knob('BENCH_E2E_PARTITIONS', 3);
const MAX_IN_FLIGHT = knob('BENCH_E2E_MAX_IN_FLIGHT', 64);
const DRAIN_TIMEOUT_MS = 180_000;
const GOAL_P50_MS = 8;
const GOAL_P99_MS = 25;
const say = (m: string) => log('e2e', m);

/** A stage's CPU figure. */
interface Stage {
  name: string;
  processes: string;
  groups: string[];
  events: number;
  seconds: number;
  from: CpuSample;
  to: CpuSample;
}

const round10 = (x: number) => Math.max(10, Math.round(x / 10) * 10);

export async function run(): Promise<string> {
  const startedAt = Date.now();
  const loadBefore = loadAverage();
  const feedTopic = `bench.e2e.feed.${randomUUID().slice(0, 8)}`;
  const p = await Pipeline.create({ partitions: PARTITIONS, bench: 'e2e', extraTopics: [feedTopic] });
  let load: LoadGenerator | undefined;
  try {
    await p.startOrders();
    for (let i = 0; i < RELAYS; i++) await p.startRelay();
    await p.startConsumer();
    load = new LoadGenerator(p.baseUrl, MAX_IN_FLIGHT);
    const l = load;
    say(`pipeline up (database ${p.dbName}, topic ${p.topic}); warming up`);
    await measureWindow(p, l, 100, 5, { warmMs: 2_000 });
    await l.stop();
    await p.waitDrained(DRAIN_TIMEOUT_MS);

    // 1. Step-up search.
    const steps: Window[] = [];
    const step = async (rate: number, seconds: number): Promise<Window> => {
      const w = await measureWindow(p, l, rate, seconds);
      await l.stop();
      say(
        `${rate}/s for ${f0(w.seconds)} s: ${w.verdict} (achieved ${f0(w.achieved)}/s, in flight max ${w.inFlightMax})`,
      );
      await p.waitDrained(DRAIN_TIMEOUT_MS);
      return w;
    };
    let ok = 0;
    let fail = Infinity;
    for (let rate = START_RATE; rate <= MAX_RATE; rate = round10(rate * 1.5)) {
      const w = await step(rate, STEP_S);
      steps.push(w);
      if (w.sustainable) ok = rate;
      else {
        fail = rate;
        break;
      }
    }
    // The start rate already failed: halve until one holds.
    while (ok === 0 && fail > 20) {
      const rate = round10(fail / 2);
      const w = await step(rate, STEP_S);
      steps.push(w);
      if (w.sustainable) ok = rate;
      else fail = rate;
    }
    for (let i = 0; i < BISECT && Number.isFinite(fail) && fail - ok > Math.max(20, 0.05 * ok); i++) {
      const rate = round10((ok + fail) / 2);
      const w = await step(rate, STEP_S);
      steps.push(w);
      if (w.sustainable) ok = rate;
      else fail = rate;
    }
    const confirms: Window[] = [];
    let confirmed = 0;
    for (let candidate = ok, i = 0; candidate > 0 && i < 3; i++, candidate = round10(candidate * 0.85)) {
      const w = await step(candidate, CONFIRM_S);
      confirms.push(w);
      if (w.sustainable) {
        confirmed = candidate;
        break;
      }
    }
    if (confirmed === 0) throw new Error('no rate was sustained over the confirmation window; see the log');
    say(`highest sustainable rate: ${confirmed} orders/s`);

    // 2. CPU per stage at half that rate.
    const rate = CPU_RATE > 0 ? CPU_RATE : round10(confirmed / 2);
    const idleFrom = await p.cpu.sample();
    await sleep(5_000);
    const idleTo = await p.cpu.sample();
    await p.stopRelays();
    await p.stopConsumer();
    const stages: Stage[] = [];

    say(`stage W: writes alone at ${rate}/s for ${CPU_S} s`);
    const errorsBefore = l.counters.errors;
    l.setRate(rate);
    await sleep(3_000);
    const c0 = l.counters.ok;
    let s0 = await p.cpu.sample();
    let t0 = performance.now();
    await sleep(CPU_S * 1000);
    let s1 = await p.cpu.sample();
    const events = l.counters.ok - c0;
    let t1 = performance.now();
    await l.stop();
    const wErrors = l.counters.errors - errorsBefore;
    stages.push({
      name: 'W: HTTP + idempotency + outbox writes (relay and consumer stopped)',
      processes: 'orders service, PostgreSQL, broker',
      groups: ['orders', 'postgres', 'broker'],
      events,
      seconds: (t1 - t0) / 1000,
      from: s0,
      to: s1,
    });

    say('stage R: a relay drains that backlog alone');
    // Hold every lane under a fake owner while the relay starts (its start-up is not the stage's
    // work), then release them as `outboxkit lanes release` would; it takes them at its next
    // lane maintenance (≤ leaseMs / 3) and drains.
    await p.monitor.query(
      `UPDATE outboxkit.relay_lanes SET owner_id = 'bench-blocker', fencing_token = fencing_token + 1,
              lease_expires_at = now() + interval '1 hour'`,
    );
    const relay = await p.startRelay();
    const relayId = relay.relayId;
    await sleep(1_000);
    await p.monitor.query(
      `UPDATE outboxkit.relay_lanes SET owner_id = NULL, lease_expires_at = NULL, fencing_token = fencing_token + 1
        WHERE owner_id = 'bench-blocker'`,
    );
    // The relay takes the lanes at its next lane maintenance (≤ leaseMs / 3) and wakes at once:
    // the stage starts when it holds them (polled every 20 ms).
    let backlog = 0;
    await waitFor(
      'the relay to take the lanes',
      async () => {
        const { rows } = await p.monitor.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.relay_lanes WHERE owner_id = $1',
          [relayId],
        );
        if (rows[0]!.n === 0) return false;
        s0 = await p.cpu.sample();
        t0 = performance.now();
        backlog = (await p.probe()).pending;
        return true;
      },
      { timeoutMs: 30_000, everyMs: 20, children: p.relays },
    );
    await waitFor('the relay to drain the backlog', async () => (await p.probe()).pending === 0, {
      timeoutMs: DRAIN_TIMEOUT_MS,
      everyMs: 100,
      children: p.relays,
    });
    s1 = await p.cpu.sample();
    t1 = performance.now();
    stages.push({
      name: 'R: relay draining that backlog (consumer stopped)',
      processes: 'relay, PostgreSQL, broker',
      groups: ['relay', 'postgres', 'broker'],
      events: backlog,
      seconds: (t1 - t0) / 1000,
      from: s0,
      to: s1,
    });

    say('stage C: the consumer consumes the topic alone');
    await p.rebase();
    const before = (await p.probe()).applied;
    await p.startConsumer();
    let startApplied = 0;
    await waitFor(
      'the first applied event',
      async () => {
        if ((await p.probe()).applied > before) {
          s0 = await p.cpu.sample();
          startApplied = (await p.probe()).applied;
          t0 = performance.now();
          return true;
        }
        return false;
      },
      { timeoutMs: 60_000, everyMs: 100, children: [p.consumer!] },
    );
    let endApplied = 0;
    await waitFor(
      'the consumer to catch up',
      async () => {
        const q = await p.probe();
        endApplied = q.applied;
        return q.applied >= q.created;
      },
      { timeoutMs: DRAIN_TIMEOUT_MS, everyMs: 100, children: [p.consumer!] },
    );
    s1 = await p.cpu.sample();
    t1 = performance.now();
    stages.push({
      name: 'C: consumer consuming the topic alone (from its first applied event)',
      processes: 'consumer, PostgreSQL, broker',
      groups: ['consumer', 'postgres', 'broker'],
      events: endApplied - startApplied,
      seconds: (t1 - t0) / 1000,
      from: s0,
      to: s1,
    });
    await p.waitDrained(DRAIN_TIMEOUT_MS);

    // 2b. Each stage alone at the same rate, fed from this process (see the file's doc).
    await p.stopRelays();
    await p.stopConsumer();
    const atRate = await stagesAtRate(p, rate, feedTopic);
    await p.startRelay();
    await p.waitDrained(DRAIN_TIMEOUT_MS);

    // 3. The whole pipeline at the same rate; its window gives the latency at that rate too.
    say(`pipeline at ${rate}/s for ${LATENCY_S} s`);
    const whole = await measureWindow(p, l, rate, LATENCY_S);
    await l.stop();
    await p.waitDrained(DRAIN_TIMEOUT_MS);
    const wholeStage: Stage = {
      name: 'whole pipeline, all running at the same rate',
      processes: 'orders service, relay, consumer, PostgreSQL, broker',
      groups: ['orders', 'relay', 'consumer', 'postgres', 'broker'],
      events: whole.okDuring,
      seconds: whole.seconds,
      from: whole.cpuFrom,
      to: whole.cpuTo,
    };
    const latencies: { rate: number; w: Window; lat: LatencyFigures }[] = [
      { rate, w: whole, lat: await p.latency(whole.from, whole.to) },
    ];
    if (confirmed >= 1_000) {
      say(`pipeline at 1000/s for ${LATENCY_S} s`);
      const w = await measureWindow(p, l, 1_000, LATENCY_S);
      await l.stop();
      await p.waitDrained(DRAIN_TIMEOUT_MS);
      latencies.push({ rate: 1_000, w, lat: await p.latency(w.from, w.to) });
    }

    // Report.
    const per1k = (s: Stage) => (cpuDelta(s.from, s.to, s.groups) / s.events) * 1000;
    const sumStages = stages.reduce((a, s) => a + per1k(s), 0);
    const ratio = per1k(wholeStage) / sumStages;
    const wAtRate = per1k(stages[0]!);
    const sumAtRate = wAtRate + atRate.relay.per1k + atRate.consumer.per1k;
    const ratioAtRate = per1k(wholeStage) / sumAtRate;
    const groupsShown = ['orders', 'relay', 'consumer', 'postgres', 'broker'];
    const idleS = 5;
    const stepRow = (w: Window, kind: string) => [
      kind,
      w.rate,
      f0(w.seconds),
      f0(w.achieved),
      f1(w.backlogSlope),
      f1(w.lagSlope),
      f1(w.inFlightSlope),
      w.backlogMax,
      w.inFlightMax,
      w.verdict,
    ];
    const lines = [
      `Machine: ${await machine()}; load average before ${loadBefore}, after ${loadAverage()}; ` +
        `${RELAYS} relay(s), topic of ${PARTITIONS} partitions, at most ${MAX_IN_FLIGHT} requests in flight; ` +
        `${p.cpu.brokerPid === undefined ? 'broker JVM not found (broker CPU missing)' : 'broker JVM found'}; ` +
        `${p.cpu.postgresVisible ? 'PostgreSQL processes visible' : 'PostgreSQL processes NOT visible (CPU missing)'}; ` +
        `run took ${f0((Date.now() - startedAt) / 1000)} s.`,
      '',
      `### Highest sustainable rate: **${confirmed} orders/s** (confirmed over ${f0(confirms.at(-1)!.seconds)} s)`,
      '',
      `Windows of ${STEP_S} s after a 3 s warm-up (confirmation: ${CONFIRM_S} s); slopes are least-squares growth per second of the outbox backlog, the consumer lag (published − applied) and their sum (in flight), probed every second; the pipeline drains between steps.`,
      '',
      table(
        [
          'window',
          'offered/s',
          's',
          'achieved/s',
          'backlog slope/s',
          'lag slope/s',
          'in flight slope/s',
          'backlog max',
          'in flight max',
          'verdict',
        ],
        [...steps.map((w) => stepRow(w, 'search')), ...confirms.map((w) => stepRow(w, 'confirm'))],
      ),
      '',
      '### Latency: order commit → shipment applied (database clock at both ends)',
      '',
      table(
        [
          'offered/s',
          'window s',
          'achieved/s',
          'orders',
          'applied',
          'p50 ms',
          'p99 ms',
          'max ms',
          'relay part p50 / p99 ms',
          'window verdict',
        ],
        latencies.map(({ rate: r, w, lat }) => [
          r,
          f0(w.seconds),
          f0(w.achieved),
          lat.orders,
          lat.applied,
          `**${f1(lat.p50)}**`,
          `**${f1(lat.p99)}**`,
          f1(lat.max),
          `${f1(lat.relayP50)} / ${f1(lat.relayP99)}`,
          w.verdict,
        ]),
      ),
      '',
      confirmed >= 1_000
        ? ''
        : `1,000 orders/s: **not sustainable** here (highest sustained ${confirmed}/s), so not measured.`,
      `Goal p50 ≤ ${GOAL_P50_MS} ms, p99 ≤ ${GOAL_P99_MS} ms. Start: the order row's \`clock_timestamp()\` at its INSERT (the service's transaction then enqueues, stores the response and commits: ~1–3 statements later); end: the shipment row's \`clock_timestamp()\` in the consumer's transaction (before its COMMIT). The relay part is order insert → the outbox row's \`published_at\` (\`now()\` of the marking statement, after the broker's ack).`,
      '',
      `### CPU-seconds per 1,000 events at ${rate} orders/s`,
      '',
      table(
        [
          'stage',
          'processes counted',
          'events',
          's',
          ...groupsShown.map((g) => `${g} CPU-s`),
          'CPU-s per 1,000 events',
        ],
        [...stages, wholeStage].map((s) => [
          s.name,
          s.processes,
          s.events,
          f1(s.seconds),
          ...groupsShown.map((g) => (s.groups.includes(g) ? f2((s.to[g] ?? 0) - (s.from[g] ?? 0)) : '–')),
          s.events < 200 ? `${f3(per1k(s))} (only ${s.events} events: lengthen BENCH_E2E_CPU_S)` : f3(per1k(s)),
        ]),
      ),
      '',
      `#### Stages alone at the same rate (${rate}/s): the like-with-like reading`,
      '',
      table(
        ['stage', 'window', 'events', 's', ...groupsShown.map((g) => `${g} CPU-s`), 'CPU-s per 1,000 events'],
        atRate.rows,
      ),
      '',
      `R = (relay with its feed) − (the feed alone), C = (consumer with its feed) − (the feed alone), per 1,000 events; W as above. ` +
        `Sum W + R + C = ${f3(wAtRate)} + ${f3(atRate.relay.per1k)} + ${f3(atRate.consumer.per1k)} = ${f3(sumAtRate)} CPU-s per 1,000 events; ` +
        `whole pipeline ${f3(per1k(wholeStage))}.`,
      `**B5 CPU ratio pipeline / sum of the stages alone at the same rate = ${f3(ratioAtRate)}** (target ≤ 1.3).`,
      '',
      `Draining reading (R and C draining W's backlog in large batches, the table above): sum ${f3(sumStages)} CPU-s per 1,000 events; ` +
        `pipeline / sum = **${f3(ratio)}**.`,
      `(info) Fixed cost in that figure: the idle rates below over the pipeline window come to ${f3(
        (groupsShown.reduce((a, g) => a + ((idleTo[g] ?? 0) - (idleFrom[g] ?? 0)) / idleS, 0) *
          wholeStage.seconds *
          1000) /
          wholeStage.events,
      )} CPU-s per 1,000 events (heartbeats, polls, lane leases; it weighs more at low rates).`,
      '',
      `Idle (everything up, no load, ${idleS} s), CPU-s per second: ${groupsShown
        .map((g) => `${g} ${f3(((idleTo[g] ?? 0) - (idleFrom[g] ?? 0)) / idleS)}`)
        .join(', ')}. ` +
        `PostgreSQL = the bench database's backends (the bench's own probe connections excluded) plus the server's auxiliary processes (checkpointer, background writer, walwriter, launchers), which also serve other databases on a shared machine; broker = the local broker's JVM (shared with other users of the broker). ` +
        `The load generator (this process) is excluded from every figure: it used ${f2(cpuDelta(wholeStage.from, wholeStage.to, ['bench']))} CPU-s in the pipeline window.`,
      `Stage W had ${wErrors} non-201 answers. Stage R: the relay was started with its lanes held by a placeholder owner and timed from the moment it held them (its start-up excluded); stage C from the consumer's first applied event (its start-up and group join excluded).`,
    ];
    return lines.filter((x, i, a) => !(x === '' && a[i - 1] === '')).join('\n');
  } finally {
    if (load) {
      await load.stop().catch(() => undefined);
      load.close();
    }
    await p.close();
  }
}

/** One stage alone at the pipeline's rate: its marginal CPU per 1,000 events, and the table rows behind it. */
interface AtRate {
  per1k: number;
}

/**
 * (R) and (C) of the ratio at the same rate: each stage alone, fed from this process at `rate`,
 * minus what its feed costs alone (PostgreSQL and the broker take the feed's writes; the feeders'
 * own CPU and database connections are never counted). Expects no relay and no consumer running;
 * leaves the consumer running (and no relay).
 */
async function stagesAtRate(
  p: Pipeline,
  rate: number,
  feedTopic: string,
): Promise<{ relay: AtRate; consumer: AtRate; rows: (string | number)[][] }> {
  const groupsShown = ['orders', 'relay', 'consumer', 'postgres', 'broker'];
  const rows: (string | number)[][] = [];
  // The SQL feed: one event per transaction, as the orders service writes them (NOTIFY on).
  const feedPool = new pg.Pool({ connectionString: p.db.url, max: 8, application_name: `${BENCH_APPLICATION}-feeder` });
  feedPool.on('error', () => undefined);
  let feedWritten = 0;
  const otherBefore = p.otherEvents;
  p.otherEvents = () => otherBefore() + feedWritten;
  const payloadOf = (i: number) => ({
    orderId: randomUUID(),
    tenant: 'tenant-a',
    cartId: `feed-${i}`,
    currency: 'EUR',
    amount: 100,
  });
  const sqlFeed = new PacedFeeder(async (i) => {
    const payload = payloadOf(i);
    await withPgTransaction(feedPool, (c) =>
      enqueue(c, {
        topic: feedTopic,
        key: payload.orderId,
        type: 'order.created',
        aggregateType: 'order',
        aggregateId: payload.orderId,
        payload,
      }),
    );
    feedWritten++;
  });
  // The Kafka feed: records as the relay writes them (key, event id and type headers), one send
  // at a time on an idempotent producer with acks=all.
  const producer = p.kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false });
  await producer.connect();
  let kafkaTopic = feedTopic;
  const kafkaFeed = new PacedFeeder(async (i) => {
    const payload = payloadOf(i);
    await producer.send({
      topic: kafkaTopic,
      acks: -1,
      messages: [
        {
          key: payload.orderId,
          value: JSON.stringify(payload),
          headers: { [HEADER_EVENT_ID]: uuidv7(), [HEADER_EVENT_TYPE]: 'order.created' },
        },
      ],
    });
  }, 1);

  /** One window of CPU_S at `rate`, after a 3 s warm-up; `count` reads the events the stage handled. */
  const window = async (
    name: string,
    feed: PacedFeeder,
    groups: string[],
    count: () => Promise<number>,
  ): Promise<{ cpuPerS: number; eventsPerS: number }> => {
    feed.start(rate);
    await sleep(3_000);
    const n0 = await count();
    const s0 = await p.cpu.sample();
    const t0 = performance.now();
    await sleep(CPU_S * 1000);
    const s1 = await p.cpu.sample();
    const t1 = performance.now();
    const n1 = await count();
    await feed.stop();
    const seconds = (t1 - t0) / 1000;
    const cpu = cpuDelta(s0, s1, groups);
    rows.push([
      name,
      groups.join(' + '),
      n1 - n0,
      f1(seconds),
      ...groupsShown.map((g) => (groups.includes(g) ? f2((s1[g] ?? 0) - (s0[g] ?? 0)) : '–')),
      n1 > n0 ? f3((cpu / (n1 - n0)) * 1000) : '–',
    ]);
    if (feed.counters.errors > 0) throw new Error(`${name}: ${feed.counters.errors} feed sends failed`);
    return { cpuPerS: cpu / seconds, eventsPerS: (n1 - n0) / seconds };
  };
  const marginal = (withStage: { cpuPerS: number; eventsPerS: number }, feedAlone: { cpuPerS: number }) =>
    ((withStage.cpuPerS - feedAlone.cpuPerS) / withStage.eventsPerS) * 1000;

  try {
    say(`stage R at ${rate}/s: the SQL feed alone for ${CPU_S} s`);
    const sqlAlone = await window(
      'SQL feed alone (relay stopped)',
      sqlFeed,
      ['postgres', 'broker'],
      async () => feedWritten,
    );
    // Its events were never published: nobody needs them.
    await p.monitor.query('DELETE FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NULL', [feedTopic]);

    const relay = await p.startRelay();
    await waitFor(
      'the relay to hold every lane',
      async () =>
        (
          await p.monitor.query<{ n: number }>(
            'SELECT count(*)::int AS n FROM outboxkit.relay_lanes WHERE owner_id = $1',
            [relay.relayId],
          )
        ).rows[0]!.n === 64,
      { timeoutMs: 30_000, everyMs: 100, children: p.relays },
    );
    say(`stage R at ${rate}/s: the relay with the SQL feed for ${CPU_S} s`);
    const withRelay = await window(
      'relay publishing the SQL feed',
      sqlFeed,
      ['relay', 'postgres', 'broker'],
      async () => (await p.probe()).published,
    );
    await waitFor('the relay to publish the feed', async () => (await p.probe()).pending === 0, {
      timeoutMs: DRAIN_TIMEOUT_MS,
      everyMs: 100,
      children: p.relays,
    });
    await p.stopRelays();

    say(`stage C at ${rate}/s: the Kafka feed alone for ${CPU_S} s`);
    const kafkaAlone = await window(
      'Kafka feed alone (to a topic nobody reads)',
      kafkaFeed,
      ['postgres', 'broker'],
      async () => kafkaFeed.counters.ok,
    );
    await p.startConsumer();
    await p.rebase();
    kafkaTopic = p.topic;
    say(`stage C at ${rate}/s: the consumer with the Kafka feed for ${CPU_S} s`);
    const withConsumer = await window(
      'consumer applying the Kafka feed',
      kafkaFeed,
      ['consumer', 'postgres', 'broker'],
      async () => (await p.probe()).applied,
    );
    // The feed's shipments belong to no order: removed once all are applied, so that the
    // pipeline's "drained" check (orders = shipments) holds again.
    await waitFor(
      'the consumer to apply the feed',
      async () => {
        const { rows: r } = await p.monitor.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM orders_demo.shipments s WHERE NOT EXISTS (SELECT 1 FROM orders_demo.orders o WHERE o.id = s.order_id)`,
        );
        return r[0]!.n >= kafkaFeed.counters.ok;
      },
      { timeoutMs: DRAIN_TIMEOUT_MS, everyMs: 250, children: [p.consumer!] },
    );
    await p.monitor.query(
      'DELETE FROM orders_demo.shipments s WHERE NOT EXISTS (SELECT 1 FROM orders_demo.orders o WHERE o.id = s.order_id)',
    );
    return {
      relay: { per1k: marginal(withRelay, sqlAlone) },
      consumer: { per1k: marginal(withConsumer, kafkaAlone) },
      rows,
    };
  } finally {
    await sqlFeed.stop();
    await kafkaFeed.stop();
    await producer.disconnect().catch(() => undefined);
    await feedPool.end().catch(() => undefined);
  }
}
