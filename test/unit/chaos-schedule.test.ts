/**
 * The chaos harness's schedule: the seeded plan (one of each kind and one crash-point fault per
 * point first, evenly spread), the choice of the crash point to arm, the fault floor (skipped
 * faults replaced until enough were injected, within the deadline) and the profiles' options.
 */
import { InvalidArgumentError } from 'commander';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { runFaultPhase } from '../../chaos/fault-phase.js';
import {
  chooseCrashPoint,
  CLUSTER_FAULT_KINDS,
  CRASH_POINTS,
  crashPointsOf,
  FAULT_KINDS,
  injectFault,
  planFaults,
  runKinds,
  type FaultContext,
  type FaultKind,
  type KillableCluster,
} from '../../chaos/faults.js';
import {
  kindList,
  PROFILES,
  recordProgressMode,
  recordsProgress,
  resolveChaosOptions,
  sabotageList,
  sourceName,
} from '../../chaos/options.js';
import { seededRandom } from '../../chaos/random.js';

const KINDS = Object.keys(FAULT_KINDS) as FaultKind[];

describe('planFaults', () => {
  it('plans one of each kind and one crash point per point first, spread over [5 %, 90 %]', () => {
    const plan = planFaults(seededRandom(1), 60, 150, KINDS);
    expect(plan).toHaveLength(60);
    for (const k of KINDS) expect(plan.some((f) => f.kind === k)).toBe(true);
    expect(plan.filter((f) => f.kind === 'crash-point').length).toBeGreaterThanOrEqual(CRASH_POINTS.length);
    // With as many faults as kinds plus the extra crash points, those are exactly the plan.
    const exact = planFaults(seededRandom(9), KINDS.length + CRASH_POINTS.length - 1, 60, KINDS);
    expect(exact.filter((f) => f.kind === 'crash-point')).toHaveLength(CRASH_POINTS.length);
    const times = plan.map((f) => f.atMs);
    expect(times).toEqual([...times].sort((a, b) => a - b));
    expect(times[0]).toBeGreaterThanOrEqual(7_500);
    expect(times.at(-1)).toBeLessThan(135_000);
    // One fault per slot of 2.125 s: never more than two within one slot's length.
    for (let i = 2; i < times.length; i++) expect(times[i]! - times[i - 2]!).toBeGreaterThan(2_000);
  });

  it('gives the same plan for the same seed and another for another seed', () => {
    expect(planFaults(seededRandom(5), 30, 100, KINDS)).toEqual(planFaults(seededRandom(5), 30, 100, KINDS));
    expect(planFaults(seededRandom(5), 30, 100, KINDS)).not.toEqual(planFaults(seededRandom(6), 30, 100, KINDS));
  });

  it('keeps the first kinds when fewer faults than kinds are asked for, the cluster kinds first', () => {
    const single = KINDS.filter((k) => !CLUSTER_FAULT_KINDS.has(k));
    const plan = planFaults(seededRandom(2), 4, 20, single);
    expect(plan.map((f) => f.kind).sort()).toEqual(single.slice(0, 4).sort());
    expect(
      planFaults(seededRandom(2), 4, 20, KINDS)
        .map((f) => f.kind)
        .sort(),
    ).toEqual([...CLUSTER_FAULT_KINDS].sort());
  });

  it('never draws a cluster kind by weight: one of each per run', () => {
    for (let seed = 0; seed < 10; seed++) {
      const plan = planFaults(seededRandom(seed), 200, 600, KINDS);
      for (const k of CLUSTER_FAULT_KINDS) expect(plan.filter((f) => f.kind === k)).toHaveLength(1);
    }
  });
});

