/**
 * Per-partition health of a dedup consumer: for each topic-partition this member owns, the last
 * offset it handled and when, why it waits (if it does), and whether it is stuck. Pure logic: the
 * consumer feeds it what happens (fetched batches, handled messages, failures, assignments), and
 * the clock and timers are injected (test/unit/consumer/partition-health.test.ts).
 *
 * **Stuck.** A partition is stuck when it has messages to handle and made no progress for
 * `stuckAfterMs` or longer. It has messages to handle when its position (the next offset to
 * handle) is below the high watermark of its last fetch: a fetched batch not finished, or a
 * log end beyond the last batch. Progress is a message handled: applied, skipped as a duplicate
 * or as proven handled, or dead-lettered. The time without progress counts from the later of the
 * last progress and the moment the partition got messages to handle after it had none, so an idle
 * partition that receives a message is not stuck at once. A partition becomes stuck either at a
 * timer (nothing happens on a partition paused for a long backoff) or when health is read, and
 * recovers at its next progress; each transition is reported once ({@link PartitionHealthOptions}).
 *
 * What it cannot see: a partition that is not fetched at all (its leader unavailable) keeps the
 * high watermark of its last fetch, so new messages it cannot fetch do not make it stuck.
 */
import type { Logger } from '../src/logger.js';
import type { DedupConsumerEvents, TypedEmitter } from './events.js';

/** The clock and timers of {@link PartitionHealthTracker}; the process's by default. */
export interface PartitionHealthClock {
  /** Wall-clock time, in ms since the epoch. */
  now(): number;
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(timer: unknown): void;
}

const SYSTEM_CLOCK: PartitionHealthClock = {
  now: () => Date.now(),
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (timer) => clearTimeout(timer as NodeJS.Timeout),
};

/**
 * Why a partition's next message waits, and since when. Times are ms since the epoch.
 * - `retry`: its handler failed `attempts` times (each an attempt); the partition is paused for a
 *   backoff until `resumeAt`, then the message runs again (dead-lettered after `maxAttempts`).
 * - `retry-later`: its handler threw `RetryLaterError` (`deferrals` times, not counted as
 *   attempts); paused until `resumeAt`.
 * - `database`: the consumer's own database work failed (`failures` times in a row: PostgreSQL
 *   unreachable, its connection lost, lock timeout on the inbox row, commit failed); paused
 *   until `resumeAt`, not counted as attempts.
 * - `dead-letter-send`: the message is given up on, but producing it to the dead-letter topic
 *   failed (`failures` times in a row: topic missing or forbidden, broker unreachable); paused
 *   until `resumeAt`, then the send is tried again (the handler does not run again).
 *
 * `offset` is the waiting message's; `since` is when it began waiting for this reason. A waiting
 * state lasts until the message is handled (the runs after `resumeAt` included), or until it
 * waits for another reason.
 */
export type PartitionWait =
  | { reason: 'retry'; offset: string; since: number; resumeAt: number; attempts: number }
  | { reason: 'retry-later'; offset: string; since: number; resumeAt: number; deferrals: number }
  | { reason: 'database' | 'dead-letter-send'; offset: string; since: number; resumeAt: number; failures: number };

/** The health of one topic-partition this member owns. Times are ms since the epoch. */
export interface PartitionHealth {
  topic: string;
  partition: number;
  /** When this member got the partition (its first assignment of it without a revocation since). */
  assignedAt: number;
  /** The last offset handled (applied, duplicate, proven handled or dead-lettered) and when; null before the first. */
  lastHandled: { offset: string; at: number } | null;
  /**
   * Messages from the next one to handle to the partition's high watermark at its last fetch
   * (control records included); null before the first fetch. It is as old as that fetch: an idle
   * partition is fetched again only when new messages arrive.
   */
  lag: number | null;
  /** Why the partition's next message waits, or null when it does not (see {@link PartitionWait}). */
  waiting: PartitionWait | null;
  /** How long the partition has had messages to handle without progress, in ms; 0 when it has none. */
  stalledMs: number;
  /** `stalledMs` ≥ `stuckAfterMs`: messages to handle and no progress for that long. */
  stuck: boolean;
  /** When it became stuck (its last progress, or when it got messages to handle, plus `stuckAfterMs`); null when not stuck. */
  stuckSince: number | null;
}

