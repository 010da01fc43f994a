/**
 * The dedup consumer's typed events (`area:action` names), for tests, metrics and tracing.
 */
import type { Logger } from '../src/logger.js';
import type { ConsumedEvent } from './consumed-event.js';
import type { InboxEntry } from './inbox-sql.js';
import type { PartitionHealth } from './partition-health.js';

/** Where a message sits in Kafka. */
export interface MessagePosition {
  topic: string;
  partition: number;
  /** Decimal string. */
  offset: string;
}

/** Every event of a dedup consumer and its payload. */
export interface DedupConsumerEvents {
  /** The handler ran and its transaction (with the inbox row) committed. */
  'consumer:applied': { event: ConsumedEvent; attempt: number; durationMs: number };
  /**
   * The event id was already in the inbox for this group: the handler did not run. `firstApplied`
   * is where and when the group applied it (null when the inbox row could not be read).
   * `elsewhere` is true when that was another message (another topic, partition or offset): a
   * relay's republish of the same event (harmless), or a different event that reuses the id,
   * whose effects this group never applies. Such a skip is logged at warn and counted in
   * `outboxkit_consumer_duplicates_elsewhere_total`; a redelivery of the applied message itself
   * (crash, rebalance, offset reset) is not.
   */
  'consumer:duplicate': { event: ConsumedEvent; firstApplied: InboxEntry | null; elsewhere: boolean };
  /**
   * `recordProgress` only: a redelivered record that the partition's progress proves handled
   * (applied, found in the inbox or dead-lettered before) was skipped without a transaction.
   * `eventId` is null for a record that has no usable event id (it was dead-lettered).
   */
  'consumer:progress-skipped': MessagePosition & { eventId: string | null };
  /**
   * The handler failed; its transaction rolled back and the message will run again after
   * `delayMs` (its partition is paused meanwhile; other partitions go on). Every error the
   * handler throws counts (network errors of the services it calls included), except a
   * `RetryLaterError` within `maxRetryLaterMs` (`consumer:retry-later`).
   */
  'consumer:retry': { event: ConsumedEvent; attempt: number; delayMs: number; error: unknown };
  /**
   * The handler threw a `RetryLaterError`; its transaction rolled back.
   * - `counted: false`: deferred without counting an attempt; the message runs again after
   *   `delayMs` (its partition paused meanwhile). `deferrals` is its count of deferrals so far
   *   (this one included) and `deferredMs` the time since its first, in ms.
   * - `counted: true`: `maxRetryLaterMs` had passed since its first deferral, so this run counts
   *   as attempt `attempt` like any other failure (`delayMs` is 0 here): a `consumer:retry` or
   *   `consumer:dead-lettered` follows.
   */
  'consumer:retry-later': {
    event: ConsumedEvent;
    attempt: number;
    delayMs: number;
    deferrals: number;
    deferredMs: number;
    counted: boolean;
    error: unknown;
  };
  /** The message went to the dead-letter topic and its offset may now be committed. */
  'consumer:dead-lettered': MessagePosition & {
    eventId: string | null;
    deadLetterTopic: string;
    reason: string;
    attempts: number;
    error?: unknown;
  };
  /**
   * A failure of the consumer's own work, not the handler's: its database connection or
   * statements (database unreachable, its connection lost during the handler's transaction, lock
   * timeout on the inbox row, commit failed), or a dead-letter send that failed (dead-letter topic
   * missing or forbidden, broker unreachable). It never counts as an attempt; the message runs
   * again (or its dead letter is sent again, without running the handler) after `delayMs`.
   * `source` says which: `'database'` (the consumer's database work) or `'dead-letter'` (the
   * dead-letter send).
   */
  'consumer:error': MessagePosition & { error: unknown; delayMs: number; source: 'database' | 'dead-letter' };
  /**
   * At start: a consumed topic keeps messages at least as long as the inbox keeps rows
   * (`topicRetentionMs` null: unlimited), so a redelivery of an old message (offset reset,
   * replay) may find its inbox row deleted and be applied again. Lower the topic's
   * `retention.ms` or raise `inboxRetentionMs`.
   */
  'consumer:retention-warning': { topic: string; topicRetentionMs: number | null; inboxRetentionMs: number };
  /**
   * A partition this member owns has messages to handle and made no progress (no message applied,
   * skipped or dead-lettered) for `stuckAfterMs`: its health at that moment (`waiting` says why
   * it waits, if it does). Logged at warn. Reported once, until `consumer:partition-recovered`.
   * A stuck partition is not a reason to restart the process: see README "Partition health".
   */
  'consumer:partition-stuck': PartitionHealth;
  /**
   * A stuck partition made progress again (`revoked: false`), or a rebalance took it from this
   * member while it was stuck (`revoked: true`; its new owner reports on it from then on).
   * `stuckForMs` is the time since it became stuck, in ms. Logged at warn, like the stuck event,
   * so that a log filtered at warn shows where each episode ends. Nothing is reported for the
   * partitions of a consumer that stops.
   */
  'consumer:partition-recovered': PartitionHealth & { stuckForMs: number; revoked: boolean };
  /** The Kafka group consumer crashed; `restart` tells whether its client (kafkajs, or the @platformatic/kafka adapter) restarts it. */
  'consumer:crash': { error: Error; restart: boolean };
}

/** A listener of one event. */
export type DedupConsumerListener<K extends keyof DedupConsumerEvents> = (payload: DedupConsumerEvents[K]) => void;

/**
 * A minimal typed emitter. A listener that throws is logged and ignored: a metrics callback must
 * never change what the consumer does with a message.
 */
export class TypedEmitter<Events extends object> {
  readonly #listeners = new Map<keyof Events, Set<(payload: never) => void>>();

  constructor(private readonly logger: Logger) {}

  /** Adds a listener; returns the function that removes it. */
  on<K extends keyof Events>(name: K, listener: (payload: Events[K]) => void): () => void {
    let set = this.#listeners.get(name);
    if (!set) this.#listeners.set(name, (set = new Set()));
    set.add(listener as (payload: never) => void);
    return () => {
      set.delete(listener as (payload: never) => void);
    };
  }

  emit<K extends keyof Events>(name: K, payload: Events[K]): void {
    for (const listener of this.#listeners.get(name) ?? []) {
      try {
        (listener as (payload: Events[K]) => void)(payload);
      } catch (err) {
        this.logger.warn({ event: String(name), err }, 'An event listener threw; ignored.');
      }
    }
  }
}
