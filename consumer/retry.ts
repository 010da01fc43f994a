/**
 * Retries of the dedup consumer: attempt counting, backoff, and what follows a failed run of a
 * message (retry after a pause of its partition, dead-letter, or neither). Pure logic: the random
 * source and the timers are injected (test/unit/consumer/retry.test.ts).
 *
 * A partition has at most one unresolved message (messages of one partition are processed one at
 * a time, in order), so the bookkeeping is per partition. Attempt counts live in memory: after a
 * rebalance or restart the new owner counts from 1 again.
 *
 * Why a retry pauses its partition instead of sleeping: see dedup-consumer.ts. The partition is
 * resumed by a timer after the backoff delay, and the client fetches the message again.
 *
 * Which failures count: see classify-error.ts (by where a failure comes from, never by its code).
 * A handler's `RetryLaterError` defers its message without counting, for at most
 * `maxRetryLaterMs` from the message's first deferral; after that it counts like any error.
 */
import { fullJitterBackoffMs } from '../src/backoff.js';
import { HandlerFailure, isInvalidMessage, retryLaterOf } from './classify-error.js';
import { reasonOf } from './dead-letter.js';
import type { MessagePosition } from './events.js';

/** The retry bookkeeping of the one unresolved message of a partition. */
export interface PendingMessage {
  offset: string;
  /** Failed handler runs (count towards maxAttempts). */
  attempts: number;
  /** Failures outside the handler (never dead-lettered; only pace the backoff). */
  infraFailures: number;
  /** The handler's `RetryLaterError`s that deferred it: how many, and when the first one came (the clock's ms). */
  deferred?: { count: number; since: number };
  /** Set once the consumer gave up, so a failed DLQ send retries the send, not the handler. */
  deadLetter?: { reason: string; error: unknown };
}

/** The options retries follow (see `DedupConsumerOptions`). */
export interface RetryPolicy {
  /** Handler runs of one message before it is dead-lettered. */
  maxAttempts: number;
  /** Ceiling of the first retry delay, in ms. */
  retryInitialMs: number;
  /** Largest retry delay ceiling, in ms. */
  retryMaxMs: number;
  /** Longest time a message is deferred by `RetryLaterError`s without counting, from its first, in ms. */
  maxRetryLaterMs: number;
}

/** A `RetryLaterError` the message's run ended with, as the decision reports it. */
export interface RetryLater {
  /** Its deferrals so far, this one included when it deferred. */
  deferrals: number;
  /** Time since its first deferral, in ms (0 for the first). */
  deferredMs: number;
  /** False: deferred, not an attempt. True: `maxRetryLaterMs` passed, so it counts as an attempt. */
  counted: boolean;
}

/** What follows a failed run of a message (rolled back). */
export type RetryDecision =
  /** Stopping or losing the partition: not an attempt; the message runs again later. */
  | { kind: 'interrupted' }
  /** The handler failed: an attempt; the partition pauses `delayMs`, then the message runs again. */
  | { kind: 'retry'; delayMs: number; error: unknown; retryLater?: RetryLater }
  /** Given up (an `InvalidMessageError`, or `maxAttempts` handler failures): dead-letter it. */
  | { kind: 'dead-letter'; reason: string; error: unknown; retryLater?: RetryLater }
  /** The handler threw a `RetryLaterError` within `maxRetryLaterMs`: not an attempt; pause `delayMs`. */
  | { kind: 'deferred'; delayMs: number; error: unknown; retryLater: RetryLater }
  /** A failure that is not the message's (database, connection): not an attempt; pause `delayMs`. */
  | { kind: 'error'; delayMs: number; error: unknown };

/** The timers a {@link Retries} resumes partitions with. */
export interface Timers {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(timer: unknown): void;
}

const SYSTEM_TIMERS: Timers = {
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (timer) => clearTimeout(timer as NodeJS.Timeout),
};

/** The key of a partition in the consumer's maps. */
export function partitionKey(topic: string, partition: number): string {
  return `${partition}:${topic}`;
}

function splitKey(key: string): [string, number] {
  const colon = key.indexOf(':');
  return [key.slice(colon + 1), Number(key.slice(0, colon))];
}

/** The retry state of the partitions a consumer owns, and the timers that resume paused ones. */
export class Retries {
  readonly #pending = new Map<string, PendingMessage>();
  readonly #resumeTimers = new Set<unknown>();
  readonly #policy: RetryPolicy;
  readonly #random: () => number;
  readonly #timers: Timers;
  readonly #now: () => number;

  /**
   * @param options.random - a source of [0, 1) numbers for the backoff's jitter. @defaultValue Math.random
   * @param options.timers - @defaultValue the system's `setTimeout` and `clearTimeout`
   * @param options.now - a monotonic clock in ms, for `maxRetryLaterMs`. @defaultValue performance.now
   */
  constructor(policy: RetryPolicy, options: { random?: () => number; timers?: Timers; now?: () => number } = {}) {
    this.#policy = policy;
    this.#random = options.random ?? Math.random;
    this.#timers = options.timers ?? SYSTEM_TIMERS;
    this.#now = options.now ?? (() => performance.now());
  }

  /** The retry state of the partition's unresolved message (fresh when the message changed). */
  pendingOf(position: MessagePosition): PendingMessage {
    const key = partitionKey(position.topic, position.partition);
    let pending = this.#pending.get(key);
    if (pending?.offset !== position.offset) {
      pending = { offset: position.offset, attempts: 0, infraFailures: 0 };
      this.#pending.set(key, pending);
    }
    return pending;
  }