/** Settings and listeners of a {@link PartitionHealthTracker}. */
export interface PartitionHealthOptions {
  /** A partition with messages to handle and no progress for this long is stuck, in ms. */
  stuckAfterMs: number;
  /** A partition became stuck (once per episode). */
  onStuck(health: PartitionHealth): void;
  /**
   * A stuck partition made progress (`revoked: false`), or was taken away from this member by a
   * rebalance while stuck (`revoked: true`: its new owner reports on it). `stuckForMs` is the
   * time from `stuckSince` to now.
   */
  onRecovered(health: PartitionHealth, details: { stuckForMs: number; revoked: boolean }): void;
  /** @defaultValue the process's `Date.now`, `setTimeout` and `clearTimeout` (the timer is unref'd) */
  clock?: PartitionHealthClock;
}

/** What the tracker needs of a fetched batch (an `InboundBatch` fits). */
export interface FetchedBatch {
  readonly topic: string;
  readonly partition: number;
  readonly messages: readonly { readonly offset: string }[];
  /** The offset the fetch began at, when the client tells. */
  readonly fetchedOffset?: string;
  /** Decimal string. */
  readonly highWatermark: string;
  /** The offset of the last record the fetch returned, filtered ones included. */
  readonly lastOffset: string;
}

interface Entry {
  readonly topic: string;
  readonly partition: number;
  readonly assignedAt: number;
  lastHandled: { offset: string; at: number } | null;
  /** The next offset to handle, known from the first fetch on. */
  position: bigint | null;
  highWatermark: bigint | null;
  /** The last fetched batch's last message, and its last record (filtered ones included). */
  batchEnd: { lastMessage: bigint; lastRecord: bigint } | null;
  waiting: PartitionWait | null;
  /** When the partition last got messages to handle after it had none; null while it has none. */
  busySince: number | null;
  /** The stuck verdict reported last (by `onStuck`), and when it began. */
  reportedStuckSince: number | null;
}

/** The key of a partition in the tracker's map. */
const keyOf = (topic: string, partition: number) => `${partition}:${topic}`;

/** Parses a decimal offset; null when it is not one. */
function offsetOf(text: string | undefined): bigint | null {
  return text !== undefined && /^-?[0-9]{1,19}$/.test(text) ? BigInt(text) : null;
}

/** The health of the partitions a consumer owns (see the module's doc). */
export class PartitionHealthTracker {
  readonly #entries = new Map<string, Entry>();
  readonly #options: PartitionHealthOptions;
  readonly #clock: PartitionHealthClock;
  /** The one check timer, and the time (clock ms) it fires at. */
  #timer: { handle: unknown; at: number } | undefined;

  constructor(options: PartitionHealthOptions) {
    this.#options = options;
    this.#clock = options.clock ?? SYSTEM_CLOCK;
  }

  /** The threshold, in ms. */
  get stuckAfterMs(): number {
    return this.#options.stuckAfterMs;
  }

