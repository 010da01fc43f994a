/**
 * The relay: publishes committed outbox events to Kafka, at least once, in per-key order.
 *
 * How the work is divided: every event belongs to one of 64 lanes (by a hash of its key). A relay
 * holds a fair share of the lanes through leases kept in `relay_lanes` (database clock), each with
 * a fencing token that grows on every takeover. Only the holder of a lane publishes its events, so
 * each key has one active publisher; a relay that dies loses its lanes when its lease expires
 * (`leaseMs`), and the others take them over. A paused relay that wakes after losing a lane may
 * still send what it had read (a late duplicate), but it can no longer mark rows: the mark checks
 * the fencing token.
 *
 * The relay needs a session-mode connection (a direct PostgreSQL connection, or PgBouncer in
 * session mode): LISTEN does not work through a transaction-pooling proxy.
 */
import { EventEmitter } from 'node:events';
import { hostname } from 'node:os';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { Queryable } from '../src/database.js';
import {
  BrokerUnavailableError,
  InvalidOptionsError,
  LifecycleError,
  TopicMissingError,
  refuseUnknownOptions,
  schemaMissingOr,
} from '../src/errors.js';
import { noopLogger, type Logger } from '../src/logger.js';
import { DEFAULT_SCHEMA, OUTBOX_LANES } from '../src/constants.js';
import { quoteSchema } from '../src/schema-name.js';
import { HEADER_EVENT_ID, HEADER_EVENT_TYPE } from '../src/outbox/event.js';
import { notifyChannel } from '../src/schema-name.js';
import { fullJitterBackoffMs } from '../src/backoff.js';
import { crashPoint } from '../src/crash-point.js';
import { readTopicLimits, splitByTopicLimit } from '../src/kafka/topic-limits.js';
import { createKafkajsClient, kafkaClientOf, type Kafka } from '../src/kafka/kafkajs/client.js';
import { fromRelayProducer, RELAY_PRODUCER_RETRY, type RelayProducer } from '../src/kafka/kafkajs/producer.js';
import { firstFailure, throwIfFailed } from '../src/kafka/outcomes.js';
import type { KafkaClient, KafkaFailure, KafkaProducer, OutboundRecord, ProducerSettings } from '../src/kafka/types.js';
import { MarkQueue, type MarkBatch } from './mark-queue.js';
import * as sql from './sql.js';

/** Options of {@link Relay}. */
export interface RelayOptions {
  /** PostgreSQL connection string (session mode). Required unless `pool` is given. */
  connectionString?: string;
  /** A pool to use instead of `connectionString`; outboxkit does not end it. */
  pool?: pg.Pool;
  /** Kafka brokers, `host:port`. Required unless `kafka` or `producer` is given. */
  brokers?: string[];
  /**
   * A Kafka client to use instead of `brokers`: a kafkajs `Kafka` instance (made into a
   * {@link KafkaClient} by `createKafkajsClient`), or a `KafkaClient` of outboxkit/kafka.
   */
  kafka?: Kafka | KafkaClient;
  /**
   * A producer to use instead of the client's (tests, other clients). Its `send` rejects when a
   * record was not acknowledged; the rejection is read as kafkajs's (a record's fault or the
   * broker's, by its error type).
   */
  producer?: RelayProducer;
  /** Tunable settings of the producer (compression, timeouts, retries); never its safety settings. */
  producerOptions?: Pick<ProducerSettings, 'requestTimeoutMs' | 'retries' | 'compression'>;
  /** Schema holding outboxkit's tables. @defaultValue 'outboxkit' */
  schema?: string;
  /** This instance's id, shown in `outboxkit status`. @defaultValue `<hostname>-<pid>-<random>` */
  relayId?: string;
  /** Most rows read and published in one pass. @defaultValue 500 */
  batchSize?: number;
  /**
   * Most payload bytes read in one pass (the first row always comes). Keep it below the topic's
   * `max.message.bytes`: kafkajs puts one partition's messages in one record batch. @defaultValue 900_000
   */
  maxBatchBytes?: number;
  /** Poll interval when no notification arrives, in ms. @defaultValue 1_000 */
  pollIntervalMs?: number;
  /** Wake on NOTIFY from writers (LISTEN on a dedicated connection). @defaultValue true */
  listen?: boolean;
  /** Lane lease length, in ms: how long a dead relay's lanes stay blocked. @defaultValue 10_000 */
  leaseMs?: number;
  /**
   * Longest wait for Kafka, in ms: for a send's acknowledgement (kafkajs' own retries included), a
   * producer's connect, and the probe of an idle relay (every third of a lease). Past it the broker
   * counts as unreachable: the send fails with {@link BrokerUnavailableError} (its rows stay
   * pending and go again: at least once), `producerConnected` and readiness turn false, the relay
   * backs off and, after `leaseMs` of failing, stands down. Keep it below `leaseMs`, and above the
   * slowest acknowledgement of a healthy cluster (acks=all). @defaultValue 5_000
   */
  brokerTimeoutMs?: number;
  /** Backoff after a failed pass: first delay and cap, in ms (full jitter). @defaultValue 200, 10_000 */
  retryInitialMs?: number;
  retryMaxMs?: number;
  /** Check at start that the topics of pending events exist. @defaultValue true */
  verifyTopics?: boolean;
  /**
   * Publish attempts of one event that failed for a reason of its own (too large, topic missing)
   * before it is parked; a broker outage never counts. @defaultValue 5
   */
  maxAttempts?: number;
  /**
   * Strict per-key order: while an event is in backoff or parked, the later events of its key
   * wait behind it. `false` lets them go ahead (the parked event is then out of order if it is
   * retried later). Events of other keys flow either way. @defaultValue true
   */
  holdKeyBehindFailure?: boolean;
  /**
   * How long published rows are kept before deletion, in ms. Never less than 65 min in effect
   * (`EVENT_ID_REUSE_WINDOW_MS`): a published row refuses a reused explicit event id for as long
   * as the writer would accept that id (docs/events.md, Event ids). @defaultValue 86_400_000 (24 h)
   */
  publishedRetentionMs?: number;
  /** Interval of the retention cleanup, in ms (run by the holder of lane 0). @defaultValue 60_000 */
  cleanupIntervalMs?: number;
  /** Most rows deleted by one cleanup statement. @defaultValue 1_000 */
  cleanupBatchSize?: number;
  /** Logger. @defaultValue no-op */
  logger?: Logger;
}

