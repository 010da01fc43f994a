/**
 * The fault kinds of the chaos harness, the seeded schedule, and the injection of one fault.
 */
import type pg from 'pg';
import type { OutboxSource } from '../src/outbox/enqueue.js';
import { backendsOfProcess } from './backends.js';
import type { Random } from './random.js';
import type { Role, Service, Supervisor } from './supervisor.js';

/** Every scheduled fault kind, with what it does (printed by the report and docs/chaos.md). */
export const FAULT_KINDS = {
  'kill-orders': 'SIGKILL of the orders service at a random moment; restarted',
  'kill-relay': 'SIGKILL of one relay instance at a random moment; restarted',
  'kill-consumer': 'SIGKILL of one consumer group member (its partitions move after the session timeout); restarted',
  'crash-point': 'a named crash point armed (restart with OUTBOXKIT_CRASH_POINT); the process kills itself there',
  'consumer-join': 'a consumer group member joins (rebalance)',
  'consumer-leave': 'a consumer group member leaves gracefully (rebalance)',
  'kill-broker': 'kill -9 of the Kafka broker, restarted 1-5 s later',
  'pg-terminate-relay': "pg_terminate_backend on one relay's pooled connections",
  'pg-terminate-consumer': "pg_terminate_backend on one consumer's connections",
  'pg-terminate-listener': "pg_terminate_backend on one relay's LISTEN connection (table mode)",
  'pg-terminate-walsender':
    "pg_terminate_backend of the walsender reading the WAL relays' slot (pg_replication_slots.active_pid; WAL mode)",
  'clock-skew': 'one relay or consumer restarted under faketime with a skewed clock (or back to the true clock)',
  'kill-leader':
    'kill -9 of the cluster node that leads most partitions of the orders topic, restarted 7-12 s later (--cluster)',
  'kill-controller': 'kill -9 of the active KRaft controller, restarted 7-12 s later (--cluster)',
  'kill-two-brokers':
    'kill -9 of two of the three cluster nodes at once (no acks=all write, no metadata quorum), restarted 7-12 s later (--cluster)',
  'kill-rf1-broker':
    'kill -9 of the cluster node that holds the replication-factor-1 audit topic, restarted 7-12 s later (--cluster)',
} as const;

export type FaultKind = keyof typeof FAULT_KINDS;

/** The kinds that kill nodes of the local 3-node cluster: only with `--cluster`. */
export const CLUSTER_FAULT_KINDS: ReadonlySet<FaultKind> = new Set<FaultKind>([
  'kill-leader',
  'kill-controller',
  'kill-two-brokers',
  'kill-rf1-broker',
]);

/**
 * The kinds a run schedules: without `--cluster` every kind but the cluster's (`kill-broker` only
 * with the harness's own broker, i.e. without `--brokers`); with it, the cluster's instead of
 * `kill-broker`. `pg-terminate-listener` in table mode only (a WAL relay has no LISTEN
 * connection), `pg-terminate-walsender` in WAL mode only. `only` (`--kinds`) narrows the list.
 */
export function runKinds(o: {
  cluster: boolean;
  brokers: unknown;
  kinds: readonly FaultKind[] | undefined;
  source?: OutboxSource;
}): FaultKind[] {
  const wal = o.source === 'wal';
  return (Object.keys(FAULT_KINDS) as FaultKind[]).filter((k) => {
    if (o.kinds !== undefined && !o.kinds.includes(k)) return false;
    if (CLUSTER_FAULT_KINDS.has(k)) return o.cluster;
    if (k === 'kill-broker') return !o.cluster && !o.brokers;
    if (k === 'pg-terminate-listener') return !wal;
    if (k === 'pg-terminate-walsender') return wal;
    return true;
  });
}

/** A crash point (src/crash-point.ts), the role whose process reaches it, and its arrivals to crash at. */
export interface CrashPoint {
  point: string;
  role: Role;
  after: [number, number];
}

/** The crash points of table mode: the orders service's, the table relay's, the consumer's. */
export const CRASH_POINTS: readonly CrashPoint[] = [
  { point: 'idempotency:after-claim', role: 'orders', after: [1, 10] },
  { point: 'idempotency:before-commit', role: 'orders', after: [1, 10] },
  { point: 'idempotency:after-commit', role: 'orders', after: [1, 10] },
  { point: 'relay:before-send', role: 'relay', after: [1, 4] },
  { point: 'relay:after-send', role: 'relay', after: [1, 4] },
  { point: 'consumer:after-commit', role: 'consumer', after: [1, 10] },
];

