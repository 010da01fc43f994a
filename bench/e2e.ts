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
 * 2. CPU-seconds per 1,000 events, at half that rate: each stage alone — (W) HTTP + outbox writes
 *    with relay and consumer stopped, (R) a relay draining that backlog with the consumer stopped,
 *    (C) the consumer consuming it alone — then the whole pipeline at the same rate. Ratio =
 *    pipeline / (W + R + C). Figures include the bench database's PostgreSQL backends, PostgreSQL's
 *    auxiliary processes and the broker's JVM; the load generator (this process) is excluded.
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
  const p = await Pipeline.create({ partitions: PARTITIONS, bench: 'e2e' });
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
      `Sum of the stages alone: ${f3(sumStages)} CPU-s per 1,000 events; whole pipeline: ${f3(per1k(wholeStage))}.`,
      `**B5 CPU ratio pipeline / sum of stages = ${f3(ratio)}** (target ≤ 1.3).`,
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
