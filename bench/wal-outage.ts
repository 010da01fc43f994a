/**
 * A long partition outage under load for the WAL relay (issue 19): `npm run bench -- wal-outage`.
 *
 * On the local 3-node Kafka cluster (scripts/services.ts) a topic of 3 partitions, each with its
 * only replica on its own broker ([[1], [2], [3]]). `outboxkit relay --source wal` runs as a child
 * process (`node --import tsx cli/main.ts`: the child's pid is the relay's node process, whose
 * VmRSS is read from /proc) on a fresh database of the WAL PostgreSQL (`ensureWalPostgres()`),
 * migrated with `migrate({ walPublication: true })`, with a slot of its own. WAL writers
 * (`createOutbox({ source: 'wal' })`, one event per transaction, one transaction after another,
 * keys from a set of BENCH_KEYS) enqueue at BENCH_RATE events/s: BENCH_WARM_MS of warm-up, then the
 * broker holding one partition's only replica (not the active controller) is SIGKILLed for
 * BENCH_OUTAGE_MS and restarted, the writers go on BENCH_AFTER_MS more and stop.
 *
 * The relay holds the events of the dead partition, and the later events of their keys, in the
 * table (docs/wal-source.md, "Held keys") and confirms the slot past them: its memory should stay
 * flat and the slot should retain little WAL. Every BENCH_SAMPLE_MS: the relay's RSS, the slot's
 * retained WAL (current WAL position - restart_lsn) and confirmed lag (current - confirmed_flush_lsn),
 * held rows and keys, all rows, and the relay's /metrics (heap, published, held keys, blocked
 * partitions); its RSS is also read every second, for its maximum and trend. After the restart: the
 * time until no row is held; then, once every row is gone, the topic is read back and checked
 * (checkTopic of test/cluster/outage-harness.ts: none lost, none invented, each key's first
 * occurrences in commit order). The records on the partitions that stayed up at each sample are
 * counted from that read-back, by Kafka timestamp: ListOffsets cannot be asked during the outage
 * (kafkajs's fetchTopicOffsets asks every partition's leader and fails while one has none;
 * @platformatic/kafka's metadata request failed too).
 *
 * The retained WAL is the server's: other sessions' writes on the same server count in it.
 *
 * Run it from the checkout that started the cluster: scripts/services.ts knows the nodes by their
 * home under its own .services/ (the bench refuses to start otherwise).
 *
 * Knobs (env): BENCH_RATE (events/s, 100), BENCH_KEYS (1,000), BENCH_PAYLOAD_BYTES (JSON bytes per
 * event, 256), BENCH_WARM_MS (60,000), BENCH_OUTAGE_MS (600,000), BENCH_AFTER_MS (60,000),
 * BENCH_SAMPLE_MS (10,000). Try it quickly with BENCH_OUTAGE_MS=60000 (about 4 minutes).
 */
