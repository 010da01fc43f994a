/**
 * The relay's broker health (relay/broker-health.ts): the failure streak of sends, connects and
 * probes, when it makes the relay stand down, and the producer's lifecycle (one rebuild at a time,
 * dropped after a failure, rejoin once one connects). The clock and timers are injected; the
 * producers are scripted (pure logic: the relay's use of a real broker is tested in test/relay/).
 */
import { describe, expect, it } from 'vitest';
import { BrokerHealth, withDeadline, type HealthClock } from '../../../relay/broker-health.js';
import { BrokerUnavailableError } from '../../../src/errors.js';
import { noopLogger } from '../../../src/logger.js';
import type { KafkaProducer } from '../../../src/kafka/types.js';

const LEASE_MS = 10_000;

/** A manual clock: `advance(ms)` moves time and fires the timers that are due. */
function manualClock() {
  let t = 0;
  let nextId = 0;
  const timers = new Map<number, { at: number; fn: () => void }>();
  const clock: HealthClock = {
    now: () => t,
    setTimeout: (fn, ms) => {
      const id = ++nextId;
      timers.set(id, { at: t + ms, fn });
      return { id } as { unref?(): unknown };
    },
    clearTimeout: (timer) => {
      if (timer) timers.delete((timer as { id: number }).id);
    },
  };
  return {
    clock,
    advance(ms: number) {
      t += ms;
      for (const [id, timer] of [...timers]) {
        if (timer.at <= t) {
          timers.delete(id);
          timer.fn();
        }
      }
    },
    pending: () => timers.size,
  };
}

/** Producers whose connects succeed or fail as scripted; each records what was done to it. */
function producers(connects: boolean[]) {
  const made: { connected: boolean; disconnected: boolean; probe: () => Promise<void> }[] = [];
  let probeAnswers = true;
  const make = (): KafkaProducer => {
    const ok = connects.shift() ?? true;
    const p = {
      connected: false,
      disconnected: false,
      probe: async () => {
        if (!probeAnswers) throw new Error('no metadata');
      },
    };
    made.push(p);
    return {
      connect: async () => {
        if (!ok) throw new Error('connection refused');
        p.connected = true;
      },
      send: async (records) => ({ outcomes: records.map(() => ({ ok: true as const })) }),
      probe: () => p.probe(),
      disconnect: async () => {
        p.disconnected = true;
      },
    };
  };
  return { make, made, setProbeAnswers: (v: boolean) => (probeAnswers = v) };
}

function health(connects: boolean[] = []) {
  const m = manualClock();
  const p = producers(connects);
  let due = 0;
  const h = new BrokerHealth({
    makeProducer: p.make,
    brokerTimeoutMs: 1_000,
    leaseMs: LEASE_MS,
    onStandDownDue: () => due++,
    logger: noopLogger,
    clock: m.clock,
  });
  return { h, m, p, due: () => due };
}