/**
 * The crash points of WAL mode: the table relay's replaced by the WAL relay's that a running
 * relay reaches (relay/wal/wal-relay.ts): before a send, after Kafka's acknowledgement (rows not
 * deleted, slot not confirmed), after the delete (slot not confirmed). Its fourth,
 * `wal-relay:slot-created`, is reached only where a relay creates the slot (the run's first
 * start, or after a slot loss), never by a process restarted armed: left out.
 */
export const WAL_CRASH_POINTS: readonly CrashPoint[] = [
  ...CRASH_POINTS.filter((cp) => cp.role !== 'relay'),
  { point: 'wal-relay:before-send', role: 'relay', after: [1, 4] },
  { point: 'wal-relay:after-send', role: 'relay', after: [1, 4] },
  { point: 'wal-relay:after-delete', role: 'relay', after: [1, 4] },
];

/** The crash points the processes of a run in mode `source` reach. */
export function crashPointsOf(source: OutboxSource): readonly CrashPoint[] {
  return source === 'wal' ? WAL_CRASH_POINTS : CRASH_POINTS;
}

/** Relative frequency of each kind after the first of each. */
const WEIGHTS: Record<FaultKind, number> = {
  'kill-orders': 3,
  'kill-relay': 3,
  'kill-consumer': 3,
  'crash-point': 6,
  'consumer-join': 2,
  'consumer-leave': 2,
  'kill-broker': 1,
  'pg-terminate-relay': 2,
  'pg-terminate-consumer': 2,
  'pg-terminate-listener': 2,
  'pg-terminate-walsender': 2,
  'clock-skew': 1.5,
  // A cluster fault holds the cluster for 30-90 s on a loaded machine (kill, 7-12 s down, restart,
  // ISR caught up), and they go one at a time: one of each kind per run (the plan's first of each
  // kind), never drawn beyond that.
  'kill-leader': 0,
  'kill-controller': 0,
  'kill-two-brokers': 0,
  'kill-rf1-broker': 0,
};

/** Clock offsets for `clock-skew` (faketime syntax). */
const SKEWS = ['+30s', '-30s', '+90s', '-90s', '+10m', '-10m'];

/** One planned fault. */
export interface PlannedFault {
  /** When, in ms from the start of the load. */
  atMs: number;
  kind: FaultKind;
}

/** Draws one fault kind by {@link WEIGHTS} (the replacements of skipped faults, the plan's rest). */
export function drawKind(random: Random, kinds: readonly FaultKind[]): FaultKind {
  const total = kinds.reduce((n, k) => n + WEIGHTS[k], 0);
  if (total === 0) return random.pick(kinds); // only kinds never drawn by weight (the cluster's)
  let x = random.next() * total;
  return kinds.find((k) => (x -= WEIGHTS[k]) < 0) ?? kinds[kinds.length - 1]!;
}

/**
 * Plans `count` faults over `[5%, 90%]` of `seconds`: one of each kind first (when `count`
 * allows; the cluster's kinds before the others, as they are never drawn by weight), then more `crash-point` faults up to one per crash point (so that each point is armed
 * at least once), the rest drawn by weight; shuffled. The window is cut into `count` equal slots
 * with one fault at a random moment of each, so that faults never bunch up and the pipeline makes
 * progress between them. The same seed gives the same schedule.
 */
export function planFaults(
  random: Random,
  count: number,
  seconds: number,
  kinds: readonly FaultKind[],
  points: readonly CrashPoint[] = CRASH_POINTS,
): PlannedFault[] {
  // The cluster's kinds first: never drawn by weight, they come only from here.
  const firsts: FaultKind[] = [
    ...kinds.filter((k) => CLUSTER_FAULT_KINDS.has(k)),
    ...kinds.filter((k) => !CLUSTER_FAULT_KINDS.has(k)),
  ];
  if (kinds.includes('crash-point')) for (let i = 1; i < points.length; i++) firsts.push('crash-point');
  const drawn: FaultKind[] = firsts.slice(0, count);
  while (drawn.length < count) drawn.push(drawKind(random, kinds));
  for (let i = drawn.length - 1; i > 0; i--) {
    const j = random.int(0, i);
    [drawn[i], drawn[j]] = [drawn[j]!, drawn[i]!];
  }
  const from = seconds * 50;
  const slot = (seconds * 900 - from) / Math.max(count, 1);
  return drawn.map((kind, i) => ({ atMs: Math.floor(from + (i + random.next()) * slot), kind }));
}