describe('chooseCrashPoint', () => {
  const stats = (armed: Record<string, [number, number]>) =>
    new Map(
      CRASH_POINTS.map((cp) => [cp.point, { armed: armed[cp.point]?.[0] ?? 0, fired: armed[cp.point]?.[1] ?? 0 }]),
    );
  const all = () => true;

  it('arms every point before any point a second time', () => {
    const counts = stats({});
    const random = seededRandom(3);
    for (let i = 0; i < CRASH_POINTS.length; i++) {
      const cp = chooseCrashPoint(random, counts, all, new Set())!;
      expect(counts.get(cp.point)!.armed).toBe(0);
      counts.get(cp.point)!.armed++;
    }
  });

  it('then prefers points that never fired, and never a point armed now or without a target', () => {
    const counts = stats(Object.fromEntries(CRASH_POINTS.map((cp) => [cp.point, [1, 1]])));
    counts.get('relay:after-send')!.fired = 0;
    counts.get('consumer:after-commit')!.fired = 0;
    for (let seed = 0; seed < 20; seed++) {
      const cp = chooseCrashPoint(seededRandom(seed), counts, (role) => role !== 'consumer', new Set());
      expect(cp!.point).toBe('relay:after-send');
    }
    expect(
      chooseCrashPoint(seededRandom(1), counts, (role) => role === 'relay', new Set(['relay:after-send']))!.point,
    ).toBe('relay:before-send');
    expect(chooseCrashPoint(seededRandom(1), counts, () => false, new Set())).toBeUndefined();
  });

  it('arms a witness listed twice twice, then the next witness', () => {
    const counts = stats({});
    const first = ['consumer:after-commit', 'relay:after-send', 'consumer:after-commit'];
    const armed: string[] = [];
    for (let i = 0; i < 4; i++) {
      const cp = chooseCrashPoint(seededRandom(i), counts, all, new Set(), first)!;
      counts.get(cp.point)!.armed++;
      armed.push(cp.point);
    }
    expect(armed.slice(0, 3)).toEqual(['consumer:after-commit', 'relay:after-send', 'consumer:after-commit']);
    expect(first).not.toContain(armed[3]);
  });

  it("arms a sabotaged run's witnesses first", () => {
    for (let seed = 0; seed < 20; seed++)
      expect(chooseCrashPoint(seededRandom(seed), stats({}), all, new Set(), ['consumer:after-commit'])!.point).toBe(
        'consumer:after-commit',
      );
  });
});

describe('runFaultPhase (the floor of injected faults)', () => {
  const plan = (n: number, everyMs: number) =>
    Array.from({ length: n }, (_, i) => ({ atMs: i * everyMs, kind: 'kill-relay' as FaultKind }));

  it('replaces skipped faults until the floor is injected, and injects no more', async () => {
    let calls = 0;
    const result = await runFaultPhase({
      plan: plan(10, 5),
      floor: 10,
      capMs: 5_000,
      spacingMs: 5,
      random: seededRandom(1),
      kinds: KINDS,
      tickMs: 2,
      // Every other fault finds its target down.
      inject: async () => ++calls % 2 === 0,
    });
    expect(result).toMatchObject({ injected: 10, floorReached: true });
    expect(result.skipped).toBeGreaterThanOrEqual(9);
    expect(result.replacements).toBe(result.skipped);
    expect(calls).toBe(result.injected + result.skipped);
  });

  it('draws replacements among the kinds that would find a target now', async () => {
    const tried: FaultKind[] = [];
    const result = await runFaultPhase({
      plan: plan(4, 1),
      floor: 4,
      capMs: 5_000,
      spacingMs: 2,
      random: seededRandom(7),
      kinds: KINDS,
      tickMs: 1,
      feasible: (kind) => kind === 'pg-terminate-listener',
      inject: async (kind) => {
        tried.push(kind);
        return kind === 'pg-terminate-listener';
      },
    });
    expect(result).toMatchObject({ injected: 4, skipped: 4, replacements: 4, floorReached: true });
    // The four planned faults (kill-relay), each skipped, and four replacements, all of the one
    // feasible kind. Their order is the clock's: on a loaded machine a replacement may come
    // before a later planned fault's time.
    expect(tried.filter((k) => k === 'kill-relay')).toHaveLength(4);
    expect(tried.filter((k) => k !== 'kill-relay')).toEqual(Array(4).fill('pg-terminate-listener'));
  });

  it('fails the floor when the deadline passes first', async () => {
    const started = Date.now();
    const result = await runFaultPhase({
      plan: plan(5, 5),
      floor: 5,
      capMs: 200,
      spacingMs: 10,
      random: seededRandom(1),
      kinds: KINDS,
      tickMs: 2,
      inject: async () => false,
    });
    expect(result.floorReached).toBe(false);
    expect(result.injected).toBe(0);
    expect(result.replacements).toBeGreaterThan(5);
    expect(Date.now() - started).toBeLessThan(1_000);
  });

  it('counts a fault that throws as skipped', async () => {
    const result = await runFaultPhase({
      plan: plan(3, 1),
      floor: 3,
      capMs: 100,
      spacingMs: 5,
      random: seededRandom(1),
      kinds: KINDS,
      tickMs: 2,
      inject: async () => {
        throw new Error('boom');
      },
    });
    expect(result).toMatchObject({ injected: 0, floorReached: false });
    expect(result.skipped).toBeGreaterThanOrEqual(3);
  });
});

