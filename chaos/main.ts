/**
 * `npm run chaos -- [--profile tiny|short|long] [--faults N] [--seconds S] [--seed N] ...`
 *
 * Drives the orders example (HTTP with idempotency keys → outbox → relays → Kafka → dedup
 * consumer) under load while injecting faults, then retries what was never answered, checks the
 * invariants against the client ledger, PostgreSQL and Kafka, prints a report, and exits 0 (no
 * violation), 1 (a violation), 2 (the harness itself failed) or 3 (fewer faults injected than
 * `--faults` within the fault phase and its overrun). See docs/chaos.md.
 *
 * By default the run uses a database of its own on the PostgreSQL server (created and dropped)
 * and a Kafka broker of its own (a scratch broker on a free port, killed and restarted by the
 * faults), so that it never disturbs other work on the machine. With `--cluster`, the local 3-node
 * cluster instead, whose nodes the cluster faults kill (chaos/cluster.ts, docs/chaos.md).
 */
import fs from 'node:fs';
import path from 'node:path';
import net from 'node:net';
import { Command, Option } from 'commander';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { ensureDemoSchema } from '../examples/orders/db.js';
import { createRunDatabase, dropRelaySlot, slotReader, waitUntil, type Child } from '../examples/orders/processes.js';
import {
  ensureKafkaCluster,
  ensurePostgres,
  ensureWalPostgres,
  startScratchBroker,
  type ScratchBroker,
} from '../scripts/services.js';
import { migrate } from '../src/migrate.js';
import { checkRun } from './check.js';
import { createClusterTopics, localCluster, outboxIds, writeAuditEvents, type ClusterTopics } from './cluster.js';
import {
  committedOffsets,
  drainProgress,
  pipelineBacklog,
  readDatabase,
  recordCommittedEvents,
  readTopic,
  toDeadLetters,
  toEventIds,
  toPublished,
} from './collect.js';
import { runFaultPhase } from './fault-phase.js';
import {
  FAULT_KINDS,
  canInject,
  crashPointsOf,
  injectFault,
  planFaults,
  runKinds,
  type FaultContext,
  type FaultKind,
  type FaultOutcome,
} from './faults.js';
import { Ledger } from './ledger.js';
import { retryUnanswered, runLoad } from './load.js';
import {
  OVERRUN_FRACTION,
  positiveInt,
  profileName,
  resolveChaosOptions,
  kindList,
  recordProgressMode,
  recordsProgress,
  sabotageList,
  seedValue,
  sourceName,
  type ChaosOptions,
  type ProfileName,
} from './options.js';
import { seededRandom } from './random.js';
import { formatReport, type RunFacts } from './report.js';
import { findFaketimeLibrary, Supervisor } from './supervisor.js';
import { ensureTopics } from '../src/kafka/topics.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A free TCP port on 127.0.0.1 whose successor is free too (a scratch broker's controller). */
async function freePortPair(): Promise<number> {
  const tryListen = (port: number) =>
    new Promise<number | undefined>((resolve) => {
      const server = net.createServer();
      server.once('error', () => resolve(undefined));
      server.listen(port, '127.0.0.1', () => {
        const p = (server.address() as net.AddressInfo).port;
        server.close(() => resolve(p));
      });
    });
  for (;;) {
    const port = await tryListen(0);
    if (port !== undefined && port < 65_535 && (await tryListen(port + 1)) !== undefined) return port;
  }
}

