/**
 * The dedup consumer (docs/guarantees.md, G4-G6): a Kafka group consumer whose
 * handler's effects happen once per (consumer group, event id). It talks to Kafka through
 * outboxkit's interfaces (src/kafka/types.ts: `GroupConsumer`, `KafkaProducer`, `KafkaAdmin`),
 * made from the `kafka` option by the kafkajs adapter or the @platformatic/kafka one
 * (src/kafka/platformatic/group-consumer.ts, which keeps the same offset rules with a fetch loop of
 * its own); what follows describes kafkajs's behaviour.
 *
 * For each message, in one PostgreSQL transaction: claim (group, event id) in the inbox with
 * `INSERT ... ON CONFLICT DO NOTHING`, run the handler with the same transaction only if the row
 * is new, commit. Only then is the message's offset resolved, and so committable. A message that
 * has no usable event id, or whose handler keeps failing, is produced to a dead-letter topic
 * first, and only then resolved. With `transactionScope: 'batch'` one transaction holds a run of
 * consecutive messages of a batch, each in a savepoint of its own; `'message'` is the same path
 * with runs of one message and no savepoint.
 *
 * Where the parts live: the transaction of each driver (claim, savepoints, handler, commit) in
 * inbox-transaction.ts, with inbox-transaction-pg.ts and inbox-transaction-drizzle.ts; the
 * statements in inbox-sql.ts and progress-sql.ts; the start-up checks in preflight.ts; where the
 * group begins on each topic (a topic's first start, partitions added later) in group-start.ts;
 * attempt counting, backoff and paused partitions in retry.ts. This file keeps start and stop, the
 * batch loop and the wiring.
 *
 * **The offset rule.** An offset is resolved only after its message was applied (transaction
 * committed), skipped as a duplicate (committed inbox row), or dead-lettered (broker acknowledged
 * the DLQ record). Messages of one partition are processed one at a time, in order, so a
 * committed offset never passes a message that is not done
 * (test/consumer/c12-slow-message-crash.test.ts).
 *
 * **Why batches.** The group consumer hands over one partition's batch at a time, of which the
 * consumer marks each offset itself (`markProcessed`), and tells when to stop a batch promptly on
 * stop or seek (`isActive()`): kafkajs's `eachBatch` with `eachBatchAutoResolve: false`, `isRunning()`
 * and `isStale()`. kafkajs's `eachMessage` resolves each message
 * as soon as the callback returns and offers no way to leave a message unresolved and move on
 * to other partitions while it waits for a retry.
 *
 * **Rebalances.** Between messages, `heartbeat()` throws once the group rebalances, and a timer
 * heartbeats during long handlers and aborts their `signal`; the batch then stops and kafkajs
 * commits the resolved offsets (still in the old generation, whose partitions this member owns)
 * and rejoins. kafkajs rejoins only after every batch callback has returned, so no offset of a
 * revoked partition is ever resolved into the new generation; a late commit of an old generation
 * is refused by the broker (ILLEGAL_GENERATION).
 *
 * **Why retries pause the partition instead of sleeping.** kafkajs fetches again only after every
 * batch of the previous fetch is done, so a handler sleeping between attempts would hold up every
 * partition (test/consumer/c13-poison-message.test.ts). A failed message leaves its offset
 * unresolved, its partition is paused for the backoff delay and then resumed, and kafkajs fetches
 * it again from the resolved offset. Other partitions go on meanwhile. Attempt counts live in
 * memory: after a rebalance or restart the new owner counts from 1 again.
 */
import type pg from 'pg';
import {
  joinTransaction,
  runTransaction,
  type DatabaseHandle,
  type TransactionHandle,
  type TransactionOf,
} from '../src/database.js';
import { withTimeout } from '../src/deadline.js';
import { LifecycleError } from '../src/errors.js';
import { crashPoint } from '../src/crash-point.js';
import { HandlerFailure } from './classify-error.js';
import { decodeHeaders, readEventId, toConsumedEvent, type ConsumedEvent } from './consumed-event.js';
import { DEAD_LETTER_REASON_INVALID_EVENT_ID, deadLetterMessage, reducedDeadLetter } from './dead-letter.js';
import { kafkaClientOf } from '../src/kafka/kafkajs/client.js';
import { firstFailure, isTooLarge } from '../src/kafka/outcomes.js';
import type {
  GroupConsumer,
  InboundBatch,
  InboundMessage,
  KafkaClient,
  KafkaFailure,
  KafkaProducer,
  ProducerMessage,
} from '../src/kafka/types.js';
import { HEADER_EVENT_TYPE } from '../src/outbox/event.js';
import { TypedEmitter, type DedupConsumerEvents, type DedupConsumerListener, type MessagePosition } from './events.js';
import type { InboxEntry } from './inbox-sql.js';
import {
  runInboxTransaction,
  type InboxClaim,
  type InboxTransaction,
  type InboxTransactionOptions,
} from './inbox-transaction.js';
import { drizzleInboxTransaction } from './inbox-transaction-drizzle.js';
import { pgPoolInboxTransaction } from './inbox-transaction-pg.js';
import { startKeepAlive, type KeepAlive } from './keep-alive.js';
import { trackPartitionHealth, type PartitionHealth, type PartitionHealthTracker } from './partition-health.js';
import { checkInbox, checkTopics } from './preflight.js';
import { planGroupStart, subscribePlan } from './group-start.js';
import pRetry from 'p-retry';
import {
  beginBatch,
  isProvenHandled,
  markDeadLettered,
  markWritten,
  newPartitionProgress,
  progressAfter,
  type PartitionProgress,
  type RecordIdentity,
} from './progress.js';
import { readProgress, type StoredProgress } from './progress-sql.js';
import { partitionKey, Retries, type PendingMessage } from './retry.js';
import { runHandler } from './tracing.js';
import {
  resolveDedupConsumerOptions,
  type DedupConsumerOptions,
  type ResolvedDedupConsumerOptions,
} from './options.js';

