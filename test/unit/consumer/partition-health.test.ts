/**
 * consumer/partition-health.ts without infrastructure, on vitest's fake clock and timers: when a
 * partition is stuck (messages to handle, no progress for stuckAfterMs) and when it is not (idle,
 * caught up, making progress through a backlog), the transitions reported once each, why a
 * partition waits, revoked partitions, and the events that feed it.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { TypedEmitter, type DedupConsumerEvents } from '../../../consumer/events.js';
import {
  PartitionHealthTracker,
  trackPartitionHealth,
  type FetchedBatch,
  type PartitionHealth,
} from '../../../consumer/partition-health.js';
import type { ConsumedEvent } from '../../../consumer/consumed-event.js';
import { noopLogger, type Logger } from '../../../src/logger.js';

const T0 = 1_700_000_000_000;
const STUCK_AFTER_MS = 10_000;

beforeEach(() => {
  vi.useFakeTimers({ now: T0 });
});
afterEach(() => {
  vi.useRealTimers();
});

/** A batch of `topic`/`partition` holding offsets `from` to `to`, fetched from `from`. */
function batch(
  partition: number,
  from: number,
  to: number,
  options: { highWatermark?: number; lastOffset?: number; topic?: string } = {},
): FetchedBatch {
  const messages = [];
  for (let o = from; o <= to; o++) messages.push({ offset: String(o) });
  return {
    topic: options.topic ?? 'orders',
    partition,
    messages,
    fetchedOffset: String(from),
    highWatermark: String(options.highWatermark ?? to + 1),
    lastOffset: String(options.lastOffset ?? to),
  };
}

/** A tracker on the fake clock that records its transitions. */
function tracker(stuckAfterMs = STUCK_AFTER_MS) {
  const stuck: PartitionHealth[] = [];
  const recovered: (PartitionHealth & { stuckForMs: number; revoked: boolean })[] = [];
  const t = new PartitionHealthTracker({
    stuckAfterMs,
    onStuck: (h) => stuck.push(h),
    onRecovered: (h, d) => recovered.push({ ...h, ...d }),
  });
  const of = (partition: number, topic = 'orders') => {
    const p = t.snapshot().partitions.find((h) => h.topic === topic && h.partition === partition);
    if (!p) throw new Error(`no health for ${topic}/${partition}`);
    return p;
  };
  return { t, stuck, recovered, of };
}