function parseOptions(argv: string[]): ChaosOptions {
  const flags = new Command('chaos')
    .description('Run the orders pipeline under load and injected faults; check its invariants (docs/chaos.md).')
    .addOption(new Option('--profile <name>', 'tiny, short (CI) or long').argParser(profileName).default('short'))
    .addOption(
      new Option(
        '--source <source>',
        "the outbox's source: table (the table relay) or wal (the WAL relay, on the PostgreSQL at wal_level=logical)",
      )
        .argParser(sourceName)
        .default('table'),
    )
    .option(
      '--faults <n>',
      `faults that must be injected; skipped ones are replaced for up to ${OVERRUN_FRACTION * 100} % of --seconds more, else exit 3 (profile default)`,
      positiveInt,
    )
    .option('--seconds <s>', 'length of the load and fault phase, in s (profile default)', positiveInt)
    .option('--seed <n>', 'seed of the fault schedule and the load mix (default: random, printed)', seedValue)
    .option('--relays <n>', 'relay instances: 2 or 3 (profile default)', positiveInt)
    .option('--consumers <n>', 'consumer group members at the start; one more may join (profile default)', positiveInt)
    .option('--rate <n>', 'new logical requests per second (profile default)', positiveInt)
    .addOption(
      new Option(
        '--database-url <url>',
        'PostgreSQL server; a database outboxkit_chaos_<pid> is created on it (--source wal: default WAL_DATABASE_URL, else 127.0.0.1:5433)',
      ).env('CHAOS_DATABASE_URL'),
    )
    .addOption(
      new Option('--brokers <list>', "Kafka brokers to use instead of the harness's own (no broker kill then)").env(
        'CHAOS_BROKERS',
      ),
    )
    .option(
      '--cluster',
      'run on the local 3-node cluster (started if needed): topics at replication factor 3 plus one at 1, and faults that kill its nodes',
    )
    .option('--drain-timeout-ms <ms>', 'how long the pipeline may take to drain after the faults', positiveInt)
    .option(
      '--drain-stall-ms <ms>',
      'stop waiting for the drain when nothing moved for this long with every event marked published',
      positiveInt,
    )
    .option('--keep', 'keep the database and the topics after the run')
    .option('--verbose', 'print each fault as it is injected')
    .option('--log-dir <dir>', "where each service's output is kept (default: .chaos-logs/run-<pid>)")
    .addOption(
      new Option(
        '--record-progress <mode>',
        'consumer members with recordProgress (partition progress in PostgreSQL): mixed (odd members), all, none (default: mixed; none with --sabotage no-dedup)',
      )
        // No commander default: resolveChaosOptions() chooses it, 'none' under the no-dedup sabotage.
        .argParser(recordProgressMode),
    )
    .option(
      '--kinds <list>',
      `fault kinds to schedule, comma-separated (default: all: ${Object.keys(FAULT_KINDS).join(', ')})`,
      kindList,
    )
    // Test-only (a self-test of the harness, docs/chaos.md): hidden from --help on purpose.
    .addOption(
      new Option('--sabotage <kinds>', 'TEST-ONLY: break a guarantee on purpose').argParser(sabotageList).hideHelp(),
    )
    .parse(argv)
    .opts<Omit<Partial<ChaosOptions>, 'brokers'> & { profile: ProfileName; brokers?: string }>();
  return resolveChaosOptions({
    ...flags,
    brokers: flags.brokers
      ?.split(',')
      .map((b) => b.trim())
      .filter(Boolean),
  });
}