  /**
   * The member's assignment after a (re)join: partitions it did not own get a fresh entry, those
   * it no longer owns are forgotten (a stuck one is reported recovered with `revoked: true`).
   */
  assigned(assignment: Readonly<Record<string, readonly number[]>>): void {
    const now = this.#clock.now();
    const keep = new Set<string>();
    for (const [topic, partitions] of Object.entries(assignment)) {
      for (const partition of partitions) {
        const key = keyOf(topic, partition);
        keep.add(key);
        if (!this.#entries.has(key)) this.#entries.set(key, newEntry(topic, partition, now));
      }
    }
    for (const [key, entry] of this.#entries) {
      if (keep.has(key)) continue;
      this.#entries.delete(key);
      if (entry.reportedStuckSince !== null) this.#recovered(entry, now, true);
    }
    this.#rearm();
  }

  /** A batch of a partition was fetched: its position, high watermark and last record. */
  fetched(batch: FetchedBatch): void {
    const now = this.#clock.now();
    const entry = this.#entryOf(batch.topic, batch.partition, now);
    const first = batch.messages[0];
    const last = batch.messages[batch.messages.length - 1];
    const from = offsetOf(batch.fetchedOffset) ?? offsetOf(first?.offset);
    // The client fetches from the partition's position: everything before it is handled.
    if (from !== null) entry.position = from;
    const highWatermark = offsetOf(batch.highWatermark);
    if (highWatermark !== null) entry.highWatermark = highWatermark;
    const lastMessage = offsetOf(last?.offset);
    const lastRecord = offsetOf(batch.lastOffset);
    entry.batchEnd =
      lastMessage === null ? null : { lastMessage, lastRecord: lastRecord === null ? lastMessage : lastRecord };
    this.#update(entry, now);
  }

  /** The message at `offset` was handled (applied, duplicate, proven handled or dead-lettered): progress. */
  handled(topic: string, partition: number, offset: string): void {
    const now = this.#clock.now();
    const entry = this.#entries.get(keyOf(topic, partition));
    const handled = offsetOf(offset);
    if (entry === undefined || handled === null) return;
    entry.lastHandled = { offset, at: now };
    let next = handled + 1n;
    // The batch's last message done: so are the control records after it (the client marks them too).
    if (entry.batchEnd !== null && handled >= entry.batchEnd.lastMessage) {
      next = entry.batchEnd.lastRecord + 1n > next ? entry.batchEnd.lastRecord + 1n : next;
    }
    if (entry.position === null || next > entry.position) entry.position = next;
    if (entry.waiting !== null && BigInt(entry.waiting.offset) <= handled) entry.waiting = null;
    this.#update(entry, now);
  }

  /**
   * The partition's next message waits (its partition paused for `delayMs`), for `reason`.
   * `count` is the message's attempts (`retry`) or deferrals (`retry-later`); for the other
   * reasons the failures in a row are counted here.
   */
  waiting(
    topic: string,
    partition: number,
    wait: { reason: PartitionWait['reason']; offset: string; delayMs: number; count?: number },
  ): void {
    const now = this.#clock.now();
    const entry = this.#entries.get(keyOf(topic, partition));
    if (entry === undefined) return;
    const { reason, offset, delayMs } = wait;
    const same = entry.waiting?.reason === reason && entry.waiting.offset === offset ? entry.waiting : null;
    const since = same?.since ?? now;
    const resumeAt = now + delayMs;
    switch (reason) {
      case 'retry':
        entry.waiting = { reason, offset, since, resumeAt, attempts: wait.count ?? 1 };
        break;
      case 'retry-later':
        entry.waiting = { reason, offset, since, resumeAt, deferrals: wait.count ?? 1 };
        break;
      default: {
        const failures = same !== null && 'failures' in same ? same.failures + 1 : 1;
        entry.waiting = { reason, offset, since, resumeAt, failures };
      }
    }
    this.#update(entry, now);
  }

  /**
   * The health of every partition this member owns, by topic then partition. Reports the
   * transitions that are due (`onStuck`) first, so what it returns and what was reported agree.
   */
  snapshot(): { at: number; partitions: PartitionHealth[] } {
    const now = this.#clock.now();
    this.#check(now);
    const partitions = [...this.#entries.values()]
      .sort((a, b) => (a.topic === b.topic ? a.partition - b.partition : a.topic < b.topic ? -1 : 1))
      .map((entry) => this.#healthOf(entry, now));
    return { at: now, partitions };
  }

  /** Forgets every partition and cancels the timer (on stop); reports nothing. */
  clear(): void {
    this.#entries.clear();
    this.#disarm();
  }

  // ------------------------------------------------------------------------------------------

  #entryOf(topic: string, partition: number, now: number): Entry {
    const key = keyOf(topic, partition);
    let entry = this.#entries.get(key);
    // A batch of a partition the assignment did not name yet (the join event comes first with
    // kafkajs): tracked from here on.
    if (entry === undefined) this.#entries.set(key, (entry = newEntry(topic, partition, now)));
    return entry;
  }

  /** Whether the partition has messages to handle. */
  #busy(entry: Entry): boolean {
    return entry.position !== null && entry.highWatermark !== null && entry.highWatermark > entry.position;
  }

  /** When the time without progress began, or null when the partition has nothing to handle. */
  #stalledFrom(entry: Entry): number | null {
    if (entry.busySince === null) return null;
    const last = entry.lastHandled?.at ?? Number.NEGATIVE_INFINITY;
    return Math.max(entry.busySince, last);
  }