/** How often each crash point was armed and fired (the report's table). */
export type CrashPointStats = ReadonlyMap<string, { armed: number; fired: number }>;

/**
 * Chooses the crash point to arm: among the points whose role has a target now (`available`) and
 * that no process has armed already, first the `first` points, in their order (a sabotaged run's
 * witnesses; a point listed n times is a witness until armed n times), then the points never
 * armed, then those armed that never fired, then any. Random within the first of these groups that is not empty; undefined when no point
 * can be armed.
 */
export function chooseCrashPoint(
  random: Random,
  stats: CrashPointStats,
  available: (role: Role) => boolean,
  armedNow: ReadonlySet<string>,
  first: readonly string[] = [],
  points: readonly CrashPoint[] = CRASH_POINTS,
): CrashPoint | undefined {
  const open = points.filter((cp) => available(cp.role) && !armedNow.has(cp.point));
  const count = (cp: CrashPoint) => stats.get(cp.point) ?? { armed: 0, fired: 0 };
  // The nth listing of a point is a witness while the point has been armed fewer than n times.
  const listed = new Map<string, number>();
  const witness = first
    .map((point) => {
      const n = (listed.get(point) ?? 0) + 1;
      listed.set(point, n);
      return open.find((cp) => cp.point === point && count(cp).armed < n);
    })
    .find((cp) => cp !== undefined);
  const tiers = [
    witness ? [witness] : [],
    open.filter((cp) => count(cp).armed === 0),
    open.filter((cp) => count(cp).fired === 0),
    open,
  ];
  const tier = tiers.find((t) => t.length > 0);
  return tier === undefined ? undefined : random.pick(tier);
}

/** A Kafka broker the harness may kill (its own scratch broker). */
export interface KillableBroker {
  kill(signal?: NodeJS.Signals): Promise<void>;
  restart(): Promise<void>;
}

/**
 * The local 3-node cluster as the cluster faults see it (`--cluster`; chaos/main.ts builds it on
 * scripts/services.ts).
 */
export interface KillableCluster {
  /** Node ids, 1-3. */
  nodeIds: readonly number[];
  /** The node that leads most partitions of the orders topic (the lowest id on a tie); undefined when none is known. */
  busiestLeader(): Promise<number | undefined>;
  /** The active KRaft controller; undefined during an election. */
  controller(): number | undefined;
  /** The node that holds every partition of the replication-factor-1 audit topic. */
  rf1Node: number;
  /** SIGKILL of node `id`; resolves once its process has exited. */
  kill(id: number): Promise<void>;
  /**
   * Starts the nodes again (one after another) and resolves once each is registered and every
   * partition of the run's replication-factor-3 topics has all three replicas in sync again.
   */
  restart(ids: readonly number[]): Promise<void>;
  /** Told when nodes were killed for `kind` (chaos/main.ts measures what flowed meanwhile). */
  down?(kind: FaultKind, ids: readonly number[]): void;
  /** Told when they are back (registered, in sync). */
  back?(kind: FaultKind, ids: readonly number[]): Promise<void>;
}

/** What injecting a fault needs. */
export interface FaultContext {
  supervisor: Supervisor;
  random: Random;
  /** A pool on the run's database (for pg_terminate_backend). */
  pool: pg.Pool;
  broker: KillableBroker | undefined;
  /** The local 3-node cluster (`--cluster`), whose nodes the cluster faults kill. */
  cluster?: KillableCluster | undefined;
  /** Upper bound of live consumer members (joins stop there). */
  maxConsumers: number;
  /** Whether the broker, or a cluster node, is down (killed, not back yet): one Kafka fault at a time. */
  brokerDown: boolean;
  /** Resolves when what the last Kafka fault killed is back (the harness waits for it). */
  brokerBack: Promise<void>;
  /** Armed and fired counts per crash point (read to choose the next point; the harness counts). */
  crashPoints: CrashPointStats;
  /** Crash points to arm before any other (a sabotaged run's witnesses); default none. */
  firstCrashPoints?: readonly string[];
  /** The crash points this run's processes reach ({@link crashPointsOf}); default {@link CRASH_POINTS}. */
  crashPointList?: readonly CrashPoint[];
  /** WAL mode: the WAL relays' replication slot (`pg-terminate-walsender`, `pg-terminate-relay`). */
  walSlot?: string;
  log(message: string): void;
}