  /** The message at `position` is resolved: its state is forgotten (if it is still the partition's). */
  resolved(position: MessagePosition): void {
    const key = partitionKey(position.topic, position.partition);
    if (this.#pending.get(key)?.offset === position.offset) this.#pending.delete(key);
  }

  /** The partition moved past its unresolved message (dead-lettered, or proven handled). */
  forget(position: MessagePosition): void {
    this.#pending.delete(partitionKey(position.topic, position.partition));
  }

  /** Forgets the partitions this member no longer owns. */
  keepOnly(assignment: Record<string, number[]>): void {
    for (const key of this.#pending.keys()) {
      const [topic, partition] = splitKey(key);
      if (!assignment[topic]?.includes(partition)) this.#pending.delete(key);
    }
  }

  /** Forgets every partition's state. */
  clear(): void {
    this.#pending.clear();
  }

  /**
   * Decides what follows a failed run of the message at `position` (see {@link RetryDecision}),
   * and records it:
   * - a handler failure (a `HandlerFailure`, whatever its error's code) counts as attempt
   *   `attempt`; retry `n` waits a uniformly random time below
   *   `min(retryMaxMs, retryInitialMs * 2^(n-1))` (full jitter); giving up sets
   *   `pending.deadLetter`;
   * - a handler's `RetryLaterError` defers the message without counting while less than
   *   `maxRetryLaterMs` passed since its first deferral: it waits the `delayMs` the error asked
   *   for (else the backoff of its `n`th deferral), cut to what is left of `maxRetryLaterMs`.
   *   After that it counts as an attempt (`retryLater.counted`);
   * - any other failure (the consumer's own statements and connection: classify-error.ts) only
   *   paces the backoff.
   *
   * @param failure.aborted - the handler's signal was aborted (stop or rebalance).
   * @param failure.value - the message value, which the dead-letter reason never quotes.
   */
  afterFailure(
    position: MessagePosition,
    pending: PendingMessage,
    failure: { attempt: number; error: unknown; aborted: boolean; value: Buffer | null },
  ): RetryDecision {
    const { attempt, error, aborted } = failure;
    // In batch mode later messages were prepared meanwhile: this one is the partition's unresolved one.
    this.#pending.set(partitionKey(position.topic, position.partition), pending);
    if (aborted) return { kind: 'interrupted' };
    if (!(error instanceof HandlerFailure)) return { kind: 'error', delayMs: this.afterError(pending), error };
    const { maxAttempts, retryInitialMs, retryMaxMs, maxRetryLaterMs } = this.#policy;
    let retryLater: RetryLater | undefined;
    const later = retryLaterOf(error.error);
    if (later) {
      const now = this.#now();
      const since = pending.deferred?.since ?? now;
      const deferredMs = Math.max(0, now - since);
      const left = maxRetryLaterMs - deferredMs;
      if (left > 0) {
        const deferrals = (pending.deferred?.count ?? 0) + 1;
        pending.deferred = { count: deferrals, since };
        const wanted = later.delayMs ?? fullJitterBackoffMs(deferrals, retryInitialMs, retryMaxMs, this.#random);
        return {
          kind: 'deferred',
          delayMs: Math.ceil(Math.min(wanted, left)),
          error: error.error,
          retryLater: { deferrals, deferredMs, counted: false },
        };
      }
      retryLater = { deferrals: pending.deferred?.count ?? 0, deferredMs, counted: true };
    }
    pending.attempts = attempt;
    if (isInvalidMessage(error.error) || attempt >= maxAttempts) {
      pending.deadLetter = { reason: reasonOf(error.error, failure.value), error: error.error };
      return { kind: 'dead-letter', ...pending.deadLetter, ...(retryLater && { retryLater }) };
    }
    const delayMs = fullJitterBackoffMs(attempt, retryInitialMs, retryMaxMs, this.#random);
    return { kind: 'retry', delayMs, error: error.error, ...(retryLater && { retryLater }) };
  }

  /**
   * A failure that is not the message's (database, dead-letter send): never an attempt; the
   * backoff grows with the message's run of such failures.
   *
   * @returns the delay before the message goes again, in ms.
   */
  afterError(pending: PendingMessage): number {
    pending.infraFailures += 1;
    return fullJitterBackoffMs(
      pending.infraFailures,
      this.#policy.retryInitialMs,
      this.#policy.retryMaxMs,
      this.#random,
    );
  }

  /**
   * Pauses a partition (`pause()` returns the function that resumes it) and resumes it after
   * `delayMs`.
   *
   * @param onResumeError - called with what resuming threw (the consumer restarted meanwhile).
   */
  pauseFor(pause: () => () => void, delayMs: number, onResumeError: (err: unknown) => void): void {
    const resume = pause();
    const timer = this.#timers.setTimeout(() => {
      this.#resumeTimers.delete(timer);
      try {
        resume();
      } catch (err) {
        onResumeError(err);
      }
    }, delayMs);
    this.#resumeTimers.add(timer);
  }

  /** Cancels every pending resume (on stop). */
  cancelResumes(): void {
    for (const timer of this.#resumeTimers) this.#timers.clearTimeout(timer);
    this.#resumeTimers.clear();
  }
}