/** A running dedup consumer. */
export interface DedupConsumer {
  /** The consumer group. */
  readonly groupId: string;
  /** The consumed topics. */
  readonly topics: readonly string[];
  /**
   * Checks the inbox table and that every topic and dead-letter topic exists, warns (log and
   * `consumer:retention-warning`) about topics that keep messages at least as long as the inbox
   * keeps rows, commits the end offsets of a topic the group consumes for the first time (with
   * `fromBeginning: false`: group-start.ts), connects, subscribes and resolves once this member has
   * joined its group and consumes. Call once.
   *
   * @param signal - stops the consumer when aborted (like calling `stop()`).
   * @throws {@link TopicMissingError} naming the missing topics (nothing is created).
   * @throws {@link InboxUnavailableError} when the inbox table (or, with `recordProgress`, the
   *   `consumer_progress` table) is missing (`retriable: false`: apply the migrations), or
   *   PostgreSQL is down (`retriable: true`).
   * @throws {@link LifecycleError} when called twice, after `stop()`, or if stopped while starting.
   */
  start(signal?: AbortSignal): Promise<void>;
  /**
   * Stops consuming: aborts the handlers' signal, lets the message in flight of each partition
   * finish or roll back, commits the resolved offsets, leaves the group and disconnects.
   * Idempotent: every call returns the same promise.
   *
   * @param options.timeoutMs - how long to wait, in ms. @defaultValue 30_000
   * @throws {@link LifecycleError} when it did not finish within `timeoutMs` (a handler ignoring
   *   its abort signal, or a broker that does not answer). A handler still running then may yet
   *   commit its transaction (effects and inbox row) after the error; its message was not
   *   acknowledged, and the member that gets the partition next skips it as a duplicate.
   */
  stop(options?: { timeoutMs?: number }): Promise<void>;
  /**
   * Where the consumer stands. `'crashed'`: kafkajs stopped the consumer after an error it does
   * not retry (`consumer:crash` with `restart: false`, logged at error level): nothing is consumed
   * any more, and nothing will be until a new consumer starts. Let the process exit so that its
   * supervisor restarts it (as `examples/orders/shipping.ts` does), or `stop()` this one and start
   * a new one; readiness probes should fail in this state. Errors kafkajs retries (a broker outage)
   * never lead here: kafkajs restarts the consumer itself.
   */
  readonly state: DedupConsumerState;
  /**
   * The health of each topic-partition this member owns (see {@link DedupConsumerHealth}):
   * the last offset handled and when, why its next message waits, and whether it is stuck (it has
   * messages to handle and made no progress for `stuckAfterMs`). Partitions a rebalance took away
   * are not listed; after `stop()` none are. Cheap: no I/O, reads what the consumer keeps.
   */
  health(): DedupConsumerHealth;
  /** Listens to an event (see {@link DedupConsumerEvents}); returns the function that removes the listener. */
  on<K extends keyof DedupConsumerEvents>(name: K, listener: DedupConsumerListener<K>): () => void;
}

/**
 * Test-only crash point (see src/crash-point.ts): with `OUTBOXKIT_CRASH_POINT=consumer:after-commit`
 * (and optionally `OUTBOXKIT_CRASH_AFTER=N`), the process kills itself with SIGKILL after the Nth
 * handler transaction commits (applied or duplicate) and before its offset is resolved. Crash
 * tests use it; never set it in production.
 */
export const CRASH_POINT_AFTER_COMMIT = 'consumer:after-commit';

/** Default of `stop({ timeoutMs })`. */
const DEFAULT_STOP_TIMEOUT_MS = 30_000;
/** Finite producer retries: with idempotence kafkajs would otherwise retry (nearly) forever. */
const DLQ_PRODUCER_RETRIES = 5;
/** Subtransaction ids PostgreSQL caches per transaction (`PGPROC_MAX_CACHED_SUBXIDS`, src/include/storage/proc.h). */
const PG_CACHED_SUBXIDS = 64;

/** A message read for processing (see `#prepare`). */
type Prepared = DeadLetterPrepared | EventPrepared;
interface DeadLetterPrepared {
  kind: 'dead-letter';
  message: InboundMessage;
  position: MessagePosition;
  eventId: string | null;
  reason: string;
  attempts: number;
  error?: unknown;
}
interface EventPrepared {
  kind: 'event';
  message: InboundMessage;
  position: MessagePosition;
  event: ConsumedEvent;
  pending: PendingMessage;
  /** This run's attempt number, from 1. */
  attempt: number;
  /** Its inbox claim, with (`recordProgress`) the progress row its transaction writes when it is applied. */
  claim: InboxClaim;
}

type Step = { kind: 'done' } | { kind: 'interrupted' } | { kind: 'retry-later'; delayMs: number };

const DONE: Step = { kind: 'done' };
const INTERRUPTED: Step = { kind: 'interrupted' };

/** What {@link DedupConsumer.health} returns. Times are ms since the epoch. */
export interface DedupConsumerHealth {
  /** {@link DedupConsumer.state} */
  state: DedupConsumerState;
  /** When it was read. */
  at: number;
  /** The `stuckAfterMs` option, in ms. */
  stuckAfterMs: number;
  /** The partitions this member owns, by topic then partition (see consumer/partition-health.ts). */
  partitions: PartitionHealth[];
}