/** The outcome of one fault: injected (with a detail for the log) or skipped (with the reason). */
export interface FaultOutcome {
  injected: boolean;
  detail: string;
  /** The crash point armed by a `crash-point` fault. */
  armed?: string;
  /** Skipped for good (the target can never exist in this run): not worth a second try. */
  final?: boolean;
}

const skipped = (detail: string): FaultOutcome => ({ injected: false, detail });

/**
 * The processes of `role` a fault may target now: running, not being stopped by the harness, and
 * not shielded by an armed crash point. A process with a crash point armed is left alone (no
 * kill, restart or termination) until the point fires or the supervisor's arming timeout passes:
 * otherwise the points seldom fire.
 */
function targets(sup: Supervisor, role: Role): Service[] {
  return sup.byRole(role).filter((s) => sup.isUp(s) && !s.stopping && !sup.isProtected(s));
}

/**
 * Whether a fault of `kind` would find a target now (no side effect, no random draw): the
 * replacements of skipped faults are drawn among these kinds, so that a run with its processes
 * restarting does not replace one impossible fault by another.
 */
export function canInject(kind: FaultKind, c: FaultContext): boolean {
  const sup = c.supervisor;
  const ready = (role: Role) => targets(sup, role).some((s) => s.readyAt !== undefined);
  switch (kind) {
    case 'kill-orders':
      return targets(sup, 'orders').length > 0;
    case 'kill-relay':
      return targets(sup, 'relay').length > 0;
    case 'kill-consumer':
      return targets(sup, 'consumer').length > 0;
    case 'crash-point': {
      const armedNow = new Set([...sup.services.values()].flatMap((s) => (s.arming ? [s.arming.point] : [])));
      return (c.crashPointList ?? CRASH_POINTS).some(
        (cp) => !armedNow.has(cp.point) && targets(sup, cp.role).length > 0,
      );
    }
    case 'consumer-join':
      return targets(sup, 'consumer').length < c.maxConsumers && sup.byRole('consumer').some((s) => !s.wanted);
    case 'consumer-leave':
      return targets(sup, 'consumer').length > 1;
    case 'kill-broker':
      return c.broker !== undefined && !c.brokerDown;
    case 'kill-leader':
    case 'kill-controller':
    case 'kill-two-brokers':
    case 'kill-rf1-broker':
      return c.cluster !== undefined && !c.brokerDown;
    case 'pg-terminate-relay':
    case 'pg-terminate-listener':
    case 'pg-terminate-walsender':
      return ready('relay');
    case 'pg-terminate-consumer':
      return ready('consumer');
    case 'clock-skew':
      return sup.faketime && (targets(sup, 'relay').length > 0 || targets(sup, 'consumer').length > 0);
  }
}

