/**
 * A long transaction under load (issue #7): `npm run bench -- long-transaction`.
 *
 * The orders pipeline of bench/e2e.ts (orders service, relay daemon(s), shipping consumer, as child
 * processes) runs at a fixed rate below saturation. After a steady period, one more session of the
 * same database runs `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current(); SELECT 1 FROM
 * orders_demo.orders LIMIT 1` and stays idle in transaction: it holds a snapshot and an xid, so
 * VACUUM can remove no row version deleted or updated after it began — the outbox rows the relay
 * marks published stay in the pending index as dead entries every pass has to step over. Then it
 * commits and the load goes on. Reported per window (before, while held, after): throughput
 * (answered, published, applied per second), backlog, commit → shipment latency, and the relay's
 * and PostgreSQL's CPU per 1,000 events; then the ratios held / before and the time to recover.
 * The held transaction only holds back the horizon of its own database (PostgreSQL computes it per
 * database for ordinary tables), so other databases on the server are not affected.
 *
 * Knobs (env): BENCH_LT_RATE (orders/s, 200; set it near B5's highest sustainable rate to see
 * the relay's headroom shrink), BENCH_LT_BEFORE_S (30), BENCH_LT_HOLD_S (180),
 * BENCH_LT_AFTER_S (45), BENCH_LT_WINDOW_S (15), BENCH_LT_RELAYS (1), BENCH_LT_PARTITIONS (3).
 * Smoke run (≈ 1.5 min): BENCH_LT_BEFORE_S=10 BENCH_LT_HOLD_S=30 BENCH_LT_AFTER_S=15 BENCH_LT_WINDOW_S=5.
 */
import pg from 'pg';
import {
  BENCH_APPLICATION,
  cpuDelta,
  f0,
  f1,
  f2,
  knob,
  LoadGenerator,
  loadAverage,
  log,
  measureWindow,
  Pipeline,
  sleep,
  table,
  type LatencyFigures,
  type Probe,
  type Window,
} from './e2e-support.js';
import { machine } from './support.js';

const RATE = knob('BENCH_LT_RATE', 200);
const BEFORE_S = knob('BENCH_LT_BEFORE_S', 30);
const HOLD_S = knob('BENCH_LT_HOLD_S', 180);
const AFTER_S = knob('BENCH_LT_AFTER_S', 45);
const WINDOW_S = knob('BENCH_LT_WINDOW_S', 15);
const RELAYS = knob('BENCH_LT_RELAYS', 1);
const PARTITIONS = knob('BENCH_LT_PARTITIONS', 3);
const say = (m: string) => log('long-transaction', m);

type Phase = 'before' | 'held' | 'after';

interface TableStats {
  deadOutbox: number;
  liveOutbox: number;
  pendingIndexKb: number;
  outboxKb: number;
  deadInbox: number;
}