/** See {@link DedupConsumer.state}. */
export type DedupConsumerState = 'new' | 'starting' | 'running' | 'crashed' | 'stopping' | 'stopped';
type State = DedupConsumerState;

class DedupConsumerImpl<D extends DatabaseHandle> implements DedupConsumer {
  readonly groupId: string;
  readonly topics: readonly string[];
  readonly #o: ResolvedDedupConsumerOptions<D>;
  readonly #events: TypedEmitter<DedupConsumerEvents>;
  readonly #client: KafkaClient;
  readonly #consumer: GroupConsumer;
  readonly #producer: KafkaProducer;
  /** The transaction of the database's driver (inbox-transaction.ts), chosen here once. */
  readonly #inbox: InboxTransaction<TransactionOf<D>>;
  readonly #stopController = new AbortController();
  /** Attempts, backoff and paused partitions (retry.ts). */
  readonly #retries: Retries;
  /** `recordProgress`: what this process knows of each partition it consumes (see progress.ts). */
  readonly #progress = new Map<string, PartitionProgress>();
  /** Per-partition health (partition-health.ts), fed by this consumer's events and batches. */
  readonly #health: PartitionHealthTracker;
  #state: State = 'new';
  #startPromise: Promise<void> | undefined;
  #stopPromise: Promise<void> | undefined;
  #joined: { resolve(): void; reject(err: unknown): void } | undefined;

  constructor(options: DedupConsumerOptions<D>) {
    this.#o = resolveDedupConsumerOptions(options);
    this.groupId = this.#o.groupId;
    this.topics = Object.freeze([...this.#o.topics]);
    this.#events = new TypedEmitter(this.#o.logger);
    this.#inbox = inboxTransactionOf(this.#o);
    this.#retries = new Retries(this.#o);
    const { stuckAfterMs, logger } = this.#o;
    this.#health = trackPartitionHealth({ groupId: this.groupId, stuckAfterMs, logger, events: this.#events });
    if (this.#o.transactionScope === 'batch' && this.#o.batchMaxMessages > PG_CACHED_SUBXIDS) {
      this.#o.logger.warn(
        { groupId: this.groupId, batchMaxMessages: this.#o.batchMaxMessages },
        `batchMaxMessages is above ${PG_CACHED_SUBXIDS}: a transaction with more subtransactions than PostgreSQL caches ` +
          '(PGPROC_MAX_CACHED_SUBXIDS) slows down every session’s snapshots while it is open. Keep it at most 64.',
      );
    }
    const { kafka, groupId, sessionTimeoutMs, heartbeatIntervalMs, fetchMaxWaitMs, metadataMaxAgeMs } = this.#o;
    // One client for the group member, the dead-letter producer and the admin requests. kafkajs's
    // request-queue fix comes with its client (createKafkajsClient), not from here.
    this.#client = kafkaClientOf(kafka);
    // Topics are never auto-created: a typo in a topic name must fail start(), not create an empty topic.
    this.#consumer = this.#client.groupConsumer({
      groupId,
      sessionTimeoutMs,
      heartbeatIntervalMs,
      fetchMaxWaitMs,
      metadataMaxAgeMs,
    });
    // Idempotent, acks=all, one request in flight, Java-compatible murmur2 partitioner (as the
    // relay's): a retried DLQ send is never duplicated or reordered by the broker. The producer
    // also serialises sends (kafkajs sequence numbers break under concurrent sends on one
    // idempotent producer).
    this.#producer = this.#client.producer({ retries: DLQ_PRODUCER_RETRIES });
    this.#consumer.on('join', ({ assignment }) => this.#onJoin(assignment));
    this.#consumer.on('crash', ({ error, willRestart }) => this.#onCrash(error, willRestart));
  }

  on<K extends keyof DedupConsumerEvents>(name: K, listener: DedupConsumerListener<K>): () => void {
    return this.#events.on(name, listener);
  }

  get state(): DedupConsumerState {
    return this.#state;
  }