/** Resolved relay options. */
export type ResolvedRelayOptions = Required<
  Pick<
    RelayOptions,
    | 'schema'
    | 'relayId'
    | 'batchSize'
    | 'maxBatchBytes'
    | 'pollIntervalMs'
    | 'listen'
    | 'leaseMs'
    | 'brokerTimeoutMs'
    | 'retryInitialMs'
    | 'retryMaxMs'
    | 'verifyTopics'
    | 'maxAttempts'
    | 'holdKeyBehindFailure'
    | 'publishedRetentionMs'
    | 'cleanupIntervalMs'
    | 'cleanupBatchSize'
  >
>;

/** Defaults of {@link RelayOptions}. */
export const RELAY_DEFAULTS = Object.freeze({
  schema: DEFAULT_SCHEMA,
  batchSize: 500,
  maxBatchBytes: 900_000,
  pollIntervalMs: 1_000,
  listen: true,
  leaseMs: 10_000,
  brokerTimeoutMs: 5_000,
  retryInitialMs: 200,
  retryMaxMs: 10_000,
  verifyTopics: true,
  maxAttempts: 5,
  holdKeyBehindFailure: true,
  publishedRetentionMs: 86_400_000,
  cleanupIntervalMs: 60_000,
  cleanupBatchSize: 1_000,
});

/** Every option name of {@link RelayOptions}; the compiler keeps it in step with the interface. */
const RELAY_OPTION_NAMES: readonly string[] = Object.keys({
  connectionString: true,
  pool: true,
  brokers: true,
  kafka: true,
  producer: true,
  producerOptions: true,
  schema: true,
  relayId: true,
  batchSize: true,
  maxBatchBytes: true,
  pollIntervalMs: true,
  listen: true,
  leaseMs: true,
  brokerTimeoutMs: true,
  retryInitialMs: true,
  retryMaxMs: true,
  verifyTopics: true,
  maxAttempts: true,
  holdKeyBehindFailure: true,
  publishedRetentionMs: true,
  cleanupIntervalMs: true,
  cleanupBatchSize: true,
  logger: true,
} satisfies Record<keyof RelayOptions, true>);

/** The option names of `RelayOptions.producerOptions`; the compiler keeps it in step with the type. */
const RELAY_PRODUCER_OPTION_NAMES: readonly string[] = Object.keys({
  requestTimeoutMs: true,
  retries: true,
  compression: true,
} satisfies Record<keyof NonNullable<RelayOptions['producerOptions']>, true>);

function positiveInt(name: string, value: number, min = 1): void {
  if (!Number.isInteger(value) || value < min)
    throw new InvalidOptionsError(`${name} must be an integer ≥ ${min}, got ${value}.`);
}

/**
 * Validates relay options once (`new Relay()` and `createRelay()` call it before connecting).
 *
 * @throws {@link InvalidOptionsError} naming the unknown option names, if any (of the options or of
 *   `producerOptions`, listing the known ones), else the first invalid option.
 */
export function resolveRelayOptions(options: RelayOptions): ResolvedRelayOptions {
  if (typeof options !== 'object' || options === null)
    throw new InvalidOptionsError('The relay needs an options object.');
  refuseUnknownOptions(options, RELAY_OPTION_NAMES, 'createRelay');
  if (options.producerOptions !== undefined) {
    if (typeof options.producerOptions !== 'object' || options.producerOptions === null) {
      throw new InvalidOptionsError('producerOptions must be an object.');
    }
    refuseUnknownOptions(options.producerOptions, RELAY_PRODUCER_OPTION_NAMES, 'createRelay producerOptions');
  }
  const r = {
    ...RELAY_DEFAULTS,
    relayId: options.relayId ?? `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`,
    ...Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)),
  } as ResolvedRelayOptions;
  quoteSchema(r.schema);
  positiveInt('batchSize', r.batchSize);
  positiveInt('maxBatchBytes', r.maxBatchBytes);
  positiveInt('pollIntervalMs', r.pollIntervalMs, 10);
  positiveInt('leaseMs', r.leaseMs, 1_000);
  positiveInt('brokerTimeoutMs', r.brokerTimeoutMs, 100);
  positiveInt('retryInitialMs', r.retryInitialMs);
  positiveInt('retryMaxMs', r.retryMaxMs);
  positiveInt('maxAttempts', r.maxAttempts);
  if (r.retryMaxMs < r.retryInitialMs) {
    throw new InvalidOptionsError(
      `retryMaxMs (${r.retryMaxMs}) must be at least retryInitialMs (${r.retryInitialMs}).`,
    );
  }
  for (const name of ['listen', 'verifyTopics', 'holdKeyBehindFailure'] as const) {
    if (typeof r[name] !== 'boolean')
      throw new InvalidOptionsError(`${name} must be true or false, got ${JSON.stringify(r[name])}.`);
  }
  positiveInt('publishedRetentionMs', r.publishedRetentionMs, 0);
  positiveInt('cleanupIntervalMs', r.cleanupIntervalMs, 100);
  positiveInt('cleanupBatchSize', r.cleanupBatchSize);
  if (!options.pool && !options.connectionString)
    throw new InvalidOptionsError('The relay needs `connectionString` or `pool`.');
  if (!options.producer && !options.kafka && !(options.brokers && options.brokers.length > 0)) {
    throw new InvalidOptionsError('The relay needs `brokers`, `kafka` or `producer`.');
  }
  return r;
}

/** Events a relay emits (a typed map, `area:action` names). */
export interface RelayEvents {
  'relay:published': [{ count: number; marked: number; lanes: number }];
  'relay:failed': [{ eventId: string; attempts: number; parked: boolean; error: string }];
  'relay:cleaned': [{ deleted: number }];
  'relay:topics-missing': [{ topics: string[]; error: TopicMissingError }];
  'relay:error': [{ error: Error; attempt: number }];
  'relay:lanes': [{ held: number[] }];
  /** One send to Kafka finished (acknowledged when `ok`), with its duration in ms. */
  'relay:sent': [{ records: number; durationMs: number; ok: boolean }];
  /** The relay could not publish for longer than a lease: it released its lanes until its producer connects again. */
  'relay:standing-down': [{ failingMs: number }];
}