import { createInterface } from 'node:readline';
import { createWriteStream, readFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import {
  activeController,
  clusterNodes,
  ensureKafkaCluster,
  ensureWalPostgres,
  killClusterNode,
  partitionLeaders,
  restartClusterNode,
} from '../scripts/services.js';
import { migrate } from '../src/migrate.js';
import { createOutbox } from '../src/outbox/enqueue.js';
import { checkTopic, clusterKafka, keptUp, readBack, startWriters } from '../test/cluster/outage-harness.js';
import {
  exited,
  f0,
  f1,
  f2,
  knob,
  loadAverage,
  log,
  sleep,
  slope,
  startChild,
  stopChild,
  table,
  waitFor,
  type Child,
} from './e2e-support.js';
import { machine, paddedJson } from './support.js';

const RATE = knob('BENCH_RATE', 100);
const KEYS = knob('BENCH_KEYS', 1_000);
const PAYLOAD_BYTES = knob('BENCH_PAYLOAD_BYTES', 256);
const WARM_MS = knob('BENCH_WARM_MS', 60_000);
const OUTAGE_MS = knob('BENCH_OUTAGE_MS', 600_000);
const AFTER_MS = knob('BENCH_AFTER_MS', 60_000);
const SAMPLE_MS = knob('BENCH_SAMPLE_MS', 10_000);
/** The relay's RSS is also read this often, for its maximum (printed only every SAMPLE_MS). */
const RSS_EVERY_MS = 1_000;
const DRAIN_TIMEOUT_MS = 300_000;
const READ_BACK_TIMEOUT_MS = 600_000;
const MB = 2 ** 20;
const say = (m: string) => log('wal-outage', m);

type Phase = 'warm-up' | 'outage' | 'restart' | 'after' | 'drain';

/** One sample of the run. */
interface Sample {
  /** Seconds since the writers started. */
  t: number;
  phase: Phase;
  rssMb: number | undefined;
  /** V8 heap in use in the relay (its /metrics), MB. */
  heapMb: number | undefined;
  retainedBytes: number;
  confirmedLagBytes: number;
  /** The server's WAL position (bytes from 0/0), and the WAL the server wrote since the previous sample. */
  walBytes: number;
  walSinceBytes: number;
  held: number;
  heldKeys: number;
  rows: number;
  /** When it was taken (ms since the epoch). */
  at: number;
  /**
   * Records on the partitions that stayed up with a Kafka timestamp (set by the relay's producer
   * when it sends) up to the sample's time: filled in from the read-back at the end.
   */
  live: number | undefined;
  /** Events committed by the writers so far. */
  written: number;
  /** The relay's outboxkit_relay_published_total. */
  published: number | undefined;
  /** The relay's outboxkit_wal_relay_held_keys (the keys it keeps in memory). */
  relayHeldKeys: number | undefined;
  /** The relay's outboxkit_relay_partitions_blocked. */
  blocked: number | undefined;
}

/** VmRSS of `pid` in bytes, from /proc; undefined once it is gone. */
function rssOf(pid: number): number | undefined {
  try {
    const kb = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
    return kb === undefined ? undefined : Number(kb) * 1024;
  } catch {
    return undefined;
  }
}

/** The command line of `pid` (NUL-separated arguments joined by spaces). */
function commandOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
  } catch {
    return '';
  }
}

/** The child processes of `pid` (their pids), from /proc. */
function childrenOf(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(' ').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** The samples of the relay's /metrics named in `names` (unlabelled, or summed over labels). */
async function scrape(port: number, names: readonly string[]): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  try {
    const res = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(3_000) });
    for (const line of (await res.text()).split('\n')) {
      const m = /^([a-z_]+)(?:\{[^}]*\})? (\S+)/.exec(line);
      if (m && names.includes(m[1]!)) out.set(m[1]!, (out.get(m[1]!) ?? 0) + Number(m[2]));
    }
  } catch {
    // A scrape that fails leaves these figures unknown for the sample.
  }
  return out;
}