  health(): DedupConsumerHealth {
    const { at, partitions } = this.#health.snapshot();
    return { state: this.#state, at, stuckAfterMs: this.#o.stuckAfterMs, partitions };
  }

  async start(signal?: AbortSignal): Promise<void> {
    if (this.#state !== 'new') {
      const what =
        this.#state === 'starting' || this.#state === 'running' || this.#state === 'crashed'
          ? 'already started'
          : 'stopped';
      throw new LifecycleError(
        `The dedup consumer of group "${this.groupId}" was ${what}; create a new one to start again.`,
      );
    }
    this.#state = 'starting';
    if (signal?.aborted) {
      void this.stop();
    } else if (signal) {
      // The `signal` option removes this listener once the consumer stops, however it stops.
      const stopOnAbort = () => void this.stop().catch(() => {});
      signal.addEventListener('abort', stopOnAbort, { once: true, signal: this.#stopController.signal });
    }
    this.#startPromise = this.#start();
    try {
      await this.#startPromise;
      this.#state = 'running';
      this.#o.logger.info({ groupId: this.groupId, topics: this.#o.topics }, 'Dedup consumer started.');
    } catch (err) {
      // A failed start leaves nothing connected; stop() (if it raced) waits for this cleanup.
      if (this.#state === 'starting') {
        this.#state = 'stopped';
        await this.#disconnect();
      }
      throw err;
    }
  }

  stop(options: { timeoutMs?: number } = {}): Promise<void> {
    this.#stopPromise ??= this.#stop(options.timeoutMs ?? DEFAULT_STOP_TIMEOUT_MS);
    return this.#stopPromise;
  }

  // ------------------------------------------------------------------------------------------
  // Lifecycle
  // ------------------------------------------------------------------------------------------

  async #start(): Promise<void> {
    const { partitionsConsumedConcurrently, autoCommitIntervalMs } = this.#o;
    await checkInbox(this.#o);
    this.#throwIfStopping();
    // A cluster that cannot answer yet (a broker down, a partition without a leader, a leader
    // moving) is waited for with backoff, not thrown at the caller: a process that exits on it is
    // only restarted into the same outage (a crash loop). A missing topic, rejected credentials or
    // any other error the client does not retry still fails the start at once.
    await this.#untilKafkaAnswers('start-up checks', () => checkTopics(this.#client, this.#o, this.#events));
    this.#throwIfStopping();
    await this.#untilKafkaAnswers('producer connect', () => this.#producer.connect());
    // Where the group begins on each topic; a topic's first start commits its end offsets (group-start.ts).
    const plan = await this.#untilKafkaAnswers('start-up offsets', () => planGroupStart(this.#client, this.#o));
    this.#throwIfStopping();
    await this.#consumer.connect();
    await subscribePlan(this.#consumer, plan);
    this.#throwIfStopping();
    const joined = new Promise<void>((resolve, reject) => {
      this.#joined = { resolve, reject };
    });
    const onAbort = () => this.#joined?.reject(this.#stopController.signal.reason);
    this.#stopController.signal.addEventListener('abort', onAbort, { once: true });
    try {
      await this.#consumer.run({
        eachBatch: (batch) => this.#runBatch(batch),
        // Only marked offsets are committed: at this interval, at the end of each batch, before a
        // rebalance and on stop.
        autoCommitIntervalMs,
        concurrency: partitionsConsumedConcurrently,
      });
      await joined;
    } finally {
      this.#stopController.signal.removeEventListener('abort', onAbort);
      this.#joined = undefined;
    }
  }

  /**
   * `step`, retried while it fails with an error the Kafka client retries (broker unreachable, no
   * leader, leader moving): backoff with full jitter from `retryInitialMs` to `retryMaxMs`, until
   * it succeeds or the consumer stops (then a LifecycleError). Each failure is logged (warn).
   */
  async #untilKafkaAnswers<T>(what: string, step: () => Promise<T>): Promise<T> {
    const { retryInitialMs, retryMaxMs, logger } = this.#o;
    return pRetry(
      async () => {
        this.#throwIfStopping();
        return step();
      },
      {
        retries: Number.POSITIVE_INFINITY,
        minTimeout: retryInitialMs,
        maxTimeout: retryMaxMs,
        factor: 2,
        randomize: true,
        signal: this.#stopController.signal,
        shouldRetry: ({ error }) => !this.#stopController.signal.aborted && this.#client.isRetriable(error),
        onFailedAttempt: ({ error, attemptNumber }) => {
          if (this.#stopController.signal.aborted || !this.#client.isRetriable(error)) return;
          logger.warn(
            { groupId: this.groupId, err: error, attempt: attemptNumber },
            `Kafka did not answer the dedup consumer's ${what}; retrying with backoff.`,
          );
        },
      },
    ).catch((err: unknown) => {
      this.#throwIfStopping();
      throw err;
    });
  }

  #throwIfStopping(): void {
    if (this.#stopController.signal.aborted) {
      throw new LifecycleError(`The dedup consumer of group "${this.groupId}" was stopped while starting.`);
    }
  }

  async #stop(timeoutMs: number): Promise<void> {
    const previous = this.#state;
    this.#state = 'stopping';
    this.#stopController.abort(new LifecycleError(`The dedup consumer of group "${this.groupId}" is stopping.`));
    this.#retries.cancelResumes();
    if (previous === 'new' || previous === 'stopped') {
      this.#state = 'stopped';
      return;
    }
    const stopped = (async () => {
      await this.#startPromise?.catch(() => {});
      await this.#disconnect();
    })();
    try {
      await withTimeout(
        stopped,
        timeoutMs,
        () =>
          new LifecycleError(
            `The dedup consumer of group "${this.groupId}" did not stop within ${timeoutMs} ms: a handler ignores its ` +
              'abort signal, or the broker does not answer.',
          ),
        { unref: true },
      );
    } finally {
      this.#state = 'stopped';
      this.#retries.clear();
      this.#progress.clear();
      this.#health.clear();
    }
    this.#o.logger.info({ groupId: this.groupId }, 'Dedup consumer stopped.');
  }