  /** After a change of one partition: its busy time, a recovery, and the timer. */
  #update(entry: Entry, now: number): void {
    if (!this.#busy(entry)) entry.busySince = null;
    else entry.busySince ??= now;
    const from = this.#stalledFrom(entry);
    const stuck = from !== null && now - from >= this.#options.stuckAfterMs;
    if (entry.reportedStuckSince !== null && !stuck) this.#recovered(entry, now, false);
    else if (entry.reportedStuckSince === null && stuck) this.#stuck(entry, from, now);
    if (from !== null && entry.reportedStuckSince === null) this.#arm(from + this.#options.stuckAfterMs);
  }

  /** Reports every partition whose verdict changed by `now` (time passing only makes partitions stuck). */
  #check(now: number): void {
    for (const entry of this.#entries.values()) {
      const from = this.#stalledFrom(entry);
      if (entry.reportedStuckSince === null && from !== null && now - from >= this.#options.stuckAfterMs) {
        this.#stuck(entry, from, now);
      }
    }
  }

  #stuck(entry: Entry, from: number, now: number): void {
    entry.reportedStuckSince = from + this.#options.stuckAfterMs;
    this.#options.onStuck(this.#healthOf(entry, now));
  }

  #recovered(entry: Entry, now: number, revoked: boolean): void {
    const stuckSince = entry.reportedStuckSince ?? now;
    entry.reportedStuckSince = null;
    this.#options.onRecovered(this.#healthOf(entry, now), { stuckForMs: Math.max(0, now - stuckSince), revoked });
  }

  #healthOf(entry: Entry, now: number): PartitionHealth {
    const from = this.#stalledFrom(entry);
    const stalledMs = from === null ? 0 : Math.max(0, now - from);
    const stuck = from !== null && stalledMs >= this.#options.stuckAfterMs;
    const lag =
      entry.position === null || entry.highWatermark === null
        ? null
        : Number(entry.highWatermark > entry.position ? entry.highWatermark - entry.position : 0n);
    return {
      topic: entry.topic,
      partition: entry.partition,
      assignedAt: entry.assignedAt,
      lastHandled: entry.lastHandled && { ...entry.lastHandled },
      lag,
      waiting: entry.waiting && { ...entry.waiting },
      stalledMs,
      stuck,
      stuckSince: stuck && from !== null ? from + this.#options.stuckAfterMs : null,
    };
  }

  /**
   * Makes the timer fire by `at` at the latest. Progress only moves deadlines later, so a timer
   * set earlier is kept (it checks, then re-arms for what is due next): no timer work per message.
   */
  #arm(at: number): void {
    if (this.#timer !== undefined && this.#timer.at <= at) return;
    this.#disarm();
    const delay = Math.max(0, at - this.#clock.now());
    const handle = this.#clock.setTimeout(() => this.#fire(), delay);
    (handle as { unref?: () => void } | null)?.unref?.();
    this.#timer = { handle, at };
  }

  #disarm(): void {
    if (this.#timer !== undefined) this.#clock.clearTimeout(this.#timer.handle);
    this.#timer = undefined;
  }

  #fire(): void {
    this.#timer = undefined;
    this.#check(this.#clock.now());
    this.#rearm();
  }

  /** Arms the timer for the earliest partition that may become stuck. */
  #rearm(): void {
    let earliest = Number.POSITIVE_INFINITY;
    for (const entry of this.#entries.values()) {
      const from = this.#stalledFrom(entry);
      if (from !== null && entry.reportedStuckSince === null) earliest = Math.min(earliest, from);
    }
    if (earliest === Number.POSITIVE_INFINITY) this.#disarm();
    else this.#arm(earliest + this.#options.stuckAfterMs);
  }
}

