/**
 * Catch-up after a relay outage under load (issue #7): `npm run bench -- catchup`.
 *
 * The orders pipeline of bench/e2e.ts (orders service, relay daemon(s), shipping consumer, as child
 * processes) runs at a constant rate of orders, plus a sequence writer in this process: events
 * `{ key, n }` on a second topic, n = 1, 2, 3... per key, each key written by one chain of
 * transactions (so commit order = n order). Under that load the relay(s) are stopped for a while
 * (SIGTERM by default: a graceful stop), then restarted while the load continues. Measured: the
 * backlog, the relay's drain rate while the load goes on (gross: events published per second;
 * net: backlog removed per second), the time until the backlog and the consumer are back to
 * their steady level. Then the load stops, the pipeline drains, and both topics are read back
 * from Kafka: every outbox event present (zero loss), every order shipped once, and within each
 * key of the sequence topic the first occurrences in n order (no reordering) with no gap.
 *
 * Knobs (env): BENCH_CATCHUP_RATE (orders/s, 200), BENCH_CATCHUP_SEQ_RATE (sequence events/s,
 * 100), BENCH_CATCHUP_SEQ_KEYS (50), BENCH_CATCHUP_WARM_S (20), BENCH_CATCHUP_STOP_S (60),
 * BENCH_CATCHUP_AFTER_S (15), BENCH_CATCHUP_RELAYS (1), BENCH_CATCHUP_SIGKILL (0; 1 kills the
 * relays with SIGKILL: the restarted relay then waits for the lanes' leases, 10 s),
 * BENCH_CATCHUP_PARTITIONS (3), BENCH_CATCHUP_B2 (the B2 drain rate to print beside, events/s;
 * default the quiet-machine figure of bench/RESULTS.md).
 * Smoke run (≈ 1.5 min): BENCH_CATCHUP_WARM_S=8 BENCH_CATCHUP_STOP_S=15 BENCH_CATCHUP_AFTER_S=5.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { enqueue } from '../src/index.js';
import {
  BENCH_APPLICATION,
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
  type Probe,
} from './e2e-support.js';
import { machine } from './support.js';

const RATE = knob('BENCH_CATCHUP_RATE', 200);
const SEQ_RATE = knob('BENCH_CATCHUP_SEQ_RATE', 100);
const SEQ_KEYS = knob('BENCH_CATCHUP_SEQ_KEYS', 50);
const WARM_S = knob('BENCH_CATCHUP_WARM_S', 20);
const STOP_S = knob('BENCH_CATCHUP_STOP_S', 60);
const AFTER_S = knob('BENCH_CATCHUP_AFTER_S', 15);
const RELAYS = knob('BENCH_CATCHUP_RELAYS', 1);
const SIGKILL = knob('BENCH_CATCHUP_SIGKILL', 0) === 1;
const PARTITIONS = knob('BENCH_CATCHUP_PARTITIONS', 3);
/** B2, quiet machine, bench/RESULTS.md (relay daemon, 200k pending events, after the pending index fix). */
const B2_RATE = knob('BENCH_CATCHUP_B2', 17_296);
const CATCHUP_TIMEOUT_MS = 300_000;
const say = (m: string) => log('catchup', m);

/**
 * Writes `{ key, n }` events at `rate` per second over `keys` keys; the transactions of one key
 * run one after another, so n increases in commit order within a key.
 */
class SequenceWriter {
  /** Committed events per key (the highest n). */
  readonly committed = new Map<string, number>();
  errors = 0;
  private readonly chains = new Map<string, Promise<void>>();
  private timer: NodeJS.Timeout | undefined;
  private sent = 0;
  private t0 = 0;

  constructor(
    private readonly pool: pg.Pool,
    private readonly topic: string,
    private readonly keys: number,
    private readonly rate: number,
  ) {}