  /** Consumer first: a batch still in flight may need the producer for its dead letters. */
  async #disconnect(): Promise<void> {
    for (const client of [this.#consumer, this.#producer]) {
      try {
        await client.disconnect();
      } catch (err) {
        this.#o.logger.warn(
          { groupId: this.groupId, err },
          'Disconnecting a Kafka client failed; it is dropped anyway.',
        );
      }
    }
  }

  #onJoin(assignment: Record<string, number[]>): void {
    // A new generation: the next batch of each partition reads its stored progress again.
    this.#progress.clear();
    // Forget the retry state of partitions this member no longer owns.
    this.#retries.keepOnly(assignment);
    // Partitions it no longer owns leave health(); new ones appear.
    this.#health.assigned(assignment);
    this.#o.logger.info({ groupId: this.groupId, assignment }, 'Dedup consumer joined its group.');
    this.#joined?.resolve();
  }

  #onCrash(error: Error, restart: boolean): void {
    this.#progress.clear();
    // Crashed for good while running: say so (state, log), so the process can exit and be restarted.
    if (!restart && this.#state === 'running') this.#state = 'crashed';
    this.#o.logger.error(
      { groupId: this.groupId, err: error, restart },
      restart
        ? 'Kafka consumer crashed; its client restarts it.'
        : 'Kafka consumer crashed and will not restart: nothing is consumed any more. Exit the process (or stop() ' +
            'this consumer and start a new one).',
    );
    this.#events.emit('consumer:crash', { error, restart });
    if (!restart) this.#joined?.reject(error);
  }

  // ------------------------------------------------------------------------------------------
  // Processing
  // ------------------------------------------------------------------------------------------

  /**
   * One fetched batch of one partition, in order: each message is skipped (proven handled by the
   * partition's progress), dead-lettered (no usable event id, or given up on), or run in a
   * transaction (see {@link #applyRun}) with the messages after it that may join (`transactionScope:
   * 'batch'`; one message in `'message'` scope). The batch ends early on stop, seek or
   * rebalance, and at a message that must wait for a retry (its partition paused).
   */
  async #runBatch(batch: InboundBatch): Promise<void> {
    const keepAlive = startKeepAlive(batch.heartbeat, this.#o.heartbeatIntervalMs, this.#consumer.isRebalance);
    // What the handlers of this batch see: aborted on stop() or when the partitions may go.
    const signal = AbortSignal.any([this.#stopController.signal, keepAlive.signal]);
    try {
      this.#health.fetched(batch);
      const partitionProgress = this.#o.recordProgress ? await this.#progressOf(batch) : undefined;
      let next = 0;
      while (next < batch.messages.length) {
        // Stop promptly: on stop(), or when a seek made the rest of this batch stale.
        if (this.#mustStop(batch)) return;
        // The group is rebalancing: leave the rest to whoever owns the partition next.
        keepAlive.throwIfLost();
        const message = batch.messages[next]!;
        let step: Step = DONE;
        let resolved = 1;
        if (isProvenHandled(partitionProgress, BigInt(message.offset))) {
          this.#skipHandled(batch.topic, batch.partition, message);
          batch.markProcessed(message.offset);
        } else {
          const first = this.#prepare(batch.topic, batch.partition, message, partitionProgress);
          if (first.kind === 'dead-letter') {
            // Nothing of an earlier transaction is left open: dead-letter it, then resolve it.
            step = await this.#deadLetter(first);
            if (step.kind === 'done') batch.markProcessed(message.offset);
          } else {
            ({ step, resolved } = await this.#applyRun(first, {
              batch,
              from: next,
              keepAlive,
              signal,
              partitionProgress,
            }));
          }
        }
        if (step.kind === 'interrupted') {
          keepAlive.throwIfLost();
          return;
        }
        if (step.kind === 'retry-later') {
          this.#retries.pauseFor(batch.pause, step.delayMs, (err) =>
            this.#o.logger.debug(
              { groupId: this.groupId, err },
              'Resuming a partition failed (consumer restarted); ignored.',
            ),
          );
          return;
        }
        // Applied, duplicate, dead-lettered or proven handled: resolved, so its offset may be committed.
        next += resolved;
        // Throws when the group rebalances; kafkajs then commits what is resolved and rejoins.
        await batch.heartbeat();
        await batch.commitIfDue();
      }
    } finally {
      keepAlive.stop();
    }
  }

  /**
   * `recordProgress`: what this process knows of the batch's partition (its stored progress,
   * read when this process gets the partition), and whether this batch trusts it (progress.ts).
   * A failed read of the stored row costs the optimisation, never a skip: the partition then
   * trusts nothing until it wrote a row itself.
   */
  async #progressOf(batch: InboundBatch): Promise<PartitionProgress | undefined> {
    const { messages } = batch;
    const first = messages[0];
    if (first === undefined) return undefined;
    const key = partitionKey(batch.topic, batch.partition);
    let progress = this.#progress.get(key);
    if (progress === undefined) {
      progress = newPartitionProgress(await this.#storedProgress(batch.topic, batch.partition));
      this.#progress.set(key, progress);
    }
    // The offset the fetch began at: every record from there to the first message is one there is
    // nothing to handle for (control, aborted, compacted).
    const raw: unknown = batch.fetchedOffset;
    const fetched = typeof raw === 'string' && /^[0-9]{1,19}$/.test(raw) ? BigInt(raw) : BigInt(first.offset);
    beginBatch(progress, fetched, (offset) => {
      const text = offset.toString();
      const message = messages.find((m) => m.offset === text);
      return message && identityOf(message, this.#o.eventIdHeader);
    });
    return progress;
  }

  /** The partition's stored progress row, or null (also when it cannot be read: logged). */
  async #storedProgress(topic: string, partition: number): Promise<StoredProgress | null> {
    const { database, schemaSql } = this.#o;
    try {
      return await runTransaction(database, (tx) =>
        readProgress(joinTransaction(tx as TransactionHandle, 'the dedup consumer'), {
          schemaSql,
          groupId: this.groupId,
          topic,
          partition,
        }),
      );
    } catch (err) {
      this.#o.logger.warn(
        { groupId: this.groupId, topic, partition, err },
        "Could not read the partition's recorded progress; its redelivered records go through the inbox.",
      );
      return null;
    }
  }

  /** A redelivered record that the partition's progress proves handled: skipped, no transaction. */
  #skipHandled(topic: string, partition: number, message: InboundMessage): void {
    const eventId = readEventId(decodeHeaders(message.headers), this.#o.eventIdHeader);
    this.#retries.forget({ topic, partition, offset: message.offset });
    this.#o.logger.debug(
      { groupId: this.groupId, topic, partition, offset: message.offset, eventId },
      'Redelivered record skipped: the recorded progress proves it handled.',
    );
    this.#events.emit('consumer:progress-skipped', { topic, partition, offset: message.offset, eventId });
  }

  /** On stop(), or when a seek made the rest of this batch stale. */
  #mustStop(batch: InboundBatch): boolean {
    return this.#stopController.signal.aborted || !batch.isActive();
  }

  /**
   * Reads what processing a message needs: its event id, retry state and inbox claim. A message
   * without a usable event id (never guess one: test/consumer/c16-missing-event-id.test.ts), or
   * one the consumer already gave up on, only needs dead-lettering.
   */
  #prepare(topic: string, partition: number, message: InboundMessage, partitionProgress?: PartitionProgress): Prepared {
    const position: MessagePosition = { topic, partition, offset: message.offset };
    const headers = decodeHeaders(message.headers);
    const eventId = readEventId(headers, this.#o.eventIdHeader);
    if (eventId === null) {
      return {
        kind: 'dead-letter',
        message,
        position,
        eventId,
        reason: DEAD_LETTER_REASON_INVALID_EVENT_ID,
        attempts: 0,
      };
    }
    const pending = this.#retries.pendingOf(position);
    if (pending.deadLetter) {
      return {
        kind: 'dead-letter',
        message,
        position,
        eventId,
        reason: pending.deadLetter.reason,
        attempts: pending.attempts,
        error: pending.deadLetter.error,
      };
    }
    const event = toConsumedEvent(topic, partition, message, eventId, headers);
    const progress =
      partitionProgress === undefined
        ? undefined
        : progressAfter(partitionProgress, {
            offset: BigInt(message.offset),
            eventId,
            timestamp: timestampOf(message),
          });
    const row = {
      groupId: this.groupId,
      eventId: event.id,
      topic: event.topic,
      partition: event.partition,
      offset: event.offset,
    };
    return {
      kind: 'event',
      message,
      position,
      event,
      pending,
      attempt: pending.attempts + 1,
      claim: { row, progress },
    };
  }

  /**
   * Runs `first` in one transaction, with the messages after it in the batch that may join
   * (`transactionScope: 'batch'`, see inbox-transaction.ts; one message in `'message'` scope).
   * A message joins unless the transaction holds `batchMaxMessages`, has been open for
   * `batchMaxMs`, the batch must stop (stop, seek, rebalance), or the message is proven handled or
   * only needs dead-lettering. After the COMMIT, in order: each message's after-commit hook,
   * bookkeeping and offset; then the failed message that ended the run, if any, is retried
   * (partition paused) or dead-lettered, after the messages before it committed.
   *
   * @returns the step that follows, and how many messages of the batch, from `first` on, were resolved.
   */
  async #applyRun(
    first: EventPrepared,
    {
      batch,
      from,
      keepAlive,
      signal,
      partitionProgress,
    }: {
      batch: InboundBatch;
      /** Where `first` is in the batch. */
      from: number;
      keepAlive: KeepAlive;
      signal: AbortSignal;
      partitionProgress: PartitionProgress | undefined;
    },
  ): Promise<{ step: Step; resolved: number }> {
    const { batchMaxMessages, batchMaxMs } = this.#o;
    const openedAt = performance.now();
    let taken = 1;
    /** The next message that may join the run, or null when the run ends here. */
    const takeNext = (): EventPrepared | null => {
      const message = batch.messages[from + taken];
      if (message === undefined || taken >= batchMaxMessages) return null;
      if (performance.now() - openedAt >= batchMaxMs) return null;
      if (this.#mustStop(batch) || keepAlive.signal.aborted) return null;
      // Proven handled: skipped by the batch loop, outside any transaction.
      if (isProvenHandled(partitionProgress, BigInt(message.offset))) return null;
      const next = this.#prepare(batch.topic, batch.partition, message, partitionProgress);
      if (next.kind !== 'event') return null;
      taken += 1;
      return next;
    };
    const run = await runInboxTransaction(this.#inbox, first, takeNext, (p, tx) =>
      this.#runHandler(tx, p.event, signal, p.attempt),
    );
    // Committed: the progress row the run wrote last, that of its last applied message (before any hook may fail).
    const lastApplied = run.done.findLast((d) => d.outcome === 'applied');
    if (lastApplied?.message.claim.progress) markWritten(partitionProgress, lastApplied.message.claim.progress);
    let resolved = 0;
    // Run the after-commit hook of each message and resolve it, in order.
    for (const done of run.done) {
      try {
        await this.#afterCommit(done.message.event, done.outcome);
      } catch (err) {
        return { step: await this.#failed(done.message, err, signal), resolved };
      }
      this.#succeeded(done.message, done.outcome, done.durationMs, done.firstApplied);
      batch.markProcessed(done.message.message.offset);
      resolved += 1;
    }
    if (!run.failure) return { step: DONE, resolved };
    const step = await this.#failed(run.failure.message, run.failure.error, signal);
    if (step.kind === 'done') {
      // Dead-lettered after the messages before it committed.
      batch.markProcessed(run.failure.message.message.offset);
      resolved += 1;
    }
    return { step, resolved };
  }

  /**
   * What follows a failed run of a message (rolled back), as retry.ts decides: interrupted (stop
   * or rebalance: not an attempt), retried later (partition paused for a backoff delay), deferred
   * (a `RetryLaterError` within `maxRetryLaterMs`: not an attempt) or dead-lettered (an
   * `InvalidMessageError`, or `maxAttempts` handler failures). Failures of the consumer's own
   * database connection and statements are retried, never dead-lettered.
   */
  async #failed(prepared: EventPrepared, err: unknown, signal: AbortSignal): Promise<Step> {
    const { logger, maxRetryLaterMs } = this.#o;
    const { message, position, event, pending, attempt } = prepared;
    const fields = { groupId: this.groupId, ...position, eventId: event.id, attempt };
    const decision = this.#retries.afterFailure(position, pending, {
      attempt,
      error: err,
      aborted: signal.aborted,
      value: message.value,
    });
    if ((decision.kind === 'retry' || decision.kind === 'dead-letter') && decision.retryLater) {
      const { deferrals, deferredMs } = decision.retryLater;
      logger.warn(
        { ...fields, err: decision.error, deferrals, deferredMs, maxRetryLaterMs },
        'RetryLaterError after maxRetryLaterMs of deferrals: it counts as an attempt now (dead-lettered after maxAttempts).',
      );
      this.#events.emit('consumer:retry-later', {
        event,
        attempt,
        delayMs: 0,
        deferrals,
        deferredMs,
        counted: true,
        error: decision.error,
      });
    }
    switch (decision.kind) {
      case 'interrupted':
        // Stopping or losing the partition: rolled back, not an attempt; it runs again later.
        logger.debug({ ...fields, err }, 'Handler interrupted; the event will run again.');
        return INTERRUPTED;
      case 'dead-letter': {
        const { reason, error } = decision;
        return this.#deadLetter({
          kind: 'dead-letter',
          message,
          position,
          eventId: event.id,
          reason,
          attempts: attempt,
          error,
        });
      }
      case 'retry': {
        const { delayMs, error } = decision;
        logger.warn({ ...fields, err: error, delayMs }, 'Handler failed; rolled back, retrying later.');
        this.#events.emit('consumer:retry', { event, attempt, delayMs, error });
        return { kind: 'retry-later', delayMs };
      }
      case 'deferred': {
        const { delayMs, error } = decision;
        const { deferrals, deferredMs } = decision.retryLater;
        logger.warn(
          { ...fields, err: error, delayMs, deferrals, deferredMs, maxRetryLaterMs },
          'Handler asked to retry later (RetryLaterError); rolled back, not counted as an attempt.',
        );
        this.#events.emit('consumer:retry-later', {
          event,
          attempt,
          delayMs,
          deferrals,
          deferredMs,
          counted: false,
          error,
        });
        return { kind: 'retry-later', delayMs };
      }
      case 'error':
        return this.#errorStep(
          position,
          'database',
          { ...fields, err: decision.error, delayMs: decision.delayMs },
          'Processing failed outside the handler (database); retrying later.',
        );
    }
  }

  /**
   * A failure that is not the message's (database, dead-letter send): the partition waits
   * `fields.delayMs` and the message goes again. Logged at error and emitted as `consumer:error`.
   */
  #errorStep(
    position: MessagePosition,
    source: 'database' | 'dead-letter',
    fields: Record<string, unknown> & { err: unknown; delayMs: number },
    message: string,
  ): Step {
    this.#o.logger.error(fields, message);
    this.#events.emit('consumer:error', { ...position, error: fields.err, delayMs: fields.delayMs, source });
    return { kind: 'retry-later', delayMs: fields.delayMs };
  }

  /**
   * Bookkeeping of a committed message (applied, or skipped as a duplicate of the inbox row
   * `firstApplied`). A duplicate of another message than the one applied is said at warn: it may
   * be a different event reusing the id, which this group never applies (docs/events.md).
   */
  #succeeded(
    prepared: EventPrepared,
    outcome: 'applied' | 'duplicate',
    durationMs: number,
    firstApplied: InboxEntry | null = null,
  ): void {
    const { position, event, attempt } = prepared;
    this.#retries.resolved(position);
    if (outcome === 'applied') {
      this.#o.logger.debug(
        { groupId: this.groupId, ...position, eventId: event.id, attempt, durationMs },
        'Event applied.',
      );
      this.#events.emit('consumer:applied', { event, attempt, durationMs });
    } else {
      const elsewhere =
        firstApplied !== null &&
        (firstApplied.topic !== position.topic ||
          firstApplied.partition !== position.partition ||
          firstApplied.offset !== position.offset);
      const fields = { groupId: this.groupId, ...position, eventId: event.id, attempt };
      if (elsewhere) {
        this.#o.logger.warn(
          { ...fields, firstApplied },
          'Duplicate event id in another message than the one applied: skipped. A relay republish of the same ' +
            'event is harmless; a different event reusing this id is never applied by this group (docs/events.md, Event ids).',
        );
      } else {
        this.#o.logger.debug(fields, 'Duplicate event skipped.');
      }
      this.#events.emit('consumer:duplicate', { event, firstApplied, elsewhere });
    }
  }

  /** Runs the application's handler; what it throws comes out wrapped in a {@link HandlerFailure}. */
  async #runHandler(tx: TransactionOf<D>, event: ConsumedEvent, signal: AbortSignal, attempt: number): Promise<void> {
    try {
      await runHandler(this.#o.handler, { tx, event, signal, attempt }, this.#o); // decode hook, tracing span
    } catch (err) {
      throw new HandlerFailure(err);
    }
  }

  /** After a message's transaction committed: the test-only hook, then the test-only crash point. */
  async #afterCommit(event: ConsumedEvent, outcome: 'applied' | 'duplicate'): Promise<void> {
    await this.#o.hooks.afterCommit?.(event, outcome);
    // Test-only (OUTBOXKIT_CRASH_POINT=consumer:after-commit): SIGKILL between the committed
    // transaction and the offset, the window in which Kafka redelivers an applied event.
    await crashPoint(CRASH_POINT_AFTER_COMMIT);
  }

  /**
   * Produces the message to its dead-letter topic and waits for the broker's acknowledgement.
   *
   * A dead letter the broker refuses as too large (the original plus the `dlq-*` headers is over
   * the dead-letter topic's `max.message.bytes`) is sent again without its value and other
   * headers ({@link reducedDeadLetter}): its reason, attempts and original position stay visible,
   * and the partition moves on. Any other failure (broker unreachable, dead-letter topic deleted
   * or forbidden) pauses the partition for a backoff and tries again, the offset unresolved and
   * the handler not run again; the consumer never crashes on it (kafkajs would not restart a
   * consumer whose batch threw a non-retriable error, and a restarted process would meet the
   * same message again: a crash loop).
   *
   * @returns DONE once the dead letter is acknowledged, else a `retry-later` step.
   */
  async #deadLetter(prepared: DeadLetterPrepared): Promise<Step> {
    const { message, position, eventId, reason, attempts, error } = prepared;
    const deadLetterTopic = this.#o.deadLetterTopics.get(position.topic);
    if (deadLetterTopic === undefined)
      throw new LifecycleError(`No dead-letter topic for ${position.topic} (not a consumed topic).`);
    const fields = { groupId: this.groupId, ...position, eventId, deadLetterTopic };
    const record = deadLetterMessage(message, {
      reason,
      topic: position.topic,
      partition: position.partition,
      attempts,
      groupId: this.groupId,
      failedAt: new Date(),
    });
    let omitted = false;
    try {
      let failure = await this.#send(deadLetterTopic, record);
      if (failure && isTooLarge(failure)) {
        this.#o.logger.warn(
          { ...fields, err: failure.error },
          'The dead letter is larger than its topic accepts; sending it without its value (dlq-omitted).',
        );
        failure = await this.#send(
          deadLetterTopic,
          reducedDeadLetter(record, [this.#o.eventIdHeader, HEADER_EVENT_TYPE]),
        );
        omitted = true;
      }
      if (failure) throw failure.error;
    } catch (err) {
      return this.#errorStep(
        position,
        'dead-letter',
        { ...fields, err, delayMs: this.#retries.afterError(this.#retries.pendingOf(position)) },
        'Dead-letter send failed; the partition waits and tries again (offset unresolved, handler not run again).',
      );
    }
    this.#retries.forget(position);
    // Never inside a progress range: rewinding the offsets re-drives it, as without progress.
    markDeadLettered(this.#progress.get(partitionKey(position.topic, position.partition)), BigInt(position.offset));
    this.#o.logger.error({ ...fields, reason, attempts, omitted }, 'Message dead-lettered.');
    this.#events.emit('consumer:dead-lettered', { ...position, eventId, deadLetterTopic, reason, attempts, error });
    return DONE;
  }

  /**
   * Sends one record and says why it was not written, if it was not. The producer sends one at a
   * time; a refused send of one record (a dead letter is one) leaves it usable: kafkajs gives back
   * the sequence numbers of a produce request that failed.
   */
  async #send(topic: string, message: ProducerMessage): Promise<KafkaFailure | undefined> {
    return firstFailure(await this.#producer.send([{ ...message, topic }]));
  }
}