describe('chaos options', () => {
  it('takes the profile, and flags override it', () => {
    expect(resolveChaosOptions({ profile: 'long' })).toMatchObject({ ...PROFILES.long, profile: 'long' });
    expect(resolveChaosOptions({ profile: 'long', seconds: 120, faults: 60 })).toMatchObject({
      profile: 'long',
      seconds: 120,
      faults: 60,
      rate: PROFILES.long.rate,
      consumers: PROFILES.long.consumers,
    });
  });

  it('asks the profiles for the issue floors: short at least 50 faults, long at least 1,000', () => {
    expect(PROFILES.short.faults).toBeGreaterThanOrEqual(50);
    expect(PROFILES.long.faults).toBeGreaterThanOrEqual(1_000);
    // Faults no closer than 1 s on average in the planned window, so the pipeline makes progress
    // between them (the recorded 1,000-fault PASS had 1.1 s), and a drain that outlasts the
    // profile's consumer lag (900 s there).
    expect((0.85 * PROFILES.long.seconds) / PROFILES.long.faults).toBeGreaterThanOrEqual(1);
    expect(PROFILES.long.drainTimeoutMs).toBeGreaterThanOrEqual(900_000);
  });

  it('parses --sabotage and rejects an unknown kind', () => {
    expect(sabotageList('no-dedup, lose-events,no-dedup')).toEqual(['no-dedup', 'lose-events']);
    expect(() => sabotageList('no-dedup,typo')).toThrow(InvalidArgumentError);
    expect(resolveChaosOptions({}).sabotage).toEqual([]);
  });

  it('--record-progress: mixed by default (odd members), all or none', () => {
    expect(resolveChaosOptions({}).recordProgress).toBe('mixed');
    // Progress would skip the redeliveries the no-dedup sabotage must show (one run in six passed).
    expect(resolveChaosOptions({ sabotage: ['no-dedup'] }).recordProgress).toBe('none');
    expect(resolveChaosOptions({ sabotage: ['no-dedup'], recordProgress: 'all' }).recordProgress).toBe('all');
    expect([1, 2, 3, 4].map((n) => recordsProgress('mixed', n))).toEqual([true, false, true, false]);
    expect([1, 2].map((n) => recordsProgress('all', n))).toEqual([true, true]);
    expect([1, 2].map((n) => recordsProgress('none', n))).toEqual([false, false]);
    expect(recordProgressMode('all')).toBe('all');
    expect(() => recordProgressMode('some')).toThrow(InvalidArgumentError);
  });

  it('parses --kinds and rejects an unknown kind', () => {
    expect(kindList('crash-point,kill-consumer')).toEqual(['crash-point', 'kill-consumer']);
    expect(() => kindList('crash-point,kill-everything')).toThrow(InvalidArgumentError);
  });
});

describe('--source wal', () => {
  it('replaces the LISTEN connection fault by the walsender fault, and the table relay crash points by the WAL relay ones', () => {
    const table = runKinds({ cluster: false, brokers: undefined, kinds: undefined, source: 'table' });
    expect(table).toContain('pg-terminate-listener');
    expect(table).not.toContain('pg-terminate-walsender');
    const wal = runKinds({ cluster: false, brokers: undefined, kinds: undefined, source: 'wal' });
    expect(wal).toContain('pg-terminate-walsender');
    expect(wal).not.toContain('pg-terminate-listener');
    expect(wal.filter((k) => k !== 'pg-terminate-walsender')).toEqual(
      table.filter((k) => k !== 'pg-terminate-listener'),
    );
    expect(crashPointsOf('table')).toBe(CRASH_POINTS);
    const points = crashPointsOf('wal').map((cp) => cp.point);
    expect(points.filter((p) => p.startsWith('relay:'))).toEqual([]);
    expect(points.filter((p) => p.startsWith('wal-relay:'))).toEqual([
      'wal-relay:before-send',
      'wal-relay:after-send',
      'wal-relay:after-delete',
    ]);
    // One crash-point fault per point of the run's list, when the count allows.
    const plan = planFaults(seededRandom(3), 60, 150, wal, crashPointsOf('wal'));
    expect(plan.filter((f) => f.kind === 'crash-point').length).toBeGreaterThanOrEqual(crashPointsOf('wal').length);
    const armed = chooseCrashPoint(
      seededRandom(1),
      new Map(),
      (role) => role === 'relay',
      new Set(),
      [],
      crashPointsOf('wal'),
    );
    expect(armed!.point).toMatch(/^wal-relay:/);
  });

  it('defaults to table, and refuses the combinations that do not apply', () => {
    expect(resolveChaosOptions({}).source).toBe('table');
    expect(sourceName('wal')).toBe('wal');
    expect(() => sourceName('binlog')).toThrow(InvalidArgumentError);
    // lose-events marks rows published: the WAL relay publishes what the stream brings regardless.
    expect(() => resolveChaosOptions({ source: 'wal', sabotage: ['lose-events'] })).toThrow(/does not apply/);
    expect(resolveChaosOptions({ source: 'wal', sabotage: ['no-dedup'] }).sabotage).toEqual(['no-dedup']);
    expect(() => resolveChaosOptions({ source: 'wal', cluster: true })).toThrow(InvalidArgumentError);
  });
});