interface LaneLease extends sql.HeldLane {
  /** performance.now() until which this process may act on the lane. */
  validUntil: number;
}

/**
 * A relay instance. `start()` runs it in the background; `stop()` drains the pass in flight,
 * releases its lanes for the other relays and disconnects.
 */
export class Relay extends EventEmitter<RelayEvents> {
  readonly options: ResolvedRelayOptions;
  private readonly q: string;
  private readonly pool: pg.Pool;
  private readonly ownsPool: boolean;
  private readonly db: Queryable;
  private readonly logger: Logger;
  private readonly makeProducer: () => KafkaProducer;
  private producer: KafkaProducer | undefined;
  private readonly held = new Map<number, LaneLease>();
  private listener: pg.Client | undefined;
  private wake: (() => void) | undefined;
  private woken = false;
  private loopDone: Promise<void> | undefined;
  private maintainTimer: NodeJS.Timeout | undefined;
  private cleanupTimer: NodeJS.Timeout | undefined;
  private maintaining: Promise<void> = Promise.resolve();
  private cleaning: Promise<void> | undefined;
  private stopping = false;
  private stopped: Promise<void> | undefined;
  private started = false;

  /**
   * @throws {@link InvalidOptionsError} on an unknown option name or an invalid option (see
   *   {@link resolveRelayOptions}); nothing is connected then.
   */
  constructor(options: RelayOptions) {
    super();
    this.options = resolveRelayOptions(options);
    this.q = quoteSchema(this.options.schema);
    this.logger = options.logger ?? noopLogger;
    this.ownsPool = !options.pool;
    this.pool =
      options.pool ??
      new pg.Pool({
        connectionString: options.connectionString,
        max: 3,
        keepAlive: true,
        application_name: 'outboxkit-relay',
      });
    this.pool.on('error', (err) => this.logger.warn({ err }, 'idle PostgreSQL connection failed'));
    this.db = {
      query: async <R>(text: string, values?: readonly unknown[], options?: { name?: string }) => {
        const r = await this.pool.query({ text, values: values as unknown[], name: options?.name });
        return { rows: r.rows as R[], rowCount: r.rowCount ?? r.rows.length };
      },
    };
    // kafkajs's request-queue fix comes with the client (createKafkajsClient), not from here.
    const client = options.kafka
      ? kafkaClientOf(options.kafka)
      : options.brokers
        ? createKafkajsClient({ clientId: 'outboxkit-relay', brokers: options.brokers }, { logLevel: 'warn' })
        : undefined;
    const producer = options.producer;
    this.makeProducer = producer
      ? () => fromRelayProducer(producer, client)
      : () =>
          client!.producer({
            ...options.producerOptions,
            ...RELAY_PRODUCER_RETRY,
            onSend: (sent) => this.emit('relay:sent', sent),
          });
    this.client = client;
  }

  private readonly client: KafkaClient | undefined;

  /** This instance's id. */
  get relayId(): string {
    return this.options.relayId;
  }

  /**
   * Whether the relay runs with a connected Kafka producer: false before start, once stopping, and
   * from a failed (or unanswered, see `brokerTimeoutMs`) send, connect or idle probe until a new
   * producer connects.
   */
  get producerConnected(): boolean {
    return this.started && !this.stopping && this.producer !== undefined;
  }

  /** The lanes this relay currently holds. */
  heldLanes(): number[] {
    return [...this.held.keys()].sort((a, b) => a - b);
  }

  /**
   * Starts the relay: verifies topics, takes lanes, and publishes in the background until
   * `stop()` or `signal` aborts.
   *
   * @throws {@link TopicMissingError} when a topic of a pending event does not exist.
   * @throws {@link LifecycleError} when called twice.
   */
  async start(signal?: AbortSignal): Promise<void> {
    if (this.started || this.stopped) {
      throw new LifecycleError(
        this.stopped ? 'Relay.start() after stop(): create a new Relay instead.' : 'Relay.start() was called twice.',
      );
    }
    this.started = true;
    try {
      await sql.seedLanes(this.db, this.q);
    } catch (err) {
      throw schemaMissingOr(err, this.options.schema);
    }
    // The broker may be down at start: the relay starts anyway and its loop backs off until the
    // broker answers (a daemon that exits would only be restarted into the same outage).
    if (this.options.verifyTopics && this.client) {
      await withDeadline(this.verifyTopics(this.client), this.options.brokerTimeoutMs, 'the topic check').catch(
        (err: Error) => this.logger.warn({ err }, 'could not check the topics of pending events at start'),
      );
    }
    // Kept only once connected: `producerConnected` (readiness) must not count a connect in flight.
    await this.awaitProducer();
    if (!this.producer) this.logger.warn({}, 'Kafka producer could not connect at start; retrying with backoff');
    if (this.options.listen) await this.startListener();
    await this.maintainLanes();
    this.maintainTimer = setInterval(() => this.maintainSoon(), this.maintainEveryMs);
    this.maintainTimer.unref();
    // Its own chain: a long cleanup must never delay the lease renewals above.
    this.cleanupTimer = setInterval(() => {
      if (this.cleaning) return;
      this.cleaning = this.cleanup()
        .catch((err: Error) => this.logger.warn({ err }, 'published-row cleanup failed'))
        .finally(() => (this.cleaning = undefined));
    }, this.options.cleanupIntervalMs);
    this.cleanupTimer.unref();
    signal?.addEventListener('abort', () => void this.stop(), { once: true });
    this.loopDone = this.loop();
    this.logger.info({ relayId: this.relayId, lanes: this.heldLanes().length }, 'relay started');
  }

  /**
   * Stops the relay: finishes the pass in flight (its rows are marked or left pending), releases
   * its lanes, and disconnects. Idempotent: later calls return the same promise.
   *
   * @param options.timeoutMs - how long to wait for the pass in flight, in ms. @defaultValue 30_000
   */
  stop(options: { timeoutMs?: number } = {}): Promise<void> {
    this.stopped ??= this.doStop(options.timeoutMs ?? 30_000);
    return this.stopped;
  }