/**
 * The inbox transaction of the database's driver, chosen once: inbox-transaction-pg.ts for a
 * `pg.Pool`, inbox-transaction-drizzle.ts for a drizzle database. With savepoints (one per
 * message) in `transactionScope: 'batch'`.
 */
function inboxTransactionOf<D extends DatabaseHandle>(
  o: ResolvedDedupConsumerOptions<D>,
): InboxTransaction<TransactionOf<D>> {
  const options: InboxTransactionOptions = {
    schemaSql: o.schemaSql,
    lockTimeoutMs: o.lockTimeoutMs,
    savepoints: o.transactionScope === 'batch',
  };
  const inbox = isPgPool(o.database)
    ? pgPoolInboxTransaction(o.database, options)
    : drizzleInboxTransaction(o.database, options);
  return inbox as unknown as InboxTransaction<TransactionOf<D>>;
}

/** A `pg.Pool` (or a pool shaped like it), as opposed to a drizzle database. */
function isPgPool(database: unknown): database is pg.Pool {
  return (
    typeof database === 'object' &&
    database !== null &&
    'totalCount' in database &&
    typeof (database as { connect?: unknown }).connect === 'function'
  );
}

/** A message's Kafka timestamp, in ms since the epoch (-1 when the record has none). */
function timestampOf(message: InboundMessage): bigint {
  return /^-?[0-9]{1,19}$/.test(message.timestamp) ? BigInt(message.timestamp) : -1n;
}

/** What the progress anchor compares of a record. */
function identityOf(message: InboundMessage, eventIdHeader: string): RecordIdentity {
  return {
    offset: BigInt(message.offset),
    eventId: readEventId(decodeHeaders(message.headers), eventIdHeader),
    timestamp: timestampOf(message),
  };
}

/**
 * Creates a dedup consumer; nothing connects until `start()`.
 *
 * @example
 * ```ts
 * const consumer = createDedupConsumer({
 *   kafka, groupId: 'shipping', topics: ['orders'], database: pool,
 *   handler: async ({ tx, event }) => {
 *     await tx.query('INSERT INTO shipments (order_id) VALUES ($1)', [event.json<{ id: string }>().id]);
 *   },
 * });
 * await consumer.start();
 * process.once('SIGTERM', () => void consumer.stop());
 * ```
 * @throws {@link InvalidOptionsError} when an option is invalid (see {@link DedupConsumerOptions}).
 */
export function createDedupConsumer<D extends DatabaseHandle>(options: DedupConsumerOptions<D>): DedupConsumer {
  return new DedupConsumerImpl(options);
}