function newEntry(topic: string, partition: number, now: number): Entry {
  return {
    topic,
    partition,
    assignedAt: now,
    lastHandled: null,
    position: null,
    highWatermark: null,
    batchEnd: null,
    waiting: null,
    busySince: null,
    reportedStuckSince: null,
  };
}

/** What {@link trackPartitionHealth} needs of its consumer. */
export interface TrackedConsumer {
  groupId: string;
  stuckAfterMs: number;
  logger: Logger;
  /** The consumer's events: they feed the tracker, which emits its transitions there. */
  events: TypedEmitter<DedupConsumerEvents>;
  clock?: PartitionHealthClock;
}

/**
 * A tracker fed by the consumer's events (progress, retries, deferrals, errors), whose
 * transitions are logged at warn and emitted as `consumer:partition-stuck` and
 * `consumer:partition-recovered`. The consumer itself tells it its assignments and fetched
 * batches, and clears it on stop.
 */
export function trackPartitionHealth({
  groupId,
  stuckAfterMs,
  logger,
  events,
  clock,
}: TrackedConsumer): PartitionHealthTracker {
  const tracker = new PartitionHealthTracker({
    stuckAfterMs,
    ...(clock && { clock }),
    onStuck: (health) => {
      const { topic, partition, stalledMs, lastHandled, waiting, lag } = health;
      logger.warn(
        { groupId, topic, partition, stalledMs, stuckAfterMs, lastHandled, waiting, lag },
        'Partition stuck: it has messages to handle and made no progress for stuckAfterMs. `waiting` says why; ' +
          'restarting the process does not help (docs/runbooks.md, Stuck consumer partition).',
      );
      events.emit('consumer:partition-stuck', health);
    },
    onRecovered: (health, { stuckForMs, revoked }) => {
      const { topic, partition, lastHandled } = health;
      logger.warn(
        { groupId, topic, partition, stuckForMs, lastHandled, revoked },
        revoked
          ? 'Stuck partition taken away by a rebalance; its new owner reports on it.'
          : 'Stuck partition recovered: it makes progress again.',
      );
      events.emit('consumer:partition-recovered', { ...health, stuckForMs, revoked });
    },
  });
  const handled = (topic: string, partition: number, offset: string) => tracker.handled(topic, partition, offset);
  events.on('consumer:applied', ({ event }) => handled(event.topic, event.partition, event.offset));
  events.on('consumer:duplicate', ({ event }) => handled(event.topic, event.partition, event.offset));
  events.on('consumer:progress-skipped', ({ topic, partition, offset }) => handled(topic, partition, offset));
  events.on('consumer:dead-lettered', ({ topic, partition, offset }) => handled(topic, partition, offset));
  events.on('consumer:retry', ({ event, attempt, delayMs }) =>
    tracker.waiting(event.topic, event.partition, { reason: 'retry', offset: event.offset, delayMs, count: attempt }),
  );
  events.on('consumer:retry-later', ({ event, delayMs, deferrals, counted }) => {
    // Counted: a `consumer:retry` or `consumer:dead-lettered` follows and says what comes next.
    if (counted) return;
    tracker.waiting(event.topic, event.partition, {
      reason: 'retry-later',
      offset: event.offset,
      delayMs,
      count: deferrals,
    });
  });
  events.on('consumer:error', ({ topic, partition, offset, delayMs, source }) =>
    tracker.waiting(topic, partition, {
      reason: source === 'dead-letter' ? 'dead-letter-send' : 'database',
      offset,
      delayMs,
    }),
  );
  return tracker;
}