async function main(): Promise<number> {
  const o = parseOptions(process.argv);
  const startedAt = Date.now();
  const log = (m: string) => console.log(`[chaos +${((Date.now() - startedAt) / 1000).toFixed(0)} s] ${m}`);
  const faketime = findFaketimeLibrary();
  const wal = o.source === 'wal';
  log(
    `profile ${o.profile}, source ${o.source}: ${o.faults} faults in ${o.seconds} s, ${o.rate} requests/s, ${o.relays} relays, ${o.consumers} consumers (recordProgress: ${o.recordProgress}), seed ${o.seed}`,
  );
  if (!faketime) log('faketime is NOT installed: clock-skew faults will be skipped (apt-get install faketime)');
  if (o.sabotage.length > 0)
    log(`SABOTAGED RUN (test-only): ${o.sabotage.join(', ')}; the harness must report violations and FAIL`);

  // Every kind this run can inject: the broker is killed only when it is the harness's own, the
  // cluster's nodes only with --cluster.
  const kinds = runKinds(o);
  if (kinds.length === 0)
    throw new Error(
      '--kinds leaves no fault kind this run can inject (kill-broker needs the harness own broker, the cluster kinds --cluster)',
    );
  // WAL mode needs a server at wal_level=logical: the local one on 5433 (or WAL_DATABASE_URL).
  const serverUrl = o.databaseUrl ?? (wal ? await ensureWalPostgres(log) : await ensurePostgres(log));
  let scratch: ScratchBroker | undefined;
  const cleanups: (() => Promise<unknown>)[] = [];
  const supervisorHolder: { sup?: Supervisor } = {};
  try {
    let clusterBrokers: string[] | undefined;
    if (o.cluster) {
      log('using the local 3-node Kafka cluster (OUTBOXKIT_KAFKA_NODES=3; started if it is not running)');
      clusterBrokers = (await ensureKafkaCluster(log)).brokers;
    } else if (!o.brokers) {
      const port = await freePortPair();
      log(`starting a scratch Kafka broker of its own on 127.0.0.1:${port}`);
      scratch = await startScratchBroker(port, log);
      const s = scratch;
      cleanups.push(() => s.destroy());
    }
    const brokers = clusterBrokers ?? o.brokers ?? scratch!.brokers;
    const database = await createRunDatabase(serverUrl, `outboxkit_chaos_${process.pid}`);
    if (!o.keep) cleanups.push(() => database.drop());
    // WAL mode: the publication of the outbox's inserts too (the relays create their slot).
    await migrate({ connectionString: database.url, walPublication: wal });
    const pool = new pg.Pool({ connectionString: database.url, max: 4, application_name: 'chaos-harness' });
    pool.on('error', () => undefined);
    cleanups.push(() => pool.end());
    await ensureDemoSchema(pool);
    // WAL mode: a slot of the run's own (slot names are unique in the whole cluster), shared by
    // its relays, dropped at the end once they stopped (a slot keeps WAL, and the database from
    // being dropped); and a record of the committed events, whose rows the WAL relay deletes.
    const walSlot = wal ? `outboxkit_chaos_${process.pid}` : undefined;
    if (walSlot !== undefined) {
      await recordCommittedEvents(pool);
      if (o.keep)
        cleanups.push(async () =>
          log(
            `kept the slot ${walSlot} too: drop it with outboxkit wal drop-slot --wal-slot ${walSlot} --database-url ${database.url}`,
          ),
        );
      else cleanups.push(() => dropRelaySlot(pool, walSlot));
    }

    const topic = `chaos.orders.${process.pid}`;
    const dlq = `${topic}.dlq`;
    const kafka = new Kafka({ clientId: 'outboxkit-chaos', brokers, logLevel: logLevel.NOTHING });
    let clusterTopics: ClusterTopics | undefined;
    if (o.cluster) {
      clusterTopics = await createClusterTopics(
        kafka,
        { topic, dlq, audit: `chaos.audit.${process.pid}` },
        seededRandom(o.seed + 5),
      );
    } else {
      await ensureTopics(kafka, [
        { topic, numPartitions: 6, replicationFactor: 1 },
        { topic: dlq, numPartitions: 1, replicationFactor: 1 },
      ]);
    }
    const ownTopics = [topic, dlq, ...(clusterTopics ? [clusterTopics.audit] : [])];
    if (!o.keep && (o.brokers || o.cluster))
      cleanups.push(async () => {
        const a = kafka.admin();
        await a.connect();
        await a.deleteTopics({ topics: ownTopics }).catch(() => undefined);
        await a.disconnect();
      });
    log(
      `database ${database.name}${walSlot ? ` (WAL relays on slot ${walSlot})` : ''}, topic ${topic}, brokers ${brokers.join(',')}` +
        (clusterTopics
          ? `; topics at replication factor 3, audit topic ${clusterTopics.audit} at 1 on node ${clusterTopics.auditNode}`
          : ''),
    );

    // Reports of the supervisor, kept for the report.
    const crashPoints = new Map<string, { armed: number; fired: number }>();
    const unexpectedExits: string[] = [];
    const port = await freePortPair();
    const random = seededRandom(o.seed);
    const shippingGroup = `chaos-shipping-${process.pid}`;
    const logDir = path.resolve(o.logDir ?? path.join('.chaos-logs', `run-${process.pid}`));
    log(`each service's output: ${logDir}/<service>.log`);
    const sup = new Supervisor({
      logDir,
      env: {
        DATABASE_URL: database.url,
        KAFKA_BROKERS: brokers.join(','),
        ORDERS_TOPIC: topic,
        SHIPPING_GROUP: shippingGroup,
        // Short sessions: a killed member's partitions move within seconds.
        SHIPPING_SESSION_TIMEOUT_MS: '6000',
        SHIPPING_HEARTBEAT_INTERVAL_MS: '1000',
        OUTBOXKIT_LOG_LEVEL: 'warn',
        OUTBOXKIT_METRICS_PORT: '-1',
        PORT: String(port),
        // Test-only (examples/orders/server.ts, shipping.ts): empty in a real run.
        CHAOS_SABOTAGE: o.sabotage.join(','),
        ORDERS_OUTBOX_SOURCE: o.source,
        // The WAL cluster allows 60 connections, for this run's processes and whatever else uses it.
        ...(walSlot ? { OUTBOXKIT_WAL_SLOT: walSlot, ORDERS_POOL_SIZE: '8' } : {}),
      },
      // Short leases: a dead relay's lanes are taken over within seconds (with a broker timeout
      // below the lease, as the relay requires: three quarters of it). Published rows are kept
      // for the check (the default retention could delete them during a long run).
      // Log level info: the relay's "relay started" line tells the supervisor it is ready.
      // Consumer members with partition progress in PostgreSQL (--record-progress).
      envOf: (s): Record<string, string> =>
        s.role === 'consumer' && recordsProgress(o.recordProgress, Number(s.name.split('-')[1]))
          ? { SHIPPING_RECORD_PROGRESS: '1' }
          : {},
      // WAL mode: the slot's reader lease as short (a standby takes over from a killed reader
      // within seconds), the same broker timeout below it; no polling, nothing retained (published
      // rows are deleted: the check reads the trigger's copies).
      relayArgs: wal
        ? ['relay', '--source', 'wal', '--wal-lease-ms', '3000', '--broker-timeout-ms', '2250', '--log-level', 'info']
        : [
            'relay',
            '--lease-ms',
            '3000',
            '--broker-timeout-ms',
            '2250',
            '--poll-interval-ms',
            '250',
            '--published-retention-ms',
            '604800000',
            '--log-level',
            'info',
          ],
      random: seededRandom(o.seed + 3),
      faketimeLibrary: faketime,
      events: {
        crashPointFired: (s, arming) => {
          crashPoints.get(arming.point)!.fired++;
          if (o.verbose) log(`${s.name} crashed at ${arming.point}`);
        },
        unexpectedExit: (s, code, signal, tail) => {
          // The line naming the error, not the last line of a multi-line error object (a lone `}`).
          // Stack frames (`at ...`) name functions such as emitErrorCloseNT, not the error.
          const lines = tail.map((l) => l.trim()).filter((l) => l.length > 2 && !l.startsWith('at '));
          const cause = [...lines].reverse().find((l) => /error|exception|fatal/i.test(l)) ?? lines.at(-1) ?? '';
          unexpectedExits.push(`${s.name} exited (${signal ?? code}): ${cause}`.slice(0, 300));
          if (o.verbose) log(`${s.name} exited (${signal ?? code}):\n${tail.join('\n')}`);
        },
        log,
      },
    });
    supervisorHolder.sup = sup;
    sup.add('orders', 'orders');
    for (let i = 1; i <= o.relays; i++) sup.add(`relay-${i}`, 'relay');
    // One more member than at the start, idle, for the joins.
    for (let i = 1; i <= o.consumers + 1; i++) sup.add(`consumer-${i}`, 'consumer', i <= o.consumers);
    for (const s of sup.services.values()) if (s.wanted) sup.start(s);

    const baseUrl = `http://127.0.0.1:${port}`;
    // The supervisor restarts what dies: nothing to watch for here.
    const upChildren = (): Child[] => [];
    const ordersUp = async () => (await fetch(`${baseUrl}/healthz`, { signal: AbortSignal.timeout(2_000) })).ok;
    const consumersReady = async () =>
      sup.byRole('consumer').every((s) => !s.wanted || s.child?.lines.some((l) => l.includes('SHIPPING_READY')));
    await waitUntil('the orders service', ordersUp, 90_000, upChildren);
    await waitUntil('the consumers', consumersReady, 90_000, upChildren);
    // WAL mode: a relay reads the slot (it created it) before the first order is written.
    if (walSlot !== undefined)
      await waitUntil(
        'a WAL relay reading the slot',
        async () => (await slotReader(pool, walSlot)) !== null,
        90_000,
        upChildren,
      );
    log(`pipeline up; load and faults for ${o.seconds} s`);

    // The faults: planned up front from the seed, injected on time; skipped ones replaced (the floor).
    const crashPointList = crashPointsOf(o.source);
    for (const cp of crashPointList) crashPoints.set(cp.point, { armed: 0, fired: 0 });
    const plan = planFaults(random, o.faults, o.seconds, kinds, crashPointList);
    const injected = new Map<FaultKind, number>();
    const skipped = new Map<FaultKind, string[]>();
    const clusterFaultLines: string[] = [];
    const ctx: FaultContext = {
      supervisor: sup,
      random: seededRandom(o.seed + 1),
      pool,
      broker: scratch,
      cluster: clusterTopics
        ? localCluster({ topics: clusterTopics, ordersTopic: topic, pool, log, lines: clusterFaultLines })
        : undefined,
      maxConsumers: o.consumers + 1,
      brokerDown: false,
      brokerBack: Promise.resolve(),
      crashPoints,
      // A sabotaged run arms first the crash points that make its broken guarantee show (the
      // consumer's twice: one redelivery may land where the check cannot see it).
      firstCrashPoints: o.sabotage.includes('no-dedup')
        ? ['consumer:after-commit', wal ? 'wal-relay:after-send' : 'relay:after-send', 'consumer:after-commit']
        : [],
      crashPointList,
      ...(walSlot ? { walSlot } : {}),
      log,
    };
    const loadStart = Date.now();
    const inject = async (kind: FaultKind): Promise<boolean> => {
      // A target that is down now (restarting, the broker recovering) is tried again twice.
      let outcome: FaultOutcome = { injected: false, detail: '' };
      for (let attempt = 1; attempt <= 3; attempt++) {
        outcome = await injectFault(kind, ctx).catch((err: Error) => ({
          injected: false,
          detail: `failed: ${err.message}`,
        }));
        if (outcome.injected || outcome.final) break;
        await sleep(1_500);
      }
      if (outcome.injected) {
        injected.set(kind, (injected.get(kind) ?? 0) + 1);
        if (outcome.armed) crashPoints.get(outcome.armed)!.armed++;
      } else {
        skipped.set(kind, [...(skipped.get(kind) ?? []), outcome.detail]);
      }
      if (o.verbose) log(`t+${((Date.now() - loadStart) / 1000).toFixed(1)} s ${kind}: ${outcome.detail}`);
      return outcome.injected;
    };
    // The planned window is [5 %, 90 %] of --seconds; replacements may start up to the overrun.
    const capMs = (0.9 + OVERRUN_FRACTION) * o.seconds * 1_000;
    const endLoad = new AbortController();
    const faults = runFaultPhase({
      plan,
      floor: o.faults,
      capMs,
      spacingMs: (0.85 * o.seconds * 1_000) / o.faults,
      random: seededRandom(o.seed + 4),
      kinds,
      feasible: (kind) => canInject(kind, ctx),
      inject,
    }).then(async (phase) => {
      log(
        `fault phase over at t+${(phase.endedAtMs / 1000).toFixed(0)} s: ${phase.injected} injected (floor ${o.faults}), ${phase.replacements} replacement(s)`,
      );
      // The load goes on for --seconds at least, and 10 % of --seconds after the last fault.
      const loadEnd = Math.max(o.seconds * 1_000, phase.endedAtMs + 0.1 * o.seconds * 1_000);
      await sleep(loadStart + loadEnd - Date.now());
      endLoad.abort();
      return { phase, loadSeconds: (Date.now() - loadStart) / 1000 };
    });
    // Never an endless load, even if the fault phase itself failed (then reported as exit 2).
    faults.catch(() => endLoad.abort());
    const ledger = new Ledger();
    // --cluster: a second stream, to the replication-factor-1 topic, through the same relays.
    const auditWriter = clusterTopics ? writeAuditEvents(pool, clusterTopics.audit, endLoad.signal) : undefined;
    const load = await runLoad({
      baseUrl,
      ledger,
      random: seededRandom(o.seed + 2),
      rate: o.rate,
      signal: endLoad.signal,
      customers: 40,
      maxInFlight: 256,
    });
    const { phase, loadSeconds } = await faults;
    const auditWritten = await auditWriter;
    log('faults over; waiting for the broker and every service, then retrying unanswered requests');
    await ctx.brokerBack;
    sup.disarm();
    for (const s of sup.services.values()) if (s.wanted && !sup.isUp(s)) sup.start(s);
    await waitUntil('the orders service', ordersUp, 120_000, upChildren);
    const retriedAtEnd = await retryUnanswered(baseUrl, ledger, 180_000);

    log('draining: every event published, every order shipped or dead-lettered');
    // Drained: every event published, every order shipped or dead-lettered, and the shipping group
    // committed an offset at the end of every partition (so a redelivery after a consumer crash,
    // the one that shows a broken dedup, has been handled before the check, however late the
    // rebalance that brings it). Or stalled: every event marked published, the group's lag 0, every
    // service ready and nothing moved for drainStallMs (an event marked published that never
    // reached Kafka is never shipped).
    let last = '';
    let lastChange = Date.now();
    let lastReport = Date.now();
    await waitUntil(
      'the pipeline to drain',
      async () => {
        const kafkaSide = await drainProgress(kafka, { topic, deadLetterTopic: dlq, groupId: shippingGroup });
        const b = await pipelineBacklog(pool, kafkaSide.deadLettered, o.source);
        if (b.pending === 0 && b.unshipped <= 0 && kafkaSide.lag === 0) return true;
        if (Date.now() - lastReport >= 15_000) {
          lastReport = Date.now();
          const down = [...sup.services.values()].filter((s) => s.wanted && !(sup.isUp(s) && s.readyAt !== undefined));
          log(
            `draining: ${b.pending} unpublished, ${b.unshipped} unshipped, ${kafkaSide.lag} messages not committed by ${shippingGroup}${down.length ? `; not ready: ${down.map((s) => s.name).join(', ')}` : ''}`,
          );
        }
        // A stall counts only while every wanted service is up and ready (a restart or a
        // rebalance after a crash point that fired late is not a stall).
        const ready = [...sup.services.values()].every((s) => !s.wanted || (sup.isUp(s) && s.readyAt !== undefined));
        const now = `${b.pending}/${b.unshipped}/${kafkaSide.lag}`;
        if (now !== last || !ready) [last, lastChange] = [now, Date.now()];
        if (b.pending === 0 && kafkaSide.lag === 0 && Date.now() - lastChange >= o.drainStallMs) {
          log(
            `no progress for ${o.drainStallMs / 1000} s with every event marked published and consumed: checking now`,
          );
          return true;
        }
        return false;
      },
      o.drainTimeoutMs,
      upChildren,
    ).catch((err: Error) => log(`${err.message}: checking anyway`));
    // Late redeliveries (a rebalance in flight) would show now as second applications.
    await sleep(3_000);
    await sup.close();

    const db = await readDatabase(pool, topic, o.source);
    const published = toPublished(await readTopic(kafka, topic));
    const deadLetters = toDeadLetters(await readTopic(kafka, dlq));
    const offsets = await committedOffsets(kafka, shippingGroup, topic);
    const otherTopics = clusterTopics
      ? [
          {
            topic: clusterTopics.audit,
            committed: await outboxIds(pool, clusterTopics.audit),
            published: toEventIds(await readTopic(kafka, clusterTopics.audit)),
          },
        ]
      : undefined;
    if (otherTopics)
      log(
        `audit topic: ${auditWritten ?? 0} writes tried, ${otherTopics[0]!.committed.length} committed, ${otherTopics[0]!.published.length} messages`,
      );
    const result = checkRun(ledger.all(), {
      ...db,
      published,
      deadLetters,
      ...(offsets ? { committedOffsets: offsets } : {}),
      ...(otherTopics ? { otherTopics } : {}),
    });
    const facts: RunFacts = {
      options: o,
      injected,
      skipped,
      crashPoints,
      unexpectedExits,
      load,
      attempts: ledger.all().reduce((n, op) => n + op.attempts.length + (op.reuse?.attempts.length ?? 0), 0),
      retriedAtEnd,
      messages: published.length,
      faketime,
      elapsedMs: Date.now() - startedAt,
      phase,
      loadSeconds,
      kinds,
      clusterFaults: clusterFaultLines,
    };
    // Before the report: its last line is the verdict.
    if (result.violations > 0 || unexpectedExits.length > 0) log(`each service's output is kept in ${logDir}`);
    for (const line of formatReport(facts, result)) console.log(line);
    // A clean run's logs are not worth keeping unless asked for (--log-dir).
    if (result.violations === 0 && unexpectedExits.length === 0 && o.logDir === undefined)
      fs.rmSync(logDir, { recursive: true, force: true });
    if (result.violations > 0) return 1;
    return phase.floorReached ? 0 : 3;
  } finally {
    await supervisorHolder.sup?.close();
    for (const c of cleanups.reverse()) await c().catch((err: Error) => log(`cleanup: ${err.message}`));
  }
}

main().then(
  (code) => {
    process.exitCode = code;
    // kafkajs and pg may keep sockets for a moment; the verdict is printed, do not wait for them.
    setTimeout(() => process.exit(code), 1_000).unref();
  },
  (err: unknown) => {
    console.error(err);
    const message = err instanceof Error ? err.message : String(err);
    console.log(
      `CHAOS FAIL: the harness itself failed (see the error above): ${message.split('\n')[0]!.slice(0, 300)}`,
    );
    process.exit(2);
  },
);