  private async doStop(timeoutMs: number): Promise<void> {
    this.stopping = true;
    this.wakeUp();
    this.cancelSleep?.();
    clearInterval(this.maintainTimer);
    clearInterval(this.cleanupTimer);
    clearTimeout(this.standDownTimer);
    if (this.loopDone) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([this.loopDone, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
      clearTimeout(timer);
    }
    await this.maintaining;
    await this.cleaning;
    await this.readAhead?.rows;
    this.readAhead = undefined;
    await this.marks.settle().catch(() => undefined);
    try {
      await sql.releaseLanes(this.db, this.q, this.relayId, this.heldLanes());
      await sql.deregisterInstance(this.db, this.q, this.relayId);
    } catch (err) {
      this.logger.warn({ err }, 'could not release lanes at stop; they free up when the lease expires');
    }
    this.held.clear();
    await this.listener?.end().catch(() => undefined);
    const producer = this.producer;
    this.producer = undefined;
    await this.disconnectQuietly(producer);
    if (this.ownsPool) await this.pool.end();
    this.logger.info({ relayId: this.relayId }, 'relay stopped');
  }

  /**
   * Names, at start, the topics that pending (not parked) events wait for but that do not exist.
   * It does not stop the relay: one event for a missing topic must not hold back every other
   * topic. Such events fail with UNKNOWN_TOPIC_OR_PARTITION, are retried with backoff and parked
   * after `maxAttempts`, visible through `outboxkit parked list`.
   */
  private async verifyTopics(client: KafkaClient): Promise<void> {
    const { rows } = await this.db.query<{ topic: string }>(
      `SELECT DISTINCT topic FROM ${this.q}.outbox_events WHERE published_at IS NULL AND parked_at IS NULL`,
    );
    if (rows.length === 0) return;
    const admin = client.admin();
    await admin.connect();
    try {
      const existing = new Set(await admin.listTopics());
      const missing = rows.map((r) => r.topic).filter((t) => !existing.has(t));
      if (missing.length > 0) {
        const error = new TopicMissingError(
          `Outbox events wait for Kafka topics that do not exist: ${missing.join(', ')}. ` +
            'Create them (outboxkit does not auto-create topics), for example with `outboxkit topics ensure`; ' +
            'until then their events are retried and then parked, and other topics flow.',
        );
        this.logger.error({ err: error, topics: missing }, 'topics missing');
        this.emit('relay:topics-missing', { topics: missing, error });
      }
    } finally {
      await admin.disconnect();
    }
  }

  private async startListener(): Promise<void> {
    const channel = notifyChannel(this.options.schema);
    const client = new pg.Client({
      ...(this.pool.options as pg.ClientConfig),
      keepAlive: true,
      application_name: 'outboxkit-relay-listener',
    });
    client.on('notification', () => this.wakeUp());
    client.on('error', (err) => {
      // A dead listener only costs latency: polling continues, and the listener is rebuilt.
      this.logger.warn({ err }, 'LISTEN connection failed; polling until it is back');
      if (this.listener === client) this.listener = undefined;
      client.end().catch(() => undefined);
    });
    await client.connect();
    await client.query(`LISTEN "${channel}"`);
    this.listener = client;
  }

  /**
   * Detects a dead listener (terminated backend, half-open TCP connection) with a bounded
   * `SELECT 1`, and rebuilds it: without it the relay would silently fall back to polling.
   */
  private async checkListener(): Promise<void> {
    if (!this.options.listen || this.stopping) return;
    const listener = this.listener;
    if (listener) {
      let timer: NodeJS.Timeout | undefined;
      const alive = await Promise.race([
        listener.query('SELECT 1').then(
          () => true,
          () => false,
        ),
        new Promise<boolean>((r) => (timer = setTimeout(() => r(false), Math.max(500, this.options.leaseMs / 3)))),
      ]);
      clearTimeout(timer);
      if (alive) return;
      this.logger.warn({}, 'LISTEN connection is dead; rebuilding it');
      this.listener = undefined;
      void listener.end().catch(() => undefined);
    }
    await this.startListener().catch((err: Error) => this.logger.warn({ err }, 'LISTEN reconnect failed'));
  }

  private wakeUp(): void {
    this.wakes++;
    this.woken = true;
    this.wake?.();
    const onWake = this.onWake;
    this.onWake = undefined;
    onWake?.();
  }

  /**
   * Sleeps `ms`, ended early by `stop()` and, when `wakeable`, by a wake-up (a notification, new
   * lanes). A backoff is not wakeable: under a busy writer a notification comes every few ms, and
   * would turn the backoff after a failed pass into an immediate retry.
   */
  private async sleep(ms: number, wakeable = true): Promise<void> {
    if (this.stopping) return;
    if (wakeable && this.woken) {
      this.woken = false;
      return;
    }
    await new Promise<void>((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.cancelSleep = done;
      if (wakeable) this.wake = done;
    });
    this.cancelSleep = undefined;
    this.wake = undefined;
    if (wakeable) this.woken = false;
  }

  /** Ends the current sleep, wakeable or not (stop()). */
  private cancelSleep: (() => void) | undefined;

  /** Renews, takes and gives back lanes so that live relays share them evenly. */
  private async maintainLanes(): Promise<void> {
    if (this.stopping) return;
    const { leaseMs } = this.options;
    const began = performance.now();
    if (this.failingSince !== undefined && began - this.failingSince > leaseMs) {
      await this.standDown(began - this.failingSince);
      return;
    }
    // Act on a lane only until slightly before its lease ends by our clock, measured from before
    // the renewal was sent: the database's lease is at least that long.
    const validUntil = began + leaseMs * 0.8;
    const live = await sql.heartbeatInstance(this.db, this.q, this.relayId, hostname(), process.pid, leaseMs);
    const renewed = await sql.renewLanes(this.db, this.q, this.relayId, [...this.held.values()], leaseMs);
    const keep = new Set(renewed.map((r) => r.lane));
    for (const lane of this.held.keys()) if (!keep.has(lane)) this.held.delete(lane);
    for (const r of renewed) this.held.set(r.lane, { ...r, validUntil });
    await this.checkListener();
    const share = Math.ceil(OUTBOX_LANES / live);
    let acquired = 0;
    if (this.held.size < share) {
      for (const r of await sql.acquireLanes(this.db, this.q, this.relayId, share - this.held.size, leaseMs)) {
        this.held.set(r.lane, { ...r, validUntil });
        acquired++;
      }
    } else if (this.held.size > share) {
      const extra = this.heldLanes().slice(share);
      for (const lane of extra) this.held.delete(lane);
      // Give them back after the pass in flight, which may still be publishing their rows, and
      // after its marking: a late mark would fail the fencing check and the rows go out again.
      await this.currentPass;
      await this.marks.settle().catch(() => undefined);
      await sql.releaseLanes(this.db, this.q, this.relayId, extra);
    }
    this.emit('relay:lanes', { held: this.heldLanes() });
    // New lanes may hold a backlog that no notification will announce.
    if (acquired > 0) this.wakeUp();
    // An idle relay learns of a broker outage from a probe, not from a send: without it, it would
    // stay ready until it has something to send. In the background: never delays the renewals.
    if (this.producer && !this.sending && performance.now() - this.brokerAnsweredAt > this.maintainEveryMs / 2) {
      void this.probeBroker();
    }
  }

  /** Interval of lane maintenance (renewals, probes), in ms: a third of a lease. */
  private get maintainEveryMs(): number {
    return Math.max(200, Math.floor(this.options.leaseMs / 3));
  }

  /**
   * Asks the broker for its cluster's metadata (a Metadata request without topics, the producer's
   * `probe()`), bounded by `brokerTimeoutMs`. No answer: the broker counts as unreachable, the
   * producer is dropped (`producerConnected` false, readiness 503) and rebuilt, and the failure
   * streak starts, which ends in a stand-down after `leaseMs` unless a producer connects again
   * first. A producer that cannot probe (a `RelayProducer` without a Kafka client) is not probed.
   */
  private async probeBroker(): Promise<void> {
    const producer = this.producer;
    if (this.probing || !producer?.probe || this.stopping) return;
    this.probing = true;
    const began = performance.now();
    try {
      await withDeadline(producer.probe(), this.options.brokerTimeoutMs, 'a metadata probe');
      this.brokerAnswered();
    } catch (err) {
      if (this.stopping) return;
      this.failing(began);
      this.logger.warn(
        { err },
        'Kafka did not answer the probe of an idle relay: producer dropped until one connects again',
      );
      // The producer's probing connection goes with it (disconnected once its request settles).
      void this.rebuildProducer();
    } finally {
      this.probing = false;
    }
  }

  /**
   * The broker answered (an acknowledgement, a record's own error, a connect or a probe). A failure
   * streak that came only from connects or probes ends here; one with failed sends ends with the
   * next acknowledged send (a broker that connects but refuses every send must still stand down).
   */
  private brokerAnswered(): void {
    this.brokerAnsweredAt = performance.now();
    if (!this.sendFailing) this.failingSince = undefined;
  }

  /**
   * Starts a failure streak at `since` (performance.now(), ms), unless one runs, and has the lanes
   * maintained right when it has lasted a lease: the stand-down then comes a lease after the
   * failing began, not up to a maintenance interval later.
   */
  private failing(since: number): void {
    if (this.failingSince !== undefined) return;
    this.failingSince = since;
    clearTimeout(this.standDownTimer);
    this.standDownTimer = setTimeout(
      () => this.maintainSoon(),
      Math.max(0, since + this.options.leaseMs - performance.now()) + 10,
    );
    this.standDownTimer.unref();
  }

  private standDownTimer: NodeJS.Timeout | undefined;

  /** A lane maintenance after the one running, if any (renewals and stand-downs never overlap). */
  private maintainSoon(): void {
    if (this.stopping) return;
    this.maintaining = this.maintaining
      .then(() => this.maintainLanes())
      .catch((err: Error) => {
        this.logger.warn({ err }, 'lane maintenance failed');
      });
  }

  /** A send was acknowledged (or refused for a record's own reason): the broker works. */
  private sendSucceeded(): void {
    this.sending = false;
    this.sendFailing = false;
    this.brokerAnswered();
  }

  /** A send failed or got no answer in time: the failure streak starts at its start, if not before. */
  private sendFailed(startedAt: number): void {
    this.sending = false;
    this.sendFailing = true;
    this.failing(startedAt);
  }

  /** `disconnect()` of a producer or admin client, bounded by `brokerTimeoutMs`; errors ignored. */
  private async disconnectQuietly(client: { disconnect(): Promise<void> } | undefined): Promise<void> {
    if (!client) return;
    await withDeadline(client.disconnect(), this.options.brokerTimeoutMs, 'a disconnect').catch(() => undefined);
  }

  /**
   * A relay that cannot publish (its producer does not connect, or every pass fails) for longer
   * than one lease stands down: it releases its lanes and leaves the live instances, so that a
   * healthy relay takes them over, instead of holding their events back. It keeps trying the
   * producer on each maintenance tick and rejoins once it connects.
   */
  private async standDown(failingMs: number): Promise<void> {
    if (!this.standingDown) {
      this.standingDown = true;
      this.logger.warn(
        { failingMs: Math.round(failingMs), lanes: this.held.size },
        'cannot publish to Kafka for longer than a lease: releasing lanes until the producer works again',
      );
      this.emit('relay:standing-down', { failingMs });
    }
    if (this.held.size > 0) {
      const lanes = this.heldLanes();
      this.held.clear();
      // A pass that holds rows may still send or mark them: the lanes go after it. One that waits
      // for a producer has read nothing, and sends nothing once the lanes are gone (stillOwned).
      if (this.passHoldsRows) await this.currentPass;
      await this.marks.settle().catch(() => undefined);
      await sql.releaseLanes(this.db, this.q, this.relayId, lanes);
      this.emit('relay:lanes', { held: [] });
    }
    await sql.deregisterInstance(this.db, this.q, this.relayId);
    // A fresh producer that connects is the sign to rejoin (if sends still fail, the relay stands
    // down again one lease later). A connect the broker does not answer goes on in the background.
    await this.awaitProducer();
    if (this.producer && !this.stopping) {
      this.failingSince = undefined;
      this.sendFailing = false;
      this.standingDown = false;
      this.logger.info({}, 'Kafka producer connected again; rejoining the relays');
    }
  }

  /**
   * Since when (performance.now(), ms) the relay has failed to publish: the start of the first
   * failed send, connect or probe of the streak; undefined while it can publish.
   */
  private failingSince: number | undefined;
  /** A send failed in the current failure streak (a connect alone then does not end it). */
  private sendFailing = false;
  /** When the broker last answered (performance.now(), ms). */
  private brokerAnsweredAt = 0;
  /** A send is in flight (an idle probe would only add a request beside it). */
  private sending = false;
  private probing = false;
  private standingDown = false;

  private currentPass: Promise<unknown> = Promise.resolve();
  /** The pass in flight has read rows (it may send and mark them). */
  private passHoldsRows = false;
  private isolateNext = false;
  /** The next batch, read while the previous one was sent (see pass()), with the leases it was read under. */
  private readAhead: { leases: string; wakes: number; rows: Promise<sql.PendingRow[] | undefined> } | undefined;
  /** Wake-ups so far (notifications, new lanes): a pass tells by it whether rows may have come since it read. */
  private wakes = 0;
  /** Set while a batch is in flight: starts the read of the next batch when a notification comes. */
  private onWake: (() => void) | undefined;
  /**
   * Acknowledged batches being marked published while the next passes run: one statement at a
   * time, the batches acknowledged meanwhile together in the next one.
   */
  private readonly marks = new MarkQueue(
    (seqs, held) => sql.markPublished(this.db, this.q, this.relayId, seqs, held),
    (batches, marked) => {
      const count = batches.reduce((n, b) => n + b.seqs.length, 0);
      if (marked < count) this.fencedOut(new Set(batches.flatMap((b) => b.lanes)), count, marked);
      this.emit('relay:published', { count, marked, lanes: batches[0]!.held.length });
      this.logger.debug({ count, marked }, 'published');
    },
  );

  private async loop(): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      let published = 0;
      try {
        const pass = this.pass().finally(() => (this.passHoldsRows = false));
        this.currentPass = pass.catch(() => undefined);
        published = await pass;
        failures = 0;
      } catch (err) {
        failures++;
        this.failing(performance.now());
        this.readAhead = undefined;
        // The producer is dropped at once (`producerConnected` false) and a new one connects.
        const rebuilt = this.awaitProducer();
        await this.marks.settle().catch(() => undefined);
        const error = err instanceof Error ? err : new Error(String(err));
        this.logger.warn({ err: error, attempt: failures }, 'relay pass failed; backing off');
        this.emit('relay:error', { error, attempt: failures });
        await rebuilt;
        await this.sleep(fullJitterBackoffMs(failures, this.options.retryInitialMs, this.options.retryMaxMs), false);
        continue;
      }
      // A pass that read less than a full batch saw every visible row of its lanes: the next rows
      // come with a notification (which cuts the sleep short) or are found by the next poll. Only
      // after a full batch is the table read again at once (no empty read per event at low rates).
      if (published === 0 || !this.morePending) await this.sleep(this.options.pollIntervalMs);
    }
  }

  /** Set by each pass: it read a full batch (rows or bytes), so more rows may be pending now. */
  private morePending = false;

  /** One rebuild at a time (the loop and a stand-down may both ask): never two live producers. */
  private rebuilding: Promise<void> | undefined;

  private rebuildProducer(): Promise<void> {
    this.rebuilding ??= this.doRebuildProducer().finally(() => (this.rebuilding = undefined));
    return this.rebuilding;
  }

  /**
   * Waits for a producer (the rebuild in flight, or a new one) at most `brokerTimeoutMs`; a connect
   * the broker does not answer goes on in the background (no second one meanwhile), and counts as
   * a failure from then on.
   */
  private async awaitProducer(): Promise<void> {
    const began = performance.now();
    await withDeadline(this.rebuildProducer(), this.options.brokerTimeoutMs, 'a producer connect').catch(() =>
      this.failing(began),
    );
  }

  private async doRebuildProducer(): Promise<void> {
    // After a failed send the producer's state (sequence numbers, connections) is suspect.
    const old = this.producer;
    this.producer = undefined;
    await this.disconnectQuietly(old);
    if (this.stopping) return;
    const next = this.makeProducer();
    const began = performance.now();
    try {
      await next.connect();
    } catch (err) {
      this.failing(began);
      this.logger.warn({ err }, 'producer reconnect failed');
      return;
    }
    // Stopped while connecting: stop() did not see this producer, so it is disconnected here.
    if (this.stopping) return this.disconnectQuietly(next);
    this.producer = next;
    this.brokerAnswered();
  }

  /** One pass: read pending rows of held lanes, publish them, mark what the broker acknowledged. */
  private async pass(): Promise<number> {
    this.morePending = false;
    const now = performance.now();
    const lanes = [...this.held.values()].filter((l) => l.validUntil > now);
    if (lanes.length === 0) return 0;
    if (!this.producer) {
      await this.awaitProducer();
      if (!this.producer) throw noProducer(this.options.brokerTimeoutMs);
    }
    const o = this.options;
    const laneIds = lanes.map((l) => l.lane);
    const leases = lanes.map((l) => `${l.lane}:${l.token}`).join(',');
    // A batch read ahead while the previous one was sent, if read under the same leases.
    const ahead = this.readAhead;
    this.readAhead = undefined;
    let aheadRows = ahead?.leases === leases ? await ahead.rows : undefined;
    // A read ahead that found nothing says nothing of rows whose notification came while it ran
    // (they may have committed after its snapshot), and that notification's wake-up may already be
    // spent: read again rather than sleep until the next poll.
    if (aheadRows?.length === 0 && ahead!.wakes !== this.wakes) aheadRows = undefined;
    // Wake-ups (notifications) counted when this batch's read began: a higher count now means rows
    // may have committed after its snapshot.
    const wakesAtRead = aheadRows && ahead ? ahead.wakes : this.wakes;
    // Rows acknowledged but not marked yet are still pending in the table: not read again meanwhile.
    const rows =
      aheadRows ??
      (await sql.readPending(
        this.db,
        this.q,
        laneIds,
        o.batchSize,
        o.maxBatchBytes,
        o.holdKeyBehindFailure,
        this.marks.pendingSeqs(),
      ));
    if (rows.length === 0) return 0;
    const sendable = this.stillOwned(rows, lanes);
    if (sendable.length === 0) return 0;
    this.passHoldsRows = true;
    if (this.isolateNext) {
      await this.marks.settle();
      // The last batch failed: send one by one, so that a record at fault (too large, topic
      // gone...) is found and only it counts an attempt. A broker outage fails the first send
      // and the loop backs off. Back to batches once a whole pass went through.
      const published = await this.isolate(sendable, lanes);
      this.isolateNext = false;
      this.morePending = true;
      return published;
    }
    const records = sendable.map(toRecord);
    const chunks = splitByTopicLimit(records, await this.topicLimits(records));
    // The next batch is read while this one is in flight, so that the database's half and the
    // broker's half of the work overlap: at once when the read hit its row or byte bound (more rows
    // are waiting), else when a notification says that rows committed since this batch was read.
    // The read skips this batch's rows (pending until marked); the next batch is sent only after
    // this one is acknowledged, so a key's order holds. Dropped if this send fails (the next pass
    // isolates). Without LISTEN the next poll reads.
    const pageRows = rows[0]!.page_rows;
    this.morePending = pageRows >= o.batchSize || pageRows > rows.length;
    let inFlight = true;
    const readNext = (): void => {
      if (this.readAhead || this.stopping) return;
      const wakes = this.wakes;
      const next = {
        leases,
        wakes,
        rows: sql
          .readPending(this.db, this.q, laneIds, o.batchSize, o.maxBatchBytes, o.holdKeyBehindFailure, [
            ...this.marks.pendingSeqs(),
            ...rows.map((r) => r.seq),
          ])
          .catch(() => undefined), // the next pass reads again
      };
      this.readAhead = next;
      if (!o.listen) return;
      // Nothing new yet and this batch still in flight: read again at the next notification (or
      // now, if one came during this read).
      void next.rows.then((found) => {
        if (!inFlight || this.readAhead !== next || found?.length !== 0) return;
        this.readAhead = undefined;
        if (this.wakes !== wakes) readNext();
        else this.onWake = readNext;
      });
    };
    if (this.morePending || (o.listen && this.wakes !== wakesAtRead)) readNext();
    else if (o.listen) this.onWake = readNext;
    let acked = 0;
    const sendStarted = performance.now();
    this.sending = true;
    try {
      await crashPoint('relay:before-send');
      // Chunks go one after another, so a key's order holds across them. Each is bounded: kafkajs
      // retries a broker that is gone for seconds, and waits `requestTimeout` (30 s) for one that
      // does not answer, while this relay should be giving its lanes to a healthy one.
      for (const chunk of chunks) {
        throwIfFailed(await withDeadline(this.producer.send(chunk), o.brokerTimeoutMs, 'a send'));
        acked += chunk.length;
      }
      this.sendSucceeded();
    } catch (err) {
      this.sendFailed(sendStarted);
      // The rows of failed chunks stay pending; those the broker acknowledged are marked. kafkajs
      // may report a record's fault as another error (its internal retry of a partly written
      // batch ends in OUT_OF_ORDER_SEQUENCE_NUMBER), so the error's kind is not trusted here: the
      // next pass isolates.
      this.isolateNext = true;
      this.readAhead = undefined;
      this.marks.add(markBatch(sendable.slice(0, acked), leases, lanes));
      throw err;
    } finally {
      inFlight = false;
      this.sending = false;
      this.onWake = undefined;
    }
    await crashPoint('relay:after-send');
    // The rows are marked while the next passes read and send (they skip them), so the marking is
    // off the path of the next events' latency. A marking that failed surfaces here, on a later
    // pass, and its rows are published again (at least once). Bounded: when the database falls
    // behind by more than a batch, the pass waits for the marking in flight.
    this.logger.debug({ rows: sendable.length, bytes: payloadBytes(sendable) }, 'batch acknowledged');
    this.marks.add(markBatch(sendable, leases, lanes));
    this.marks.takeFailure();
    await this.marks.drainTo(o.batchSize);
    return sendable.length;
  }

  /** `max.message.bytes` of the topics of `records` (read once per topic), as a lookup. */
  private async topicLimits(records: readonly OutboundRecord[]): Promise<(topic: string) => number> {
    const fallback = this.options.maxBatchBytes;
    if (this.client) {
      const unknown = [...new Set(records.map((r) => r.topic))].filter((t) => !this.maxMessageBytes.has(t));
      if (unknown.length > 0) {
        const admin = this.client.admin();
        const timeoutMs = this.options.brokerTimeoutMs;
        const connecting = admin.connect();
        try {
          await withDeadline(connecting, timeoutMs, 'an admin connect');
        } catch (err) {
          // Disconnected once its connect settles (a disconnect during it could leave a connection).
          void connecting.catch(() => undefined).then(() => this.disconnectQuietly(admin));
          throw err;
        }
        try {
          const limits = await withDeadline(readTopicLimits(admin, unknown), timeoutMs, 'a topic configuration read');
          for (const [topic, bytes] of limits) this.maxMessageBytes.set(topic, bytes);
        } catch (err) {
          this.logger.warn({ err, topics: unknown }, 'could not read max.message.bytes; using maxBatchBytes');
        } finally {
          await this.disconnectQuietly(admin);
        }
      }
    }
    // Keep 10 % below the topic's limit, and never above maxBatchBytes.
    return (topic) => Math.min(fallback, Math.floor((this.maxMessageBytes.get(topic) ?? fallback) * 0.9));
  }

  private readonly maxMessageBytes = new Map<string, number>();

  /**
   * The fencing check refused part of a marking (`marked` of `sent` rows): another relay holds (or
   * held) some of `lanes`, the lanes of the marking's rows (a takeover, or `outboxkit lanes
   * release` on this live relay). Until the next renewal says which lanes are still ours, nothing
   * more is sent on them: otherwise every pass would send their still-pending rows again (at least
   * once, but a copy per pass).
   */
  private fencedOut(lanes: ReadonlySet<number>, sent: number, marked: number): void {
    for (const lane of lanes) {
      const held = this.held.get(lane);
      if (held) this.held.set(lane, { ...held, validUntil: 0 });
    }
    this.logger.warn(
      { sent, marked, lanes: lanes.size },
      'marking refused by the fencing check (lanes taken over or released): their sends stop until the next lease renewal',
    );
  }

  /** Rows whose lane this relay still holds with the token it read them under. */
  private stillOwned(rows: sql.PendingRow[], lanes: LaneLease[]): sql.PendingRow[] {
    const now = performance.now();
    // The lease as held now, not as it was when the pass began: a pass that waited (for a read
    // ahead, a slow read) may outlive the validity it started with while the lanes were renewed
    // meanwhile. Renewal keeps the fencing token; taking a lane changes it, so the same token
    // means nobody else held the lane since these rows were read.
    const valid = new Set(
      lanes
        .filter((l) => {
          const current = this.held.get(l.lane);
          return current !== undefined && current.token === l.token && current.validUntil > now;
        })
        .map((l) => l.lane),
    );
    return rows.filter((r) => valid.has(r.lane));
  }

  /**
   * Sends rows one at a time after a batch failed for a record's reason, so that only the guilty
   * rows count an attempt. Later rows of a failing key are not sent in this pass (per-key order).
   */
  private async isolate(rows: sql.PendingRow[], lanes: LaneLease[]): Promise<number> {
    const tokens = new Map(lanes.map((l) => [l.lane, l.token]));
    const failedKeys = new Set<string>();
    let published = 0;
    for (const row of rows) {
      if (row.key !== null && failedKeys.has(row.key)) continue;
      if (this.stillOwned([row], lanes).length === 0) continue;
      const sendStarted = performance.now();
      this.sending = true;
      let failure: KafkaFailure | undefined;
      try {
        const sent = await withDeadline(this.producer!.send([toRecord(row)]), this.options.brokerTimeoutMs, 'a send');
        failure = firstFailure(sent);
        if (failure && failure.kind !== 'record') throw failure.error;
      } catch (err) {
        this.sendFailed(sendStarted);
        throw err;
      }
      this.sendSucceeded(); // acknowledged, or the broker answered that this record is at fault (not the relay)
      if (failure) {
        if (row.key !== null) failedKeys.add(row.key);
        const attempts = row.attempts + 1;
        const message = `${failure.code ?? 'error'}: ${failure.error.message}`;
        const backoffMs =
          this.options.retryInitialMs +
          fullJitterBackoffMs(attempts, this.options.retryInitialMs, this.options.retryMaxMs);
        const parked = await sql.recordFailure(
          this.db,
          this.q,
          this.relayId,
          row,
          tokens.get(row.lane)!,
          message,
          backoffMs,
          this.options.maxAttempts,
        );
        this.logger.warn(
          { eventId: row.event_id, topic: row.topic, attempts, parked, error: message },
          parked ? 'event parked' : 'event publish failed',
        );
        this.emit('relay:failed', { eventId: row.event_id, attempts, parked, error: message });
        // Stopping: no new producer (stop() disconnects this one); the rows left stay pending.
        if (this.stopping) break;
        // kafkajs' idempotent producer counts the rejected record's sequence number although the
        // broker did not, so its next send to that partition would fail OUT_OF_ORDER_SEQUENCE_NUMBER:
        // start over with a new producer id.
        await this.awaitProducer();
        if (!this.producer) {
          if (this.stopping) break; // stop() came during the rebuild, which then made no producer
          throw noProducer(this.options.brokerTimeoutMs);
        }
        continue;
      }
      const marked = await sql.markPublished(this.db, this.q, this.relayId, [row.seq], lanes);
      if (marked === 0) {
        this.fencedOut(new Set([row.lane]), 1, 0);
        break;
      }
      published += marked;
    }
    if (published > 0) this.emit('relay:published', { count: published, marked: published, lanes: lanes.length });
    return published;
  }

  /** Deletes published rows past their retention; only the holder of lane 0 does it. */
  private async cleanup(): Promise<void> {
    if (this.stopping || !this.held.has(0)) return;
    let total = 0;
    for (let i = 0; i < 100 && !this.stopping; i++) {
      const n = await sql.deletePublished(
        this.db,
        this.q,
        this.options.publishedRetentionMs,
        this.options.cleanupBatchSize,
      );
      total += n;
      if (n < this.options.cleanupBatchSize) break;
    }
    if (total > 0) this.emit('relay:cleaned', { deleted: total });
  }
}