  start(): void {
    if (this.rate <= 0) return;
    this.t0 = performance.now();
    this.timer = setInterval(() => {
      const due = Math.floor(((performance.now() - this.t0) * this.rate) / 1000) - this.sent;
      for (let i = 0; i < due; i++) {
        const key = `seq-${this.sent++ % this.keys}`;
        this.chains.set(
          key,
          (this.chains.get(key) ?? Promise.resolve()).then(() => this.write(key)),
        );
      }
    }, 10);
  }

  private async write(key: string): Promise<void> {
    const n = (this.committed.get(key) ?? 0) + 1;
    const c = await this.pool.connect();
    try {
      await c.query('BEGIN');
      await enqueue(c, { topic: this.topic, key, type: 'bench.seq', payload: { key, n } });
      await c.query('COMMIT');
      this.committed.set(key, n);
    } catch {
      this.errors++;
      await c.query('ROLLBACK').catch(() => undefined);
    } finally {
      c.release();
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await Promise.all(this.chains.values());
  }

  get total(): number {
    let t = 0;
    for (const n of this.committed.values()) t += n;
    return t;
  }
}

/** What was read back from Kafka. */
interface ReadBack {
  eventIds: Set<string>;
  messages: number;
  /** Per key of the sequence topic, n in partition order. */
  sequences: Map<string, number[]>;
}

async function readBack(p: Pipeline, seqTopic: string, expected: number): Promise<ReadBack> {
  const consumer = p.kafka.consumer({ groupId: `verify-${randomBytes(4).toString('hex')}`, maxWaitTimeInMs: 200 });
  const out: ReadBack = { eventIds: new Set(), messages: 0, sequences: new Map() };
  await consumer.connect();
  await consumer.subscribe({ topics: [p.topic, seqTopic], fromBeginning: true });
  let last = performance.now();
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ topic, message }) => {
      out.messages++;
      last = performance.now();
      const id = message.headers?.['event-id']?.toString();
      if (id) out.eventIds.add(id);
      if (topic === seqTopic) {
        const { key, n } = JSON.parse(message.value!.toString()) as { key: string; n: number };
        const list = out.sequences.get(key) ?? [];
        list.push(n);
        out.sequences.set(key, list);
      }
    },
  });
  // Until every expected event id was seen, or nothing new came for 20 s.
  while (out.eventIds.size < expected && performance.now() - last < 20_000) await sleep(200);
  await consumer.disconnect();
  return out;
}