export async function run(): Promise<string> {
  const startedAt = Date.now();
  const loads: string[] = [loadAverage()];
  const walUrl = await ensureWalPostgres(say);
  const { brokers } = await ensureKafkaCluster(say);
  // scripts/services.ts knows a node by its home under this checkout's .services/: nodes another
  // checkout started answer, but cannot be killed or restarted from here (a restart would start a
  // second process on the same storage). Refused before anything is set up.
  const unknown = clusterNodes().filter((n) => n.pid === undefined);
  if (unknown.length > 0) {
    throw new Error(
      `Kafka cluster node(s) ${unknown.map((n) => n.id).join(', ')} answer but were not started from this checkout ` +
        '(or are down): run the bench from the checkout that started the cluster.',
    );
  }
  const { kafka, client } = clusterKafka(brokers);
  const hex = randomBytes(4).toString('hex');
  const dbName = `outboxkit_bench_wal_${hex}`;
  const slot = `bench_outage_${hex}`;
  const topic = `bench.wal-outage.${hex}`;
  const admin = new pg.Client({ connectionString: walUrl });
  await admin.connect();
  await admin.query(`CREATE DATABASE ${dbName}`);
  const url = new URL(walUrl);
  url.pathname = `/${dbName}`;
  const dbUrl = url.toString();
  const pool = new pg.Pool({ connectionString: dbUrl, max: 4, application_name: 'outboxkit-bench-wal-outage' });
  const monitor = new pg.Pool({ connectionString: dbUrl, max: 2, application_name: 'outboxkit-bench-monitor' });
  const kadmin = kafka.admin();
  let relay: Child | undefined;
  let writers: ReturnType<typeof startWriters> | undefined;
  let victim: number | undefined;
  let keepTopic = false;
  let sampler: NodeJS.Timeout | undefined;
  let rssTimer: NodeJS.Timeout | undefined;
  const relayLog = path.join(tmpdir(), `outboxkit-bench-wal-outage-${hex}.log`);
  try {
    await migrate({ connectionString: dbUrl, walPublication: true });
    await kadmin.connect();
    await kadmin.createTopics({
      waitForLeaders: false,
      topics: [{ topic, replicaAssignment: [[1], [2], [3]].map((replicas, partition) => ({ partition, replicas })) }],
    });
    await waitFor(
      `leaders of ${topic}`,
      async () => (await partitionLeaders(topic)).filter((p) => p.leader !== undefined).length === 3,
      { timeoutMs: 30_000, everyMs: 250 },
    );

    // The relay, from the sources, its node process the child itself (no npx/tsx wrapper).
    relay = startChild(
      'wal relay',
      'cli/main.ts',
      [
        'relay',
        '--source',
        'wal',
        '--database-url',
        dbUrl,
        '--brokers',
        brokers.join(','),
        '--wal-slot',
        slot,
        '--metrics-port',
        '0',
        '--log-level',
        'info',
      ],
      {},
    );
    const pid = relay.pid;
    const out = createWriteStream(relayLog);
    for (const stream of [relay.proc.stdout!, relay.proc.stderr!]) {
      createInterface({ input: stream }).on('line', (line) => {
        out.write(`${line}\n`);
        // Warnings and errors (pino levels 40 and up) are worth seeing as they come.
        if (/"level":(4|5|6)0/.test(line)) say(`relay: ${line.slice(0, 400)}`);
      });
    }
    const current = relay;
    let port = 0;
    await waitFor(
      'the relay streaming',
      async () => {
        const line = current.lines.find((l) => l.includes('metrics and health endpoints listening'));
        if (line) port = (JSON.parse(line) as { port: number }).port;
        if (port === 0) return false;
        const res = await fetch(`http://127.0.0.1:${port}/readyz`).catch(() => undefined);
        return res?.status === 200;
      },
      { timeoutMs: 60_000, everyMs: 250, children: [current] },
    );
    const command = commandOf(pid);
    if (!command.includes('cli/main.ts relay')) throw new Error(`pid ${pid} is not the relay: ${command}`);
    // A loader that ran a helper process beside the relay would hide memory from VmRSS: listed.
    const relayChildren = childrenOf(pid).map(
      (c) => `${c} (${commandOf(c).slice(0, 60)}, ${f1((rssOf(c) ?? NaN) / MB)} MB)`,
    );
    say(
      `relay pid ${pid} (${command.slice(0, 120)}…), children [${relayChildren.join(', ')}], metrics on ${port}, log ${relayLog}`,
    );

    // The samples.
    const samples: Sample[] = [];
    const rss: { at: number; phase: Phase; bytes: number }[] = [];
    let phase: Phase = 'warm-up';
    const outbox = createOutbox({ source: 'wal' });
    writers = startWriters(pool, {
      ratePerSecond: RATE,
      topicOf: () => topic,
      keyOf: (n) => `key-${(n * 7) % KEYS}`,
      write: (c, e) => outbox.enqueue(c, [{ ...e, payload: paddedJson(e.payload, PAYLOAD_BYTES) }]),
    });
    const written = writers.written;
    const t0 = Date.now();
    const seconds = () => (Date.now() - t0) / 1000;
    rssTimer = setInterval(() => {
      const bytes = rssOf(pid);
      if (bytes !== undefined) rss.push({ at: seconds(), phase, bytes });
    }, RSS_EVERY_MS);
    let sampling: Promise<void> = Promise.resolve();
    const sample = async (): Promise<void> => {
      const [{ rows: slotRows }, { rows: counts }, metrics] = await Promise.all([
        monitor.query<{ retained: string; lag: string; wal: string }>(
          `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS lag,
                  pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal
             FROM pg_replication_slots WHERE slot_name = $1`,
          [slot],
        ),
        monitor.query<{ held: number; held_keys: number; rows: number }>(
          `SELECT count(*) FILTER (WHERE next_attempt_at IS NOT NULL AND published_at IS NULL)::int AS held,
                  count(DISTINCT key) FILTER (WHERE next_attempt_at IS NOT NULL AND published_at IS NULL)::int AS held_keys,
                  count(*)::int AS rows
             FROM outboxkit.outbox_events`,
        ),
        scrape(port, [
          'nodejs_heap_size_used_bytes',
          'outboxkit_relay_published_total',
          'outboxkit_wal_relay_held_keys',
          'outboxkit_relay_partitions_blocked',
        ]),
      ]);
      const heap = metrics.get('nodejs_heap_size_used_bytes');
      const wal = Number(slotRows[0]?.wal ?? NaN);
      const s: Sample = {
        t: seconds(),
        at: Date.now(),
        phase,
        rssMb: ((b) => (b === undefined ? undefined : b / MB))(rssOf(pid)),
        heapMb: heap === undefined ? undefined : heap / MB,
        retainedBytes: Number(slotRows[0]?.retained ?? NaN),
        confirmedLagBytes: Number(slotRows[0]?.lag ?? NaN),
        walBytes: wal,
        walSinceBytes: wal - (samples[samples.length - 1]?.walBytes ?? NaN),
        held: counts[0]!.held,
        heldKeys: counts[0]!.held_keys,
        rows: counts[0]!.rows,
        live: undefined,
        written: written.length,
        published: metrics.get('outboxkit_relay_published_total'),
        relayHeldKeys: metrics.get('outboxkit_wal_relay_held_keys'),
        blocked: metrics.get('outboxkit_relay_partitions_blocked'),
      };
      samples.push(s);
      say(
        `${f0(s.t).padStart(4)} s ${s.phase.padEnd(7)} rss ${f1(s.rssMb ?? NaN)} MB heap ${f1(s.heapMb ?? NaN)} MB ` +
          `retained ${f0(s.retainedBytes / 1024)} KiB lag ${f0(s.confirmedLagBytes / 1024)} KiB ` +
          `server WAL +${f0(s.walSinceBytes / 1024)} KiB held ${s.held} ` +
          `(${s.heldKeys} keys; relay ${s.relayHeldKeys ?? 'n/a'} keys, ${s.blocked ?? 'n/a'} blocked) rows ${s.rows} written ${s.written} published ${s.published ?? 'n/a'}`,
      );
    };
    sampler = setInterval(() => {
      sampling = sampling.then(sample).catch((err: unknown) => say(`sample failed: ${String(err)}`));
    }, SAMPLE_MS);
    const watch = async (ms: number) => {
      const until = Date.now() + ms;
      while (Date.now() < until) {
        if (exited(current))
          throw new Error(`the relay exited (${current.proc.exitCode}):\n${current.lines.slice(-20).join('\n')}`);
        await sleep(Math.min(1_000, until - Date.now()));
      }
    };

    say(`writing ${RATE} events/s over ${KEYS} keys; warm-up ${WARM_MS / 1000} s`);
    await watch(WARM_MS);
    await sample();
    const warmEnd = samples[samples.length - 1]!;

    const controller = activeController();
    if (controller === undefined) throw new Error('no active controller found (an election in progress?)');
    const target = [3, 2, 1].find((id) => id !== controller)!;
    const deadPartition = target - 1;
    say(
      `killing node ${target} (the only replica of ${topic}-${deadPartition}; the active controller is ${controller})`,
    );
    phase = 'outage';
    loads.push(loadAverage());
    const killedAt = Date.now();
    await killClusterNode(target);
    victim = target;
    await watch(OUTAGE_MS);

    phase = 'restart';
    loads.push(loadAverage());
    const restartAt = Date.now();
    say(`restarting node ${target} after ${f0((restartAt - killedAt) / 1000)} s`);
    await restartClusterNode(target, say);
    victim = undefined;
    const backAt = Date.now();
    await sampling;
    const heldAtRestart = samples[samples.length - 1]?.held ?? 0;
    phase = 'after';
    // The held rows drain while the writers go on.
    let drainedAt: number | undefined;
    const afterUntil = backAt + AFTER_MS;
    while (Date.now() < afterUntil || drainedAt === undefined) {
      if (exited(current)) throw new Error(`the relay exited (${current.proc.exitCode})`);
      if (Date.now() - backAt > DRAIN_TIMEOUT_MS) throw new Error('the held rows did not drain within 5 minutes');
      if (drainedAt === undefined) {
        const { rows } = await monitor.query<{ n: number }>(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE next_attempt_at IS NOT NULL AND published_at IS NULL',
        );
        if (rows[0]!.n === 0) {
          drainedAt = Date.now();
          say(`no row held ${f1((drainedAt - backAt) / 1000)} s after the broker was back`);
        }
      }
      await sleep(250);
    }
    phase = 'drain';
    await writers.stop();
    const stoppedAt = Date.now();
    say(`writers stopped: ${written.length} events`);
    await waitFor(
      'every row published and deleted',
      async () => (await monitor.query('SELECT 1 FROM outboxkit.outbox_events LIMIT 1')).rowCount === 0,
      { timeoutMs: DRAIN_TIMEOUT_MS, everyMs: 250, children: [current] },
    );
    clearInterval(sampler);
    sampler = undefined;
    await sampling;
    await sample();
    const endSample = samples[samples.length - 1]!;
    clearInterval(rssTimer);
    rssTimer = undefined;
    loads.push(loadAverage());

    say(`reading ${written.length} events back from ${topic}`);
    const records = await readBack(kafka, topic, new Set(written.map((w) => w.n)), READ_BACK_TIMEOUT_MS);
    const { problems, duplicates } = checkTopic(written, records);
    // A failed check leaves the topic for a look (named in the output).
    keepTopic = problems.length > 0;
    const waits = (key: string) => client.partitionForKey(key, 3) === deadPartition;
    const upRecords = records.filter((r) => r.partition !== deadPartition);
    for (const s of samples) s.live = upRecords.filter((r) => r.timestamp <= s.at).length;
    const liveKeptUp = keptUp(
      upRecords,
      written.filter((w) => !waits(w.key)),
      killedAt + 15_000,
      restartAt,
    );
    await stopChild(current);
    relay = undefined;

    // Figures.
    const during = (p: (x: { phase: Phase }) => boolean) => rss.filter(p).map((r) => r.bytes / MB);
    const outageRss = during((r) => r.phase === 'outage');
    // The trend, MB per minute (least squares over the reads), over the outage and its second half.
    const outageReads = rss.filter((r) => r.phase === 'outage');
    const half = outageReads.length > 0 ? (outageReads[0]!.at + outageReads[outageReads.length - 1]!.at) / 2 : 0;
    const trend = (reads: typeof rss) => 60 * slope(reads.map((r) => ({ x: r.at, y: r.bytes / MB })));
    const warmRss = during((r) => r.phase === 'warm-up');
    const max = (xs: number[]) => (xs.length === 0 ? NaN : Math.max(...xs));
    const min = (xs: number[]) => (xs.length === 0 ? NaN : Math.min(...xs));
    const inOutage = samples.filter((s) => s.phase === 'outage');
    const heldMax = max(samples.map((s) => s.held));
    const heldKeysMax = max(samples.map((s) => s.heldKeys));
    const retainedMax = max(samples.map((s) => s.retainedBytes));
    const retainedOutageMax = max(inOutage.map((s) => s.retainedBytes));
    const lagMax = max(samples.map((s) => s.confirmedLagBytes));
    const pass = problems.length === 0;
    const rate = written.length / ((stoppedAt - t0) / 1000);
    const kib = (b: number) => `${f0(b / 1024)} KiB`;
    return [
      `Machine: ${await machine()}; load average (1, 5, 15 min) at start ${loads[0]}, at the kill ${loads[1]}, at the restart ${loads[2]}, at the end ${loads[3]}; run took ${f0((Date.now() - startedAt) / 1000)} s.`,
      '',
      `Load: ${RATE} events/s (achieved ${f1(rate)}/s), one per transaction, ${PAYLOAD_BYTES} bytes of JSON, keys from ${KEYS}; topic of 3 partitions, replicas [[1], [2], [3]]; node ${target} (the only replica of partition ${deadPartition}) SIGKILLed after ${WARM_MS / 1000} s of warm-up, restarted after ${f0((restartAt - killedAt) / 1000)} s (registered again ${f1((backAt - restartAt) / 1000)} s later), writers on ${AFTER_MS / 1000} s more. Relay: \`outboxkit relay --source wal\` (pid ${pid}, ${relayChildren.length === 0 ? 'no child process' : `children at start ${relayChildren.join(', ')}`}), defaults otherwise; its log: ${relayLog}.`,
      '',
      table(
        [
          't (s)',
          'phase',
          'relay RSS (MB)',
          'heap used (MB)',
          'retained WAL',
          'confirmed lag',
          'server WAL written since the previous sample',
          'held rows (keys in the table; in the relay)',
          'rows',
          'records on the partitions that stayed up',
          'written',
          'published',
        ],
        samples.map((s) => [
          f0(s.t),
          s.phase,
          f1(s.rssMb ?? NaN),
          f1(s.heapMb ?? NaN),
          kib(s.retainedBytes),
          kib(s.confirmedLagBytes),
          kib(s.walSinceBytes),
          `${s.held} (${s.heldKeys}; ${s.relayHeldKeys ?? 'n/a'})`,
          s.rows,
          s.live ?? 'n/a',
          s.written,
          s.published ?? 'n/a',
        ]),
      ),
      '',
      table(
        ['measure', 'value'],
        [
          [
            'relay RSS at the end of the warm-up',
            `${f1(warmEnd.rssMb ?? NaN)} MB (warm-up range ${f1(min(warmRss))}–${f1(max(warmRss))} MB, read every ${RSS_EVERY_MS / 1000} s)`,
          ],
          ['relay RSS during the outage', `**max ${f1(max(outageRss))} MB**, min ${f1(min(outageRss))} MB`],
          [
            'relay RSS trend during the outage, whole and second half (least squares)',
            `${f2(trend(outageReads))} MB/min, ${f2(trend(outageReads.filter((r) => r.at >= half)))} MB/min`,
          ],
          ['relay RSS at the end (every row out)', `${f1(endSample.rssMb ?? NaN)} MB`],
          [
            'relay heap used: warm-up end, outage max, end',
            `${f1(warmEnd.heapMb ?? NaN)}, ${f1(max(inOutage.map((s) => s.heapMb ?? NaN)))}, ${f1(endSample.heapMb ?? NaN)} MB`,
          ],
          [
            'slot retained WAL (current - restart_lsn): max during the outage, max overall',
            `**${kib(retainedOutageMax)}**, ${kib(retainedMax)}`,
          ],
          ['slot confirmed lag (current - confirmed_flush_lsn), max', kib(lagMax)],
          ['held rows: max (keys), at the restart', `**${heldMax}** (${heldKeysMax} keys), ${heldAtRestart}`],
          [
            'no row held again: after the broker registered again (after the restart call)',
            `**${drainedAt === undefined ? 'n/a' : f1((drainedAt - backAt) / 1000)} s** (${drainedAt === undefined ? 'n/a' : f1((drainedAt - restartAt) / 1000)} s)`,
          ],
          ['live partitions during the outage (from 15 s after the kill), published / committed', f2(liveKeptUp)],
          ['events written, read back, duplicates', `${written.length}, ${records.length}, ${duplicates}`],
        ],
      ),
      '',
      `Check (none lost, none invented, each key's first occurrences in commit order): **${pass ? 'PASS' : `FAIL: ${problems.join('; ')}`}**.`,
    ].join('\n');
  } finally {
    if (sampler) clearInterval(sampler);
    if (rssTimer) clearInterval(rssTimer);
    await writers?.stop().catch(() => undefined);
    if (relay) await stopChild(relay).catch(() => undefined);
    // The node this run killed runs again at the end (only that one: see the check at the start).
    if (victim !== undefined) {
      const down = victim;
      await restartClusterNode(down, say).catch((err: unknown) =>
        say(`restarting node ${down} failed: ${String(err)}`),
      );
    }
    if (keepTopic) say(`topic ${topic} kept for a look: delete it afterwards`);
    else await kadmin.deleteTopics({ topics: [topic] }).catch(() => undefined);
    await kadmin.disconnect().catch(() => undefined);
    await pool.end().catch(() => undefined);
    await monitor.end().catch(() => undefined);
    // The slot first: a database with a slot cannot be dropped.
    await admin
      .query('SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1', [slot])
      .catch((err: unknown) => say(`dropping slot ${slot} failed: ${String(err)}`));
    await admin
      .query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`)
      .catch((err: unknown) => say(`dropping ${dbName} failed: ${String(err)}`));
    await admin.end().catch(() => undefined);
  }
}