/**
 * `promise`, or a {@link BrokerUnavailableError} after `ms` (the promise goes on; its outcome is
 * then ignored).
 */
function withDeadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new BrokerUnavailableError(
            `Kafka did not answer ${what} within brokerTimeoutMs (${ms} ms): the broker counts as unreachable; ` +
              'the relay backs off, reconnects, and stands down after leaseMs of failing.',
          ),
        ),
      ms,
    );
  });
  promise.catch(() => undefined); // lost the race: its rejection is not unhandled
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

function noProducer(brokerTimeoutMs: number): BrokerUnavailableError {
  return new BrokerUnavailableError(
    `no Kafka producer available: its last connect failed or took longer than brokerTimeoutMs (${brokerTimeoutMs} ms); ` +
      'the relay retries with backoff and stands down after leaseMs of failing.',
  );
}

function markBatch(rows: readonly sql.PendingRow[], leases: string, held: readonly LaneLease[]): MarkBatch {
  return { seqs: rows.map((r) => r.seq), lanes: [...new Set(rows.map((r) => r.lane))], leases, held };
}

function payloadBytes(rows: readonly sql.PendingRow[]): number {
  let n = 0;
  for (const r of rows) n += r.payload.length;
  return n;
}

function toRecord(row: sql.PendingRow): OutboundRecord {
  return {
    topic: row.topic,
    key: row.key,
    value: row.payload,
    headers: { ...row.headers, [HEADER_EVENT_ID]: row.event_id, [HEADER_EVENT_TYPE]: row.type },
  };
}

/**
 * Creates a {@link Relay}; call `start()` to run it.
 *
 * @throws {@link InvalidOptionsError} on an unknown option name or an invalid option (see
 *   {@link resolveRelayOptions}); nothing is connected then.
 */
export function createRelay(options: RelayOptions): Relay {
  return new Relay(options);
}