describe('BrokerHealth', () => {
  it('connects a producer; a failed send starts a streak at its start that is due for a stand-down a lease later', async () => {
    const { h, m, due } = health();
    await h.awaitProducer();
    expect(h.producer).toBeDefined();
    expect(h.standDownDue()).toBeUndefined();
    const started = h.sendStarted();
    m.advance(500);
    h.sendFailed(started);
    m.advance(LEASE_MS - 500);
    expect(h.standDownDue()).toBeUndefined(); // exactly a lease: not longer
    expect(due()).toBe(0);
    m.advance(10);
    expect(h.standDownDue()).toBe(LEASE_MS + 10);
    expect(due()).toBe(1); // the timer asked for a maintenance right then
  });

  it('a streak with a failed send ends only with an acknowledged send, not with a connect or a probe', async () => {
    const { h, m } = health();
    await h.awaitProducer();
    h.sendFailed(h.sendStarted());
    await h.awaitProducer(); // reconnected: the broker answers connects...
    m.advance(LEASE_MS + 1);
    expect(h.standDownDue()).toBeGreaterThan(LEASE_MS); // ...but refused every send: still failing
    h.sendSucceeded();
    expect(h.standDownDue()).toBeUndefined();
  });

  it('a postponed stand-down (only some partitions fail) starts the streak over: due again a lease later', async () => {
    const { h, m, due } = health();
    await h.awaitProducer();
    h.sendFailed(h.sendStarted());
    m.advance(LEASE_MS + 10);
    expect(due()).toBe(1);
    expect(h.standDownDue()).toBe(LEASE_MS + 10);
    h.postponeStandDown();
    expect(h.standDownDue()).toBeUndefined();
    expect(h.failingSinceMs).toBe(m.clock.now());
    m.advance(LEASE_MS + 10);
    expect(due()).toBe(2); // asked again
    expect(h.standDownDue()).toBe(LEASE_MS + 10);
    h.sendSucceeded();
    expect(h.failingSinceMs).toBeUndefined();
    h.postponeStandDown(); // no streak: nothing to postpone
    expect(h.failingSinceMs).toBeUndefined();
  });

  it('a send the cluster answered (a blocked partition) neither starts nor ends a streak', async () => {
    const { h, m } = health();
    await h.awaitProducer();
    h.sendStarted();
    h.sendAnswered();
    m.advance(LEASE_MS + 1);
    expect(h.standDownDue()).toBeUndefined();
    h.sendFailed(h.sendStarted());
    h.sendAnswered();
    m.advance(LEASE_MS + 1);
    expect(h.standDownDue()).toBeGreaterThan(LEASE_MS);
  });

  it('a streak from connects alone ends when the broker answers; a record error counts as an answer', async () => {
    const { h, m } = health([false]);
    await h.awaitProducer();
    expect(h.producer).toBeUndefined();
    m.advance(LEASE_MS + 1);
    expect(h.standDownDue()).toBeGreaterThan(LEASE_MS);
    await h.awaitProducer(); // the second producer connects
    expect(h.producer).toBeDefined();
    expect(h.standDownDue()).toBeUndefined();
    // A send refused for the record's own reason: the broker works.
    h.sendSucceeded();
    expect(h.standDownDue()).toBeUndefined();
  });

  it('one rebuild at a time: concurrent awaits share it, and the old producer is disconnected first', async () => {
    const { h, p } = health();
    await h.awaitProducer();
    const first = p.made[0]!;
    await Promise.all([h.awaitProducer(), h.awaitProducer(), h.rebuild()]);
    expect(p.made).toHaveLength(2);
    expect(first.disconnected).toBe(true);
    expect(p.made[1]!.connected).toBe(true);
  });

  it('probes an idle relay only when due; an unanswered probe drops the producer and starts a streak', async () => {
    const { h, m, p } = health([true, false]);
    await h.awaitProducer();
    expect(h.probeDue(3_000)).toBe(false); // the connect was an answer
    m.advance(1_501);
    expect(h.probeDue(3_000)).toBe(true);
    h.sendStarted();
    expect(h.probeDue(3_000)).toBe(false); // a send in flight says the same
    h.sendSucceeded();
    m.advance(1_501);
    p.setProbeAnswers(false);
    await h.probe();
    await h.rebuild(); // the rebuild the failed probe started; its connect fails too
    expect(p.made[0]!.disconnected).toBe(true);
    expect(h.producer).toBeUndefined();
    m.advance(LEASE_MS + 1);
    expect(h.standDownDue()).toBeGreaterThan(LEASE_MS);
    // A producer that connects ends a streak of probes and connects.
    await h.awaitProducer();
    expect(h.standDownDue()).toBeUndefined();
  });

  it('a stand-down is entered once; rejoin needs a connected producer, and forgets the streak', async () => {
    const { h, m } = health([false, true]);
    await h.awaitProducer();
    m.advance(LEASE_MS + 1);
    expect(h.enterStandDown()).toBe(true);
    expect(h.enterStandDown()).toBe(false);
    expect(h.standingDown).toBe(true);
    expect(h.rejoin()).toBe(false); // no producer yet
    await h.awaitProducer();
    expect(h.rejoin()).toBe(true);
    expect(h.standingDown).toBe(false);
    expect(h.standDownDue()).toBeUndefined();
  });

  it('a stand-down ends at the first maintenance that finds none due, also when a late connect ended the streak without rejoin()', async () => {
    const { h, m } = health([false]);
    await h.awaitProducer(); // refused: a streak of connects
    m.advance(LEASE_MS + 1);
    expect(h.standDownDue()).toBeGreaterThan(LEASE_MS);
    expect(h.enterStandDown()).toBe(true);
    // A connect that outlasted brokerTimeoutMs succeeds later (the relay's awaitProducer gave up
    // on it): the broker answered, the streak is over, and nothing called rejoin().
    await h.rebuild();
    expect(h.producer).toBeDefined();
    expect(h.standingDown).toBe(true); // until the relay's next maintenance...
    expect(h.standDownDue()).toBeUndefined(); // ...which takes lanes again:
    expect(h.standingDown).toBe(false); // so it no longer stands down (readiness must not stay 503)
    // A new streak a lease long makes a new stand-down (a new `relay:standing-down`).
    h.sendFailed(h.sendStarted());
    m.advance(LEASE_MS + 1);
    expect(h.standDownDue()).toBeGreaterThan(LEASE_MS);
    expect(h.enterStandDown()).toBe(true);
  });

  it('after stop() no producer is built and no stand-down timer fires', async () => {
    const { h, m, p, due } = health();
    await h.awaitProducer();
    h.sendFailed(h.sendStarted());
    h.stop();
    await h.rebuild();
    expect(p.made).toHaveLength(1);
    expect(h.producer).toBeUndefined();
    m.advance(LEASE_MS * 2);
    expect(due()).toBe(0);
    await h.close();
  });
});

describe('withDeadline', () => {
  it("says the table relay's course by default, and the caller's when given (the WAL relay has no leaseMs)", async () => {
    const never = new Promise<never>(() => {});
    const table = await withDeadline(never, 5, 'a send').catch((err: unknown) => err);
    expect(table).toBeInstanceOf(BrokerUnavailableError);
    expect((table as Error).message).toBe(
      'Kafka did not answer a send within brokerTimeoutMs (5 ms): the broker counts as unreachable; ' +
        'the relay backs off, reconnects, and stands down after leaseMs of failing.',
    );
    const wal = await withDeadline(never, 5, 'a send', 'the WAL relay holds its stream.').catch((err: unknown) => err);
    expect((wal as Error).message).toMatch(/unreachable; the WAL relay holds its stream\.$/);
    expect((wal as Error).message).not.toContain('leaseMs');
    await expect(withDeadline(Promise.resolve(7), 5, 'a send')).resolves.toBe(7);
  });
});