/** Injects one fault of `kind` now. */
export async function injectFault(kind: FaultKind, c: FaultContext): Promise<FaultOutcome> {
  const { supervisor: sup, random } = c;
  const live = (role: Role) => targets(sup, role);
  const one = (role: Role): Service | undefined => {
    const up = live(role);
    return up.length === 0 ? undefined : random.pick(up);
  };
  switch (kind) {
    case 'kill-orders':
    case 'kill-relay':
    case 'kill-consumer': {
      const s = one(kind === 'kill-orders' ? 'orders' : kind === 'kill-relay' ? 'relay' : 'consumer');
      if (!s || !sup.kill(s)) return skipped('no live target');
      return { injected: true, detail: `SIGKILL ${s.name}` };
    }
    case 'crash-point': {
      const armedNow = new Set([...sup.services.values()].flatMap((s) => (s.arming ? [s.arming.point] : [])));
      const cp = chooseCrashPoint(
        random,
        c.crashPoints,
        (role) => live(role).length > 0,
        armedNow,
        c.firstCrashPoints,
        c.crashPointList,
      );
      if (!cp) return skipped('no live process without a crash point armed');
      const s = one(cp.role)!;
      const arming = { point: cp.point, after: random.int(cp.after[0], cp.after[1]) };
      await sup.restart(s, { arming });
      return { injected: true, detail: `${s.name} armed ${cp.point} at arrival ${arming.after}`, armed: cp.point };
    }
    case 'consumer-join': {
      const idle = sup.byRole('consumer').filter((s) => !s.wanted);
      if (live('consumer').length >= c.maxConsumers || idle.length === 0) return skipped('group at its largest');
      const s = idle[0]!;
      s.wanted = true;
      sup.start(s);
      return { injected: true, detail: `${s.name} joins` };
    }
    case 'consumer-leave': {
      const members = live('consumer');
      if (members.length <= 1) return skipped('one member left');
      const s = random.pick(members);
      await sup.restart(s, {}, true);
      return { injected: true, detail: `${s.name} leaves` };
    }
    case 'kill-broker': {
      if (!c.broker) return { ...skipped('the broker is not the harness own (--brokers)'), final: true };
      if (c.brokerDown) return skipped('the broker is already down');
      c.brokerDown = true;
      const broker = c.broker;
      await broker.kill('SIGKILL');
      const downMs = random.int(1_000, 5_000);
      c.brokerBack = (async () => {
        await new Promise((r) => setTimeout(r, downMs));
        // A restart can fail on a loaded machine (port still held, slow recovery): try again.
        for (let attempt = 1; ; attempt++) {
          try {
            await broker.restart();
            break;
          } catch (err) {
            if (attempt >= 5) throw err;
            c.log(`broker restart failed (${(err as Error).message}); retrying`);
            await new Promise((r) => setTimeout(r, 2_000));
          }
        }
        c.brokerDown = false;
      })();
      return { injected: true, detail: `kill -9 broker, restart in ${downMs} ms` };
    }
    case 'kill-leader':
    case 'kill-controller':
    case 'kill-two-brokers':
    case 'kill-rf1-broker':
      return killClusterNodes(kind, c);
    case 'pg-terminate-walsender': {
      if (c.walSlot === undefined) return { ...skipped('WAL mode only (--source wal)'), final: true };
      // The walsender of the reader's replication connection: the reader loses its stream, checks
      // its lease and its slot again and reads on from the slot's confirmed position.
      const r = await c.pool.query<{ pid: number | null }>(
        'SELECT active_pid AS pid FROM pg_replication_slots WHERE slot_name = $1',
        [c.walSlot],
      );
      const pid = r.rows[0]?.pid;
      if (pid === null || pid === undefined) return skipped('no walsender reads the slot');
      await c.pool.query('SELECT pg_terminate_backend($1)', [pid]);
      return { injected: true, detail: `pg_terminate_backend of walsender ${pid} (slot ${c.walSlot})` };
    }
    case 'pg-terminate-relay':
    case 'pg-terminate-consumer':
    case 'pg-terminate-listener': {
      if (kind === 'pg-terminate-relay' && c.walSlot !== undefined) return terminateWalRelayBackends(c, live('relay'));
      let pattern: string;
      if (kind === 'pg-terminate-listener') {
        pattern = 'outboxkit-relay-listener';
      } else {
        // Among the processes that said they are ready: one just restarted has no backend yet.
        const ready = live(kind === 'pg-terminate-relay' ? 'relay' : 'consumer').filter((t) => t.readyAt !== undefined);
        const s = ready.length === 0 ? undefined : random.pick(ready);
        if (!s) return skipped('no live target');
        pattern = `chaos-${s.name}`;
      }
      // The listener's name is the relay's own (not the process's): pick one of them at random.
      const r = await c.pool.query<{ pid: number; application_name: string }>(
        `SELECT pid, application_name FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid()`,
        [pattern],
      );
      const targets = kind === 'pg-terminate-listener' && r.rows.length > 0 ? [random.pick(r.rows)] : r.rows;
      if (targets.length === 0) return skipped(`no backend named ${pattern}`);
      await c.pool.query('SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid', [targets.map((t) => t.pid)]);
      return { injected: true, detail: `pg_terminate_backend ${targets.length} backend(s) of ${pattern}` };
    }
    case 'clock-skew': {
      if (!sup.faketime) return { ...skipped('faketime is not installed (apt-get install faketime)'), final: true };
      const s = random.chance(0.7) ? one('relay') : one('consumer');
      if (!s) return skipped('no live target');
      const skew = s.skew === undefined ? random.pick(SKEWS) : undefined;
      await sup.restart(s, { skew });
      return { injected: true, detail: `${s.name} restarted ${skew ? `with clock ${skew}` : 'on the true clock'}` };
    }
  }
}

/**
 * `pg-terminate-relay` in WAL mode. A WAL relay names its connections itself
 * (`outboxkit-wal-relay-<random>`), not after `PGAPPNAME`: its backends are found by the
 * process's own sockets. Its walsender is left to `pg-terminate-walsender`.
 */