describe('--cluster: the cluster faults', () => {
  afterEach(() => void vi.useRealTimers());

  it('schedules the cluster kinds only with --cluster, instead of kill-broker', () => {
    const cluster = runKinds({ cluster: true, brokers: undefined, kinds: undefined });
    expect(cluster.filter((k) => CLUSTER_FAULT_KINDS.has(k)).sort()).toEqual(
      ['kill-controller', 'kill-leader', 'kill-rf1-broker', 'kill-two-brokers'].sort(),
    );
    expect(cluster).not.toContain('kill-broker');
    const single = runKinds({ cluster: false, brokers: undefined, kinds: undefined });
    expect(single).toContain('kill-broker');
    expect(single.some((k) => CLUSTER_FAULT_KINDS.has(k))).toBe(false);
    expect(runKinds({ cluster: false, brokers: ['b:9092'], kinds: undefined })).not.toContain('kill-broker');
    expect(runKinds({ cluster: true, brokers: undefined, kinds: ['kill-leader', 'kill-broker'] })).toEqual([
      'kill-leader',
    ]);
    expect(() => resolveChaosOptions({ cluster: true, brokers: ['b:9092'] })).toThrow(InvalidArgumentError);
    expect(resolveChaosOptions({}).cluster).toBe(false);
  });

  /** A fake cluster of nodes 1-3 that records kills and restarts. */
  function fakeCluster(over: Partial<KillableCluster> = {}) {
    const events: string[] = [];
    const cluster: KillableCluster = {
      nodeIds: [1, 2, 3],
      rf1Node: 3,
      busiestLeader: async () => 2,
      controller: () => 1,
      kill: async (id) => void events.push(`kill ${id}`),
      restart: async (ids) => void events.push(`restart ${ids.join(',')}`),
      back: async (kind, ids) => void events.push(`back ${kind} ${ids.join(',')}`),
      ...over,
    };
    const ctx = {
      random: seededRandom(3),
      cluster,
      brokerDown: false,
      brokerBack: Promise.resolve(),
      log: () => undefined,
    } as unknown as FaultContext;
    return { events, ctx };
  }

  it('kills the chosen nodes at once, restarts them 7-12 s later and waits for them; one cluster fault at a time', async () => {
    vi.useFakeTimers();
    const { events, ctx } = fakeCluster();
    const leader = await injectFault('kill-leader', ctx);
    expect(leader).toMatchObject({ injected: true });
    expect(leader.detail).toMatch(/^kill -9 node 2, leader of most orders partitions, restart in \d+ ms$/);
    expect(ctx.brokerDown).toBe(true);
    // The next one waits for the cluster to be whole again.
    const controller = injectFault('kill-controller', ctx);
    await vi.advanceTimersByTimeAsync(6_900);
    expect(events).toEqual(['kill 2']);
    await vi.advanceTimersByTimeAsync(5_200);
    expect(events.slice(0, 4)).toEqual(['kill 2', 'restart 2', 'back kill-leader 2', 'kill 1']);
    expect(await controller).toMatchObject({
      injected: true,
      detail: expect.stringMatching(/^kill -9 node 1, the active controller/),
    });
    await vi.advanceTimersByTimeAsync(12_100);
    await ctx.brokerBack;
    expect(ctx.brokerDown).toBe(false);

    const two = await injectFault('kill-two-brokers', ctx);
    const killed = events.slice(-2);
    expect(killed.every((e) => /^kill [123]$/.test(e)) && killed[0] !== killed[1]).toBe(true);
    expect(two.detail).toMatch(/^kill -9 nodes \d and \d, restart/);
    await vi.advanceTimersByTimeAsync(12_100);
    expect(events.at(-2)).toMatch(/^restart \d,\d$/);

    const rf1 = await injectFault('kill-rf1-broker', ctx);
    expect(rf1.detail).toMatch(/^kill -9 node 3, the only broker of the audit topic/);
    await vi.advanceTimersByTimeAsync(12_100);
    expect(events.slice(-3)).toEqual(['kill 3', 'restart 3', 'back kill-rf1-broker 3']);
  });

  it('skips (and frees the cluster) when there is no leader or controller to kill, and needs --cluster', async () => {
    const { ctx } = fakeCluster({ busiestLeader: async () => undefined, controller: () => undefined });
    expect(await injectFault('kill-leader', ctx)).toEqual({ injected: false, detail: 'no leader known' });
    expect(await injectFault('kill-controller', ctx)).toMatchObject({ injected: false });
    expect(ctx.brokerDown).toBe(false);
    ctx.cluster = undefined;
    expect(await injectFault('kill-two-brokers', ctx)).toMatchObject({ injected: false, final: true });
  });
});