export async function run(): Promise<string> {
  const startedAt = Date.now();
  const loadBefore = loadAverage();
  const seqTopic = `bench.catchup-seq.${randomBytes(4).toString('hex')}`;
  const p = await Pipeline.create({ partitions: PARTITIONS, bench: 'catchup', extraTopics: [seqTopic] });
  const seqPool = new pg.Pool({ connectionString: p.db.url, max: 8, application_name: `${BENCH_APPLICATION}-seq` });
  let load: LoadGenerator | undefined;
  let seq: SequenceWriter | undefined;
  try {
    await p.startOrders();
    for (let i = 0; i < RELAYS; i++) await p.startRelay();
    await p.startConsumer();
    load = new LoadGenerator(p.baseUrl);
    seq = new SequenceWriter(seqPool, seqTopic, SEQ_KEYS, SEQ_RATE);
    const writer = seq;
    p.otherEvents = () => writer.total;
    say(`pipeline up; ${RATE} orders/s + ${SEQ_RATE} sequence events/s; steady for ${WARM_S} s`);
    seq.start();
    const steady = await measureWindow(p, load, RATE, WARM_S, { warmMs: 5_000 });
    say(`steady: ${steady.verdict}, backlog max ${steady.backlogMax}, in flight max ${steady.inFlightMax}`);

    // Outage.
    const stopSignal = SIGKILL ? 'SIGKILL' : 'SIGTERM';
    say(`stopping the relay(s) with ${stopSignal} for ${STOP_S} s`);
    const tStop = performance.now();
    await p.stopRelays(stopSignal);
    await sleep(STOP_S * 1000);
    const atRestart = await p.probe();
    const restartDb = atRestart.dbNow;
    say(`restarting; backlog ${atRestart.pending}`);
    const tRestart = performance.now();
    for (let i = 0; i < RELAYS; i++) await p.startRelay();

    // Catch-up, probing every 50 ms (200 ms once the relay caught up) while the load goes on.
    const backlogSteady = Math.max(50, 2 * steady.backlogMax);
    const inFlightSteady = Math.max(100, 2 * steady.inFlightMax);
    const probes: Probe[] = [];
    let first: Probe | undefined;
    let caught: Probe | undefined;
    let consumerCaught: Probe | undefined;
    const deadline = performance.now() + CATCHUP_TIMEOUT_MS;
    while (!consumerCaught) {
      if (performance.now() > deadline) throw new Error('the pipeline did not catch up within 5 minutes');
      p.checkAlive();
      const q = await p.probe();
      probes.push(q);
      const prev = probes[probes.length - 2];
      // The first event published by the restarted relay(s) (published counts from probes jitter
      // by the transactions in flight, so ask the table).
      if (!first && prev) {
        const { rows } = await p.monitor.query<{ any: boolean }>(
          'SELECT EXISTS (SELECT 1 FROM outboxkit.outbox_events WHERE published_at >= $1::timestamptz) AS any',
          [restartDb],
        );
        if (rows[0]!.any) first = prev;
      }
      if (first && !caught && q.pending <= backlogSteady) caught = q;
      if (caught && q.created - q.applied <= inFlightSteady) consumerCaught = q;
      await sleep(caught ? 200 : 50);
    }
    const peak = probes.reduce((a, q) => (q.pending > a.pending ? q : a), atRestart);
    say(
      `relay caught up after ${f1((caught!.at - first!.at) / 1000)} s; consumer after ${f1((consumerCaught.at - first!.at) / 1000)} s`,
    );
    const after = await measureWindow(p, load, RATE, AFTER_S, { warmMs: 0 });

    // Drain and verify.
    await load.stop();
    await seq.stop();
    await p.waitDrained(CATCHUP_TIMEOUT_MS);
    const count = async (text: string, values: unknown[] = []) =>
      (await p.monitor.query<{ n: number }>(text, values)).rows[0]!.n;
    const orders = await count('SELECT count(*)::int AS n FROM orders_demo.orders');
    const shipments = await count('SELECT count(*)::int AS n FROM orders_demo.shipments');
    const orphans = await count(
      `SELECT count(*)::int AS n FROM orders_demo.shipments s
        WHERE NOT EXISTS (SELECT 1 FROM orders_demo.orders o WHERE o.id = s.order_id)`,
    );
    const unshipped = await count(
      `SELECT count(*)::int AS n FROM orders_demo.orders o
        WHERE NOT EXISTS (SELECT 1 FROM orders_demo.shipments s WHERE s.order_id = o.id)`,
    );
    const events = (
      await p.monitor.query<{ event_id: string }>('SELECT event_id FROM outboxkit.outbox_events')
    ).rows.map((r) => r.event_id);
    const unpublished = await count(
      'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL',
    );
    say(`reading ${events.length} events back from Kafka`);
    const back = await readBack(p, seqTopic, events.length);
    const missingInKafka = events.filter((id) => !back.eventIds.has(id)).length;
    let outOfOrder = 0;
    let missingSeq = 0;
    let duplicateSeq = 0;
    for (const [key, last] of seq.committed) {
      const seen = new Set<number>();
      let highest = 0;
      for (const n of back.sequences.get(key) ?? []) {
        if (seen.has(n)) {
          duplicateSeq++;
          continue;
        }
        seen.add(n);
        if (n < highest) outOfOrder++;
        highest = Math.max(highest, n);
      }
      for (let n = 1; n <= last; n++) if (!seen.has(n)) missingSeq++;
    }
    const checks: [string, boolean][] = [
      [`orders answered 201 = orders in the database (${load.counters.ok} / ${orders})`, load.counters.ok === orders],
      [
        `every order shipped once (${shipments} shipments, ${unshipped} orders without one)`,
        shipments === orders && unshipped === 0,
      ],
      [`no shipment without its order (${orphans})`, orphans === 0],
      [`every outbox event published (${unpublished} left)`, unpublished === 0],
      [`every outbox event in Kafka (${missingInKafka} of ${events.length} missing)`, missingInKafka === 0],
      [
        `sequence topic: no gap (${missingSeq} missing of ${seq.total}), no reordering within a key (${outOfOrder} first occurrences out of order)`,
        missingSeq === 0 && outOfOrder === 0,
      ],
      [
        `no load error (HTTP ${load.counters.errors}, sequence writer ${seq.errors})`,
        load.counters.errors === 0 && seq.errors === 0,
      ],
    ];
    const pass = checks.every(([, ok]) => ok);

    const span = (a: Probe, b: Probe) => (b.at - a.at) / 1000;
    const drainS = span(first!, caught!);
    const gross = (caught!.published - first!.published) / drainS;
    const net = (first!.pending - caught!.pending) / drainS;
    const incoming = (caught!.createdAll - first!.createdAll) / drainS;
    return [
      `Machine: ${await machine()}; load average before ${loadBefore}, after ${loadAverage()}; ${RELAYS} relay(s) stopped with ${stopSignal}; topics of ${PARTITIONS} partitions; run took ${f0((Date.now() - startedAt) / 1000)} s.`,
      '',
      `Load: ${RATE} orders/s over HTTP (each order one \`order.created\` event, key = order id) plus ${SEQ_RATE} sequence events/s on ${SEQ_KEYS} keys written in this process; steady ${WARM_S} s, relay(s) stopped ${STOP_S} s, restarted while the load went on, ${AFTER_S} s more, then drained and read back from Kafka.`,
      '',
      table(
        ['measure', 'value'],
        [
          [
            'steady before the outage',
            `${steady.verdict}; achieved ${f0(steady.achieved)} orders/s; backlog max ${steady.backlogMax}; in flight max ${steady.inFlightMax}`,
          ],
          ['backlog when the relay(s) restarted', atRestart.pending],
          [
            'restart → first publish (process start, lanes)',
            `${f1((first!.at - tRestart) / 1000)} s (outage from stop ${f1((first!.at - tStop) / 1000)} s)`,
          ],
          ['backlog peak', peak.pending],
          [`relay catch-up: first publish → backlog ≤ ${backlogSteady}`, `${f1(drainS)} s`],
          ['**drain rate while the load continues, gross** (events published/s)', `**${f0(gross)}**`],
          ['drain rate, net (backlog removed/s)', f0(net)],
          ['events created meanwhile (per s)', f0(incoming)],
          [
            `B2 drain rate (no load; ${knob('BENCH_CATCHUP_B2', 0) > 0 ? 'BENCH_CATCHUP_B2' : 'bench/RESULTS.md, quiet machine'})`,
            f0(B2_RATE),
          ],
          ['gross catch-up rate / B2', `**${f2(gross / B2_RATE)}**`],
          [`consumer catch-up: first publish → in flight ≤ ${inFlightSteady}`, `${f1(span(first!, consumerCaught))} s`],
          [
            'after the catch-up',
            `${after.verdict}; achieved ${f0(after.achieved)} orders/s; backlog max ${after.backlogMax}; in flight max ${after.inFlightMax}`,
          ],
        ],
      ),
      '',
      '| check | result |',
      '| --- | --- |',
      ...checks.map(([name, ok]) => `| ${name} | ${ok ? 'ok' : '**FAIL**'} |`),
      '',
      `Catch-up verification: **${pass ? 'PASS' : 'FAIL'}** (${back.messages} messages read back, ${back.messages - back.eventIds.size} of them duplicates; ${duplicateSeq} duplicate sequence events, first occurrences checked).`,
    ].join('\n');
  } finally {
    if (load) {
      await load.stop().catch(() => undefined);
      load.close();
    }
    await seq?.stop();
    await seqPool.end().catch(() => undefined);
    await p.close();
  }
}