async function terminateWalRelayBackends(c: FaultContext, live: Service[]): Promise<FaultOutcome> {
  // Among the processes that said they are ready: one just restarted has no backend yet.
  const ready = live.filter((t) => t.readyAt !== undefined);
  const s = ready.length === 0 ? undefined : c.random.pick(ready);
  const pid = s?.child?.proc.pid;
  if (s === undefined || pid === undefined) return skipped('no live target');
  const pids = await backendsOfProcess(c.pool, pid);
  if (pids.length === 0) return skipped(`no backend of ${s.name}`);
  await c.pool.query('SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid', [pids]);
  return { injected: true, detail: `pg_terminate_backend ${pids.length} backend(s) of ${s.name}` };
}

/**
 * How long a cluster fault keeps its nodes down, in ms: longer than the cluster's
 * `broker.session.timeout.ms` (6 s, scripts/broker-config.ts), so that the controller fences them
 * and their partitions get new leaders (or, with replication factor 1, none) before they return.
 */
export const CLUSTER_DOWN_MS: readonly [number, number] = [7_000, 12_000];

/**
 * How long a cluster fault waits for the previous one to end (its nodes back in sync): the four
 * of a run go one after another, each 30-90 s on a loaded 2-core machine.
 */
export const CLUSTER_WAIT_MS = 300_000;

/**
 * A cluster fault: chooses its victims (the busiest leader, the active controller, two nodes at
 * random, or the audit topic's node), kills them at once, and in the background restarts them
 * 3-8 s later and waits until they are back in sync (`brokerBack`); `brokerDown` meanwhile, so
 * that the next Kafka fault waits for the cluster to be whole again.
 */
async function killClusterNodes(kind: FaultKind, c: FaultContext): Promise<FaultOutcome> {
  const cl = c.cluster;
  if (!cl) return { ...skipped('needs --cluster (the local 3-node cluster)'), final: true };
  // One cluster fault at a time, each on a whole cluster: this one waits for the last to end.
  const deadline = Date.now() + CLUSTER_WAIT_MS;
  while (c.brokerDown) {
    if (Date.now() > deadline)
      return { ...skipped(`the cluster was not whole again within ${CLUSTER_WAIT_MS / 1000} s`), final: true };
    // A plain sleep: `brokerBack` may still be the last fault's settled promise while the next
    // one is being claimed, and a race with it would spin without ever yielding to the event loop.
    await new Promise((r) => setTimeout(r, 500));
  }
  // Claimed before any await, so that two faults that waited do not both go.
  c.brokerDown = true;
  let victims: number[] | undefined;
  let what = '';
  switch (kind) {
    case 'kill-leader': {
      const id = await cl.busiestLeader().catch(() => undefined);
      if (id !== undefined) [victims, what] = [[id], `node ${id}, leader of most orders partitions`];
      break;
    }
    case 'kill-controller': {
      const id = cl.controller();
      if (id !== undefined) [victims, what] = [[id], `node ${id}, the active controller`];
      break;
    }
    case 'kill-two-brokers': {
      const spared = c.random.pick(cl.nodeIds);
      victims = cl.nodeIds.filter((id) => id !== spared);
      what = `nodes ${victims.join(' and ')}`;
      break;
    }
    default:
      [victims, what] = [[cl.rf1Node], `node ${cl.rf1Node}, the only broker of the audit topic`];
  }
  if (victims === undefined) {
    c.brokerDown = false;
    return skipped(kind === 'kill-leader' ? 'no leader known' : 'no active controller known (an election)');
  }
  const down = victims;
  const killed = await Promise.allSettled(down.map((id) => cl.kill(id)));
  const failed = killed.find((k): k is PromiseRejectedResult => k.status === 'rejected');
  cl.down?.(kind, down);
  const downMs = c.random.int(CLUSTER_DOWN_MS[0], CLUSTER_DOWN_MS[1]);
  c.brokerBack = (async () => {
    await new Promise((r) => setTimeout(r, downMs));
    // A restart can fail on a loaded machine (port still held, slow recovery): try again.
    for (let attempt = 1; ; attempt++) {
      try {
        await cl.restart(down);
        break;
      } catch (err) {
        if (attempt >= 5) throw err;
        c.log(`cluster restart of ${down.join(', ')} failed (${(err as Error).message}); retrying`);
        await new Promise((r) => setTimeout(r, 2_000));
      }
    }
    await cl.back?.(kind, down);
    c.brokerDown = false;
  })();
  if (failed && killed.every((k) => k.status === 'rejected'))
    return { injected: false, detail: `kill failed: ${(failed.reason as Error).message}` };
  return { injected: true, detail: `kill -9 ${what}, restart in ${downMs} ms` };
}