describe('PartitionHealthTracker: the stuck verdict', () => {
  it('G7 an assigned partition with nothing to handle is never stuck, however long it idles', () => {
    const { t, stuck, of } = tracker();
    t.assigned({ orders: [0, 1] });
    vi.advanceTimersByTime(10 * STUCK_AFTER_MS);
    expect(of(0)).toEqual({
      topic: 'orders',
      partition: 0,
      assignedAt: T0,
      lastHandled: null,
      lag: null,
      waiting: null,
      stalledMs: 0,
      stuck: false,
      stuckSince: null,
    });
    // Caught up: the whole batch handled, then a long idle time.
    t.fetched(batch(0, 0, 2));
    for (const o of ['0', '1', '2']) t.handled('orders', 0, o);
    vi.advanceTimersByTime(10 * STUCK_AFTER_MS);
    expect(of(0)).toMatchObject({ lag: 0, stalledMs: 0, stuck: false, lastHandled: { offset: '2' } });
    expect(stuck).toEqual([]);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('G7 a fetched batch with no progress becomes stuck at stuckAfterMs (by the timer, once), not 1 ms before', () => {
    const { t, stuck, of } = tracker();
    t.assigned({ orders: [0] });
    vi.advanceTimersByTime(5_000);
    t.fetched(batch(0, 7, 9));
    vi.advanceTimersByTime(STUCK_AFTER_MS - 1);
    expect(stuck).toEqual([]);
    expect(of(0)).toMatchObject({ lag: 3, stalledMs: STUCK_AFTER_MS - 1, stuck: false, stuckSince: null });
    vi.advanceTimersByTime(1);
    // Reported by the timer, without anyone reading health.
    expect(stuck).toHaveLength(1);
    expect(stuck[0]).toMatchObject({
      partition: 0,
      stuck: true,
      stalledMs: STUCK_AFTER_MS,
      stuckSince: T0 + 5_000 + STUCK_AFTER_MS,
      lag: 3,
      lastHandled: null,
    });
    vi.advanceTimersByTime(5 * STUCK_AFTER_MS);
    expect(stuck).toHaveLength(1);
    expect(of(0)).toMatchObject({
      stuck: true,
      stalledMs: 6 * STUCK_AFTER_MS,
      stuckSince: T0 + 5_000 + STUCK_AFTER_MS,
    });
  });

  it('G7 a partition working through a long backlog is never stuck while each message takes less than the threshold', () => {
    const { t, stuck, of } = tracker();
    t.assigned({ orders: [0] });
    t.fetched(batch(0, 0, 99, { highWatermark: 10_000 }));
    for (let o = 0; o < 100; o++) {
      vi.advanceTimersByTime(STUCK_AFTER_MS - 1);
      t.handled('orders', 0, String(o));
    }
    expect(stuck).toEqual([]);
    expect(of(0)).toMatchObject({ lag: 9_900, stalledMs: 0, stuck: false });
    // Then the next fetch does not come: stuck a threshold after the last progress.
    vi.advanceTimersByTime(STUCK_AFTER_MS);
    expect(stuck).toHaveLength(1);
    expect(of(0).stuckSince).toBe(T0 + 100 * (STUCK_AFTER_MS - 1) + STUCK_AFTER_MS);
  });

  it('G7 counts the time without progress from when an idle partition got messages, not from its last progress', () => {
    const { t, stuck, of } = tracker();
    t.assigned({ orders: [0] });
    t.fetched(batch(0, 0, 0));
    t.handled('orders', 0, '0');
    vi.advanceTimersByTime(60 * STUCK_AFTER_MS); // idle for ten minutes
    t.fetched(batch(0, 1, 1));
    expect(of(0)).toMatchObject({ stalledMs: 0, stuck: false, lag: 1 });
    vi.advanceTimersByTime(STUCK_AFTER_MS / 2);
    expect(of(0)).toMatchObject({ stalledMs: STUCK_AFTER_MS / 2, stuck: false });
    expect(stuck).toEqual([]);
  });

  it('G7 recovers at the next progress (reported once, with how long it was stuck), and can become stuck again', () => {
    const { t, stuck, recovered, of } = tracker();
    t.assigned({ orders: [0] });
    t.fetched(batch(0, 0, 1));
    vi.advanceTimersByTime(STUCK_AFTER_MS + 2_500);
    expect(stuck).toHaveLength(1);
    t.handled('orders', 0, '0');
    expect(recovered).toHaveLength(1);
    expect(recovered[0]).toMatchObject({ partition: 0, stuck: false, stalledMs: 0, stuckForMs: 2_500, revoked: false });
    expect(recovered[0]!.lastHandled).toEqual({ offset: '0', at: T0 + STUCK_AFTER_MS + 2_500 });
    // Offset 1 is still to handle: the clock starts again at the progress.
    expect(of(0)).toMatchObject({ stuck: false, lag: 1 });
    vi.advanceTimersByTime(STUCK_AFTER_MS);
    expect(stuck).toHaveLength(2);
    t.handled('orders', 0, '1');
    expect(recovered).toHaveLength(2);
    expect(of(0)).toMatchObject({ stuck: false, lag: 0, stalledMs: 0 });
    expect(vi.getTimerCount()).toBe(0);
  });

  it('G7 each partition has its own verdict: a held one is stuck while the others progress', () => {
    const { t, stuck, of } = tracker();
    t.assigned({ orders: [0, 1, 2] });
    t.fetched(batch(0, 0, 0));
    for (let i = 0; i < 30; i++) {
      vi.advanceTimersByTime(1_000);
      for (const p of [1, 2]) {
        t.fetched(batch(p, i, i));
        t.handled('orders', p, String(i));
      }
    }
    expect(stuck.map((s) => s.partition)).toEqual([0]);
    expect(t.snapshot().partitions.map((p) => [p.partition, p.stuck])).toEqual([
      [0, true],
      [1, false],
      [2, false],
    ]);
    expect(of(1).lastHandled).toEqual({ offset: '29', at: T0 + 30_000 });
  });

  it('G7 control records after the last message do not leave the partition with messages to handle', () => {
    const { t, stuck, of } = tracker();
    t.assigned({ orders: [0] });
    // Messages 0-1, then a transaction marker at 2: high watermark 3.
    t.fetched(batch(0, 0, 1, { lastOffset: 2, highWatermark: 3 }));
    t.handled('orders', 0, '0');
    t.handled('orders', 0, '1');
    vi.advanceTimersByTime(5 * STUCK_AFTER_MS);
    expect(of(0)).toMatchObject({ lag: 0, stuck: false });
    expect(stuck).toEqual([]);
  });

  it('G7 stuck when health is read first (the verdict and the reported transitions agree)', () => {
    let now = T0;
    const timers: (() => void)[] = [];
    const stuck: PartitionHealth[] = [];
    const t = new PartitionHealthTracker({
      stuckAfterMs: 1_000,
      onStuck: (h) => stuck.push(h),
      onRecovered: () => {},
      // A clock whose timers never fire: only reading health can report.
      clock: { now: () => now, setTimeout: (cb) => timers.push(cb), clearTimeout: () => {} },
    });
    t.assigned({ orders: [0] });
    t.fetched(batch(0, 0, 0));
    now += 1_000;
    expect(stuck).toEqual([]);
    expect(t.snapshot().partitions[0]).toMatchObject({ stuck: true, stuckSince: T0 + 1_000 });
    expect(stuck).toHaveLength(1);
    t.snapshot();
    expect(stuck).toHaveLength(1);
  });

  it('keeps one timer however many partitions and messages, and clear() cancels it and reports nothing', () => {
    const { t, stuck } = tracker();
    t.assigned({ orders: [0, 1, 2, 3] });
    for (const p of [0, 1, 2, 3]) t.fetched(batch(p, 0, 9));
    expect(vi.getTimerCount()).toBe(1);
    for (let o = 0; o < 5; o++) t.handled('orders', 1, String(o));
    expect(vi.getTimerCount()).toBe(1);
    t.clear();
    expect(vi.getTimerCount()).toBe(0);
    vi.advanceTimersByTime(10 * STUCK_AFTER_MS);
    expect(stuck).toEqual([]);
    expect(t.snapshot().partitions).toEqual([]);
  });
});

describe('PartitionHealthTracker: why a partition waits', () => {
  it('G7 reports retry backoff with its attempts, keeping `since` across attempts of one message', () => {
    const { t, of } = tracker();
    t.assigned({ orders: [0] });
    t.fetched(batch(0, 4, 6));
    t.handled('orders', 0, '4');
    t.waiting('orders', 0, { reason: 'retry', offset: '5', delayMs: 800, count: 1 });
    vi.advanceTimersByTime(1_000);
    t.waiting('orders', 0, { reason: 'retry', offset: '5', delayMs: 1_600, count: 2 });
    expect(of(0).waiting).toEqual({ reason: 'retry', offset: '5', since: T0, resumeAt: T0 + 2_600, attempts: 2 });
    // Handled (dead-lettered or applied at last): no longer waiting.
    t.handled('orders', 0, '5');
    expect(of(0).waiting).toBeNull();
  });

  it('G7 reports RetryLaterError deferrals, database outages and failing dead-letter sends, each with its own since', () => {
    const { t, of } = tracker();
    t.assigned({ orders: [0] });
    t.fetched(batch(0, 0, 0));
    t.waiting('orders', 0, { reason: 'retry-later', offset: '0', delayMs: 30_000, count: 1 });
    vi.advanceTimersByTime(30_000);
    t.waiting('orders', 0, { reason: 'retry-later', offset: '0', delayMs: 30_000, count: 2 });
    expect(of(0).waiting).toEqual({
      reason: 'retry-later',
      offset: '0',
      since: T0,
      resumeAt: T0 + 60_000,
      deferrals: 2,
    });
    t.waiting('orders', 0, { reason: 'database', offset: '0', delayMs: 100 });
    vi.advanceTimersByTime(100);
    t.waiting('orders', 0, { reason: 'database', offset: '0', delayMs: 200 });
    expect(of(0).waiting).toEqual({
      reason: 'database',
      offset: '0',
      since: T0 + 30_000,
      resumeAt: T0 + 30_300,
      failures: 2,
    });
    t.waiting('orders', 0, { reason: 'dead-letter-send', offset: '0', delayMs: 100 });
    expect(of(0).waiting).toMatchObject({ reason: 'dead-letter-send', since: T0 + 30_100, failures: 1 });
    expect(of(0)).toMatchObject({ stuck: true, lastHandled: null });
  });
});

describe('PartitionHealthTracker: assignments', () => {
  it('G7 forgets revoked partitions (a stuck one reported recovered with revoked: true) and adds new ones', () => {
    const { t, stuck, recovered } = tracker();
    t.assigned({ orders: [0, 1], payments: [0] });
    t.fetched(batch(0, 0, 0));
    vi.advanceTimersByTime(STUCK_AFTER_MS);
    expect(stuck).toHaveLength(1);
    t.assigned({ orders: [1, 2] });
    expect(t.snapshot().partitions.map((p) => `${p.topic}/${p.partition}`)).toEqual(['orders/1', 'orders/2']);
    expect(recovered).toEqual([
      expect.objectContaining({ topic: 'orders', partition: 0, revoked: true, stuckForMs: 0 }),
    ]);
    // The kept partition keeps its state (assignedAt); the new one starts now.
    expect(t.snapshot().partitions.map((p) => p.assignedAt)).toEqual([T0, T0 + STUCK_AFTER_MS]);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('ignores progress of a partition it does not track', () => {
    const { t } = tracker();
    t.handled('orders', 5, '3');
    t.waiting('orders', 5, { reason: 'retry', offset: '3', delayMs: 10, count: 1 });
    expect(t.snapshot().partitions).toEqual([]);
  });
});

describe('trackPartitionHealth: fed by the consumer events, transitions logged at warn and emitted', () => {
  const event = (partition: number, offset: string) =>
    ({ id: 'e', topic: 'orders', partition, offset }) as unknown as ConsumedEvent;

  it('G7 maps retries, deferrals, database errors and dead-letter send failures, and logs both transitions at warn', () => {
    const warnings: string[] = [];
    const logger: Logger = { ...noopLogger, warn: (_fields, message) => warnings.push(message ?? '') };
    const events = new TypedEmitter<DedupConsumerEvents>(logger);
    const stuckEvents: PartitionHealth[] = [];
    const recoveredEvents: DedupConsumerEvents['consumer:partition-recovered'][] = [];
    events.on('consumer:partition-stuck', (h) => stuckEvents.push(h));
    events.on('consumer:partition-recovered', (h) => recoveredEvents.push(h));
    const t = trackPartitionHealth({ groupId: 'g', stuckAfterMs: 1_000, logger, events });
    t.assigned({ orders: [0] });
    t.fetched(batch(0, 0, 3));
    const reason = () => t.snapshot().partitions[0]!.waiting?.reason;

    events.emit('consumer:retry', { event: event(0, '0'), attempt: 1, delayMs: 50, error: new Error('x') });
    expect(reason()).toBe('retry');
    events.emit('consumer:retry-later', {
      event: event(0, '0'),
      attempt: 1,
      delayMs: 50,
      deferrals: 1,
      deferredMs: 0,
      counted: false,
      error: new Error('x'),
    });
    expect(reason()).toBe('retry-later');
    // Counted: the retry or dead letter that follows says what comes next.
    events.emit('consumer:retry-later', {
      event: event(0, '0'),
      attempt: 1,
      delayMs: 0,
      deferrals: 1,
      deferredMs: 0,
      counted: true,
      error: new Error('x'),
    });
    expect(reason()).toBe('retry-later');
    const at = { topic: 'orders', partition: 0, offset: '0', error: new Error('x'), delayMs: 50 };
    events.emit('consumer:error', { ...at, source: 'database' });
    expect(reason()).toBe('database');
    events.emit('consumer:error', { ...at, source: 'dead-letter' });
    expect(reason()).toBe('dead-letter-send');

    vi.advanceTimersByTime(1_000);
    expect(stuckEvents).toHaveLength(1);
    expect(stuckEvents[0]!.waiting?.reason).toBe('dead-letter-send');
    events.emit('consumer:dead-lettered', {
      topic: 'orders',
      partition: 0,
      offset: '0',
      eventId: 'e',
      deadLetterTopic: 'orders.dlq',
      reason: 'r',
      attempts: 5,
    });
    expect(recoveredEvents).toEqual([expect.objectContaining({ partition: 0, revoked: false, stuckForMs: 0 })]);
    // Every kind of progress counts: applied, duplicate, proven handled.
    events.emit('consumer:applied', { event: event(0, '1'), attempt: 1, durationMs: 1 });
    events.emit('consumer:duplicate', { event: event(0, '2'), firstApplied: null, elsewhere: false });
    events.emit('consumer:progress-skipped', { topic: 'orders', partition: 0, offset: '3', eventId: 'e' });
    expect(t.snapshot().partitions[0]).toMatchObject({ lag: 0, waiting: null, lastHandled: { offset: '3' } });
    expect(warnings).toEqual([
      expect.stringMatching(/^Partition stuck: it has messages to handle and made no progress for stuckAfterMs/),
      'Stuck partition recovered: it makes progress again.',
    ]);
  });
});