async function tableStats(p: Pipeline): Promise<TableStats> {
  const { rows } = await p.monitor.query<{
    dead_outbox: number;
    live_outbox: number;
    pending_kb: number;
    outbox_kb: number;
    dead_inbox: number;
  }>(
    `SELECT (SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'outboxkit' AND relname = 'outbox_events')::int AS dead_outbox,
            (SELECT n_live_tup FROM pg_stat_user_tables WHERE schemaname = 'outboxkit' AND relname = 'outbox_events')::int AS live_outbox,
            (pg_relation_size('outboxkit.outbox_events_pending_idx') / 1024)::int AS pending_kb,
            (pg_relation_size('outboxkit.outbox_events') / 1024)::int AS outbox_kb,
            (SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'outboxkit' AND relname = 'inbox')::int AS dead_inbox`,
  );
  const r = rows[0]!;
  return {
    deadOutbox: r.dead_outbox,
    liveOutbox: r.live_outbox,
    pendingIndexKb: r.pending_kb,
    outboxKb: r.outbox_kb,
    deadInbox: r.dead_inbox,
  };
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

export async function run(): Promise<string> {
  const startedAt = Date.now();
  const loadBefore = loadAverage();
  const p = await Pipeline.create({ partitions: PARTITIONS, bench: 'long-tx' });
  let load: LoadGenerator | undefined;
  let holder: pg.Client | undefined;
  try {
    await p.startOrders();
    for (let i = 0; i < RELAYS; i++) await p.startRelay();
    await p.startConsumer();
    load = new LoadGenerator(p.baseUrl);
    const l = load;
    const windows: { phase: Phase; w: Window; startS: number }[] = [];
    const t0 = performance.now();
    const phase = async (name: Phase, seconds: number) => {
      const n = Math.max(1, Math.round(seconds / WINDOW_S));
      for (let i = 0; i < n; i++) {
        const startS = (performance.now() - t0) / 1000;
        const w = await measureWindow(p, l, RATE, seconds / n, { warmMs: 0 });
        windows.push({ phase: name, w, startS });
        say(
          `${name} ${i + 1}/${n}: ${w.verdict}; backlog max ${w.backlogMax}; relay CPU ${f2(cpuDelta(w.cpuFrom, w.cpuTo, ['relay']))} s`,
        );
      }
    };

    say(`pipeline up; ${RATE} orders/s; warming up 5 s`);
    l.setRate(RATE);
    await sleep(5_000);
    const statsStart = await tableStats(p);
    await phase('before', BEFORE_S);
    const statsBefore = await tableStats(p);

    holder = new pg.Client({ connectionString: p.db.url, application_name: `${BENCH_APPLICATION}-long-transaction` });
    await holder.connect();
    await holder.query('BEGIN ISOLATION LEVEL REPEATABLE READ');
    const xid = (await holder.query<{ xid: string }>('SELECT txid_current()::text AS xid')).rows[0]!.xid;
    await holder.query('SELECT 1 FROM orders_demo.orders LIMIT 1');
    const held = (
      await p.monitor.query<{ xmin: string | null; state: string }>(
        `SELECT backend_xmin::text AS xmin, state FROM pg_stat_activity WHERE application_name = $1`,
        [`${BENCH_APPLICATION}-long-transaction`],
      )
    ).rows[0];
    say(`holding xid ${xid} (backend_xmin ${held?.xmin}, ${held?.state}) for ${HOLD_S} s`);
    await phase('held', HOLD_S);
    const statsHeld = await tableStats(p);
    await holder.query('COMMIT');
    await holder.end();
    holder = undefined;
    const releasedAt = performance.now();
    say('released');
    await phase('after', AFTER_S);
    const statsAfter = await tableStats(p);
    await l.stop();
    await p.waitDrained(180_000);

    // Latency per window, once everything is applied.
    const lat = new Map<Window, LatencyFigures>();
    for (const { w } of windows) lat.set(w, await p.latency(w.from, w.to));

    const published = (w: Window) => (w.probes.at(-1)!.published - w.probes[0]!.published) / w.seconds;
    const applied = (w: Window) => (w.probes.at(-1)!.applied - w.probes[0]!.applied) / w.seconds;
    const per1k = (w: Window, group: string) =>
      (cpuDelta(w.cpuFrom, w.cpuTo, [group]) / Math.max(1, w.probes.at(-1)!.published - w.probes[0]!.published)) * 1000;
    const of = (ph: Phase) => windows.filter((x) => x.phase === ph).map((x) => x.w);
    const before = of('before');
    const during = of('held');
    const after = of('after');

    // Recovery: from the release to the first probe after which backlog and in-flight events stay
    // at or below 1.5 × their highest level before the transaction (at least 20 and 50).
    const backlogLimit = Math.max(20, 1.5 * Math.max(...before.map((w) => w.backlogMax)));
    const inFlightLimit = Math.max(50, 1.5 * Math.max(...before.map((w) => w.inFlightMax)));
    const afterProbes: Probe[] = after.flatMap((w) => w.probes);
    const high = (q: Probe) => q.pending > backlogLimit || q.created - q.applied > inFlightLimit;
    const lastHigh = afterProbes.reduce<Probe | undefined>((a, q) => (high(q) ? q : a), undefined);
    const heldPeak = Math.max(...during.map((w) => w.backlogMax));
    let recovery: string;
    if (lastHigh === undefined)
      recovery = `0 s (backlog ≤ ${f0(backlogLimit)} and in flight ≤ ${f0(inFlightLimit)} at every probe after the release)`;
    else if (lastHigh === afterProbes.at(-1)) recovery = `**not recovered** within ${AFTER_S} s`;
    else
      recovery = `${f1((lastHigh.at - releasedAt) / 1000 + 1)} s (last probe above the steady level + 1 s probe interval)`;

    const ratio = (a: number, b: number) => f2(a / b);
    const tputBefore = mean(before.map(published));
    const tputHeld = mean(during.map(published));
    const tputAfter = mean(after.map(published));
    const p99 = (ws: Window[]) => Math.max(...ws.map((w) => lat.get(w)!.p99));
    const relayCpu = (ws: Window[]) => mean(ws.map((w) => per1k(w, 'relay')));
    const pgCpu = (ws: Window[]) => mean(ws.map((w) => per1k(w, 'postgres')));

    return [
      `Machine: ${await machine()}; load average before ${loadBefore}, after ${loadAverage()}; ${RELAYS} relay(s), topic of ${PARTITIONS} partitions; run took ${f0((Date.now() - startedAt) / 1000)} s.`,
      '',
      `Load: ${RATE} orders/s (open loop, HTTP) throughout; ${BEFORE_S} s before, the transaction held ${HOLD_S} s (xid ${xid}, backend_xmin ${held?.xmin ?? 'n/a'}, ${held?.state ?? 'n/a'}), ${AFTER_S} s after; windows of about ${WINDOW_S} s, probed every second.`,
      '',
      table(
        [
          'phase',
          'start s',
          'answered/s',
          'published/s',
          'applied/s',
          'backlog max',
          'in flight max',
          'p50 ms',
          'p99 ms',
          'relay part p99 ms',
          'relay CPU-s / 1k',
          'PostgreSQL CPU-s / 1k',
          'verdict',
        ],
        windows.map(({ phase: ph, w, startS }) => [
          ph,
          f0(startS),
          f0(w.achieved),
          f0(published(w)),
          f0(applied(w)),
          w.backlogMax,
          w.inFlightMax,
          f1(lat.get(w)!.p50),
          f1(lat.get(w)!.p99),
          f1(lat.get(w)!.relayP99),
          f2(per1k(w, 'relay')),
          f2(per1k(w, 'postgres')),
          w.verdict,
        ]),
      ),
      '',
      table(
        ['measure', 'before', 'held', 'after', 'held / before'],
        [
          [
            '**throughput** (published/s, mean of windows)',
            f0(tputBefore),
            f0(tputHeld),
            f0(tputAfter),
            `**${ratio(tputHeld, tputBefore)}** (target ≥ 0.8)`,
          ],
          [
            'backlog max',
            Math.max(...before.map((w) => w.backlogMax)),
            heldPeak,
            Math.max(...after.map((w) => w.backlogMax)),
            '',
          ],
          [
            'commit → shipment p99 ms (worst window)',
            f1(p99(before)),
            f1(p99(during)),
            f1(p99(after)),
            ratio(p99(during), p99(before)),
          ],
          [
            'relay CPU-s per 1,000 events (mean)',
            f2(relayCpu(before)),
            f2(relayCpu(during)),
            f2(relayCpu(after)),
            ratio(relayCpu(during), relayCpu(before)),
          ],
          [
            'PostgreSQL CPU-s per 1,000 events (mean)',
            f2(pgCpu(before)),
            f2(pgCpu(during)),
            f2(pgCpu(after)),
            ratio(pgCpu(during), pgCpu(before)),
          ],
        ],
      ),
      '',
      `Recovery after the commit: ${recovery}.`,
      '',
      table(
        ['outbox_events', 'start', 'end of before', 'end of hold', 'end of after'],
        [
          [
            'dead tuples (pg_stat)',
            statsStart.deadOutbox,
            statsBefore.deadOutbox,
            statsHeld.deadOutbox,
            statsAfter.deadOutbox,
          ],
          [
            'live tuples (pg_stat)',
            statsStart.liveOutbox,
            statsBefore.liveOutbox,
            statsHeld.liveOutbox,
            statsAfter.liveOutbox,
          ],
          [
            'pending index KiB',
            statsStart.pendingIndexKb,
            statsBefore.pendingIndexKb,
            statsHeld.pendingIndexKb,
            statsAfter.pendingIndexKb,
          ],
          ['table KiB', statsStart.outboxKb, statsBefore.outboxKb, statsHeld.outboxKb, statsAfter.outboxKb],
          ['inbox dead tuples', statsStart.deadInbox, statsBefore.deadInbox, statsHeld.deadInbox, statsAfter.deadInbox],
        ],
      ),
      '',
      `At a fixed offered rate below saturation the throughput ratio stays near 1 unless the pipeline falls behind; the relay's CPU per 1,000 events shows how much of its headroom the held snapshot eats (run with BENCH_LT_RATE near B5's highest sustainable rate to turn that into throughput).`,
    ].join('\n');
  } finally {
    await holder?.query('ROLLBACK').catch(() => undefined);
    await holder?.end().catch(() => undefined);
    if (load) {
      await load.stop().catch(() => undefined);
      load.close();
    }
    await p.close();
  }
}
