/**
 * The relay: publishes committed outbox events to Kafka, at least once, in per-key order.
 *
 * How the work is divided: every event belongs to one of 64 lanes (by a hash of its key). A relay
 * holds a fair share of the lanes through leases kept in `relay_lanes` (database clock), each with
 * a fencing token that grows on every takeover (./lanes.ts). Only the holder of a lane publishes
 * its events, so each key has one active publisher; a relay that dies loses its lanes when its
 * lease expires (`leaseMs`), and the others take them over. A paused relay that wakes after losing
 * a lane may still send what it had read (a late duplicate), but it can no longer mark rows: the
 * mark checks the fencing token.
 *
 * This file holds the relay's lifecycle (start, stop), its loop and its pass (read, send, mark).
 * Its collaborators: ./lanes.ts (leases), ./broker-health.ts (the producer, failure streak,
 * probes, stand-down), ./wake.ts (LISTEN wake-ups, sleeps), ./mark-queue.ts (marking off the
 * latency path), ./sql.ts (the statements), ./options.ts.
 *
 * The relay needs a session-mode connection (a direct PostgreSQL connection, or PgBouncer in
 * session mode): LISTEN does not work through a transaction-pooling proxy.
 */
import { EventEmitter } from 'node:events';
import { hostname } from 'node:os';
import pg from 'pg';
import { pgQuery, type Queryable } from '../src/database.js';
import { LifecycleError, TopicMissingError, schemaMissingOr } from '../src/errors.js';
import { noopLogger, type Logger } from '../src/logger.js';
import { quoteSchema, notifyChannel } from '../src/schema-name.js';
import { fullJitterBackoffMs } from '../src/backoff.js';
import { crashPoint } from '../src/crash-point.js';
import { readTopicLimits, splitByTopicLimit } from '../src/kafka/topic-limits.js';
import { createKafkajsClient, kafkaClientOf } from '../src/kafka/kafkajs/client.js';
import { createPlatformaticClient } from '../src/kafka/platformatic/client.js';
import { loadPlatformaticKafka } from '../src/kafka/platformatic/load.js';
import { fromRelayProducer, RELAY_PRODUCER_RETRY } from '../src/kafka/kafkajs/producer.js';
import { firstFailure } from '../src/kafka/outcomes.js';
import type { KafkaAdmin, KafkaClient, KafkaFailure, OutboundRecord } from '../src/kafka/types.js';
import { BrokerHealth, noProducer, withDeadline } from './broker-health.js';
import { Lanes, type LaneLease } from './lanes.js';
import { MarkQueue, type MarkBatch } from './mark-queue.js';
import { PartitionGate, clusterPartitionSource, type BlockedPartition } from './partitions.js';
import {
  RELAY_PRODUCER_DEFAULTS,
  resolveRelayOptions,
  type RelayOptions,
  type ResolvedRelayOptions,
} from './options.js';
import { toRecord } from './record.js';
import * as sql from './sql.js';
import { Wake } from './wake.js';
import { RetentionCleaner } from './cleanup.js';

export { RELAY_DEFAULTS, resolveRelayOptions, type RelayOptions, type ResolvedRelayOptions } from './options.js';

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
  /**
   * One pass of the loop finished: `read` pending rows read, `sent` of them acknowledged by Kafka
   * (their marking runs after the pass, see `relay:marked`), in `durationMs` ms. A pass that failed
   * emits `relay:error` instead.
   */
  'relay:pass': [{ read: number; sent: number; durationMs: number }];
  /** Rows marked published (fewer than acknowledged when the fencing check refused some). */
  'relay:marked': [{ rows: number }];
  /**
   * The topic-partitions that cannot take writes changed (no leader, or too few in-sync
   * replicas): `blocked` lists them now (empty once all take writes again). Their events wait.
   */
  'relay:partitions': [{ blocked: BlockedPartition[] }];
}

/**
 * While some topic-partition cannot take writes, the relay asks the cluster for its state this
 * often, in ms: its waiting events go out within about this long of it taking writes again.
 */
export const PARTITION_RECHECK_MS = 1_000;

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
  /** The relay's pool, schema and id, where its own statements run. */
  private readonly scope: sql.RelayScope;
  private readonly logger: Logger;
  private readonly client: KafkaClient | undefined;
  private readonly lanes: Lanes;
  private readonly health: BrokerHealth;
  private readonly wake: Wake;
  /** Which topic-partitions cannot take writes, and the keys that wait for them (undefined without a Kafka client). */
  private readonly gate: PartitionGate | undefined;
  /** The admin client of the gate's metadata requests, connected on first use and dropped after a failure. */
  private admin: { client: KafkaAdmin; connecting: Promise<void> } | undefined;
  private recheckTimer: NodeJS.Timeout | undefined;
  private rechecking = false;
  /** When the gate's metadata request last succeeded (ms of `performance.now()`, the health clock). */
  private metadataAnsweredAt = -Infinity;
  /** Topics of the last failed send (asked again when a stand-down comes due). */
  private failedTopics: string[] = [];
  private loopDone: Promise<void> | undefined;
  private maintainTimer: NodeJS.Timeout | undefined;
  private maintaining: Promise<void> = Promise.resolve();
  /** The retention cleanup, run by the holder of lane 0 (./cleanup.ts). */
  private readonly cleaner: RetentionCleaner;
  private stopping = false;
  private stopped: Promise<void> | undefined;
  private started = false;

  /** The pass in flight (settled, never rejecting). */
  private currentPass: Promise<unknown> = Promise.resolve();
  /** The pass in flight has read rows (it may send and mark them). */
  private passHoldsRows = false;
  /** The last send failed: the next pass isolates the record at fault (see isolate()). */
  private isolateNext = false;
  /** Set by each pass: it read a full batch (rows or bytes), so more rows may be pending now. */
  private morePending = false;
  /** The next batch, read while the previous one was sent (see pass()), with the leases it was read under. */
  private readAhead: { leases: string; wakes: number; rows: Promise<sql.PendingRow[] | undefined> } | undefined;
  /** `max.message.bytes` of the topics seen, read once per topic. */
  private readonly maxMessageBytes = new Map<string, number>();
  /**
   * Acknowledged batches being marked published while the next passes run: one statement at a
   * time, the batches acknowledged meanwhile together in the next one.
   */
  private readonly marks = new MarkQueue(
    (seqs, held) => sql.markPublished(this.scope, seqs, held),
    (batches, marked) => {
      const count = batches.reduce((n, b) => n + b.seqs.length, 0);
      if (marked < count) this.fencedOut(new Set(batches.flatMap((b) => b.lanes)), count, marked);
      this.emit('relay:published', { count, marked, lanes: batches[0]!.held.length });
      this.emit('relay:marked', { rows: marked });
      this.logger.debug({ count, marked }, 'published');
    },
  );

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
    // pgQuery: the read and the mark stay named prepared statements on the relay's connections,
    // parsed again after a session reset (a pool of the application's that runs DISCARD ALL on
    // release), unnamed where outboxkit cannot tell what the session holds
    // (src/prepared-statements.ts).
    this.db = {
      query: <R>(text: string, values: readonly unknown[] = [], options?: { name?: string }) =>
        pgQuery<R>(this.pool, text, values, options?.name),
    };
    // kafkajs's request-queue fix comes with the client (createKafkajsClient), not from here.
    const client = options.kafka
      ? kafkaClientOf(options.kafka)
      : options.brokers
        ? this.options.kafkaClient === 'platformatic'
          ? createPlatformaticClient({ clientId: 'outboxkit-relay', brokers: options.brokers })
          : createKafkajsClient(
              { clientId: 'outboxkit-relay', brokers: options.brokers },
              // kafkajs's own entries (at warn and above) go to the relay's logger when it has one;
              // without one, to kafkajs's console logger as before (docs/kafka.md, "kafkajs's log").
              { logLevel: 'warn', ...(options.logger ? { logger: options.logger } : {}) },
            )
        : undefined;
    this.client = client;
    const producer = options.producer;
    const o = this.options;
    this.health = new BrokerHealth({
      makeProducer: producer
        ? () => fromRelayProducer(producer, client)
        : () =>
            client!.producer({
              ...RELAY_PRODUCER_DEFAULTS,
              ...options.producerOptions,
              ...RELAY_PRODUCER_RETRY,
              // A send this relay gave up on (past brokerTimeoutMs) does not hold up the next one
              // (@platformatic/kafka; ProducerSettings.sendTimeoutMs).
              sendTimeoutMs: o.brokerTimeoutMs,
              onSend: (sent) => this.emit('relay:sent', sent),
            }),
      brokerTimeoutMs: o.brokerTimeoutMs,
      leaseMs: o.leaseMs,
      onStandDownDue: () => this.maintainSoon(),
      logger: this.logger,
    });
    const scope = { db: this.db, schema: this.q, relayId: o.relayId };
    this.scope = scope;
    this.lanes = new Lanes(
      {
        // The blocked partitions go with each heartbeat, for `outboxkit status` (it reads the database).
        heartbeat: (leaseMs) =>
          sql.heartbeatInstance(scope, {
            hostname: hostname(),
            pid: process.pid,
            leaseMs,
            blockedPartitions: this.blockedPartitions(),
          }),
        renew: (held, leaseMs) => sql.renewLanes(scope, held, leaseMs),
        acquire: (count, leaseMs) => sql.acquireLanes(scope, count, leaseMs),
        release: (lanes) => sql.releaseLanes(scope, lanes),
      },
      o.leaseMs,
    );
    this.cleaner = new RetentionCleaner({
      db: this.db,
      schema: this.q,
      publishedRetentionMs: o.publishedRetentionMs,
      cleanupIntervalMs: o.cleanupIntervalMs,
      cleanupBatchSize: o.cleanupBatchSize,
      cleanupRowsPerSecond: o.cleanupRowsPerSecond,
      // Only the holder of lane 0 cleans (one cleaner at a time); it stops between batches when
      // the relay stops or loses lane 0.
      mayRun: () => !this.stopping && this.lanes.has(0),
      logger: this.logger,
      onCleaned: (deleted) => this.emit('relay:cleaned', { deleted }),
    });
    this.gate = client
      ? new PartitionGate(
          clusterPartitionSource(
            client,
            (what, fn) => this.withAdmin(what, fn),
            () => (this.metadataAnsweredAt = performance.now()),
          ),
          this.logger,
        )
      : undefined;
    this.wake = new Wake({
      listen: o.listen,
      channel: notifyChannel(o.schema),
      connection: this.pool.options as pg.ClientConfig,
      checkTimeoutMs: Math.max(500, o.leaseMs / 3),
      logger: this.logger,
    });
  }

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
    return this.started && !this.stopping && this.health.producer !== undefined;
  }

  /**
   * Whether the relay stands down now: it could not publish for longer than a lease, released its
   * lanes for the other relays and left the live instances, and holds none until a new producer
   * connects (event `relay:standing-down`). False before start and once it rejoined.
   */
  get standingDown(): boolean {
    return this.health.standingDown;
  }

  /** The lanes this relay currently holds. */
  heldLanes(): number[] {
    return this.lanes.list();
  }

  /**
   * The topic-partitions this relay found unable to take writes (no leader, or fewer in-sync
   * replicas than `min.insync.replicas`), with how many keys of its lanes wait for each. Empty
   * when every partition it writes to takes writes, or when it has no Kafka client to ask.
   */
  blockedPartitions(): BlockedPartition[] {
    return this.gate?.blocked() ?? [];
  }

  /**
   * Events of this relay's lanes that wait for each blocked topic-partition (one query, only while
   * some partition is blocked): `{ topic, partition, events }`.
   */
  async waitingEvents(): Promise<{ topic: string; partition: number; events: number }[]> {
    const gate = this.gate;
    if (!gate?.anyBlocked) return [];
    const byKey = await sql.pendingByKey(this.db, this.q, this.heldLanes(), gate.keys());
    return gate.blocked().map((b) => ({
      topic: b.topic,
      partition: b.partition,
      events: gate.keysOf(b.topic, b.partition).reduce((n, k) => n + (byKey.get(k) ?? 0), 0),
    }));
  }

  /**
   * Starts the relay: verifies topics, takes lanes, and publishes in the background until
   * `stop()` or `signal` aborts.
   *
   * @throws {@link TopicMissingError} when a topic of a pending event does not exist.
   * @throws `KafkaClientUnavailableError` when `kafkaClient` is `'platformatic'` and
   *   @platformatic/kafka is missing, of an unsupported version, or needs a newer Node.js.
   * @throws {@link LifecycleError} when called twice.
   */
  async start(signal?: AbortSignal): Promise<void> {
    if (this.started || this.stopped) {
      throw new LifecycleError(
        this.stopped ? 'Relay.start() after stop(): create a new Relay instead.' : 'Relay.start() was called twice.',
      );
    }
    this.started = true;
    // A missing or unsupported client package is a setup error, not an outage to wait out.
    if (this.options.kafkaClient === 'platformatic') await loadPlatformaticKafka();
    try {
      await sql.seedLanes(this.db, this.q);
    } catch (err) {
      throw schemaMissingOr(err, this.options.schema);
    }
    await this.warnIfWalPublication();
    // The broker may be down at start: the relay starts anyway and its loop backs off until the
    // broker answers (a daemon that exits would only be restarted into the same outage).
    if (this.options.verifyTopics && this.client) {
      await withDeadline(this.verifyTopics(this.client), this.options.brokerTimeoutMs, 'the topic check').catch(
        (err: Error) => this.logger.warn({ err }, 'could not check the topics of pending events at start'),
      );
    }
    // Kept only once connected: `producerConnected` (readiness) must not count a connect in flight.
    await this.health.awaitProducer();
    if (!this.health.producer) this.logger.warn({}, 'Kafka producer could not connect at start; retrying with backoff');
    await this.wake.start();
    await this.maintainLanes();
    this.maintainTimer = setInterval(() => this.maintainSoon(), this.maintainEveryMs);
    this.maintainTimer.unref();
    // Its own chain: a long cleanup must never delay the lease renewals above.
    this.cleaner.start();
    this.recheckTimer = setInterval(() => void this.recheckPartitions(), PARTITION_RECHECK_MS);
    this.recheckTimer.unref();
    signal?.addEventListener('abort', () => void this.stop(), { once: true });
    this.loopDone = this.loop();
    this.logger.info({ relayId: this.relayId, lanes: this.heldLanes().length }, 'relay started');
  }

  /**
   * Warns when a publication streams this schema's outbox table (a WAL source is set up:
   * docs/wal-source.md): rows that `createOutbox({ source: 'wal' })` wrote took no per-key lock, so
   * a table relay would publish them without per-key order, beside the WAL relay's copies. A
   * warning, not a refusal: a publication may serve other readers (CDC tools). A failed check is
   * only logged.
   */
  private async warnIfWalPublication(): Promise<void> {
    try {
      const publications = await sql.outboxPublications(this.db, this.options.schema);
      if (publications.length > 0) {
        this.logger.warn(
          { schema: this.options.schema, publications },
          "A publication streams this schema's outbox_events to logical replication (a WAL source): a table relay " +
            'publishes the rows WAL writers wrote without their per-key order. Run one kind of relay per schema (docs/wal-source.md).',
        );
      }
    } catch (err) {
      this.logger.debug({ err }, 'could not read the publications of the outbox table');
    }
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
    this.wake.stop();
    this.health.stop();
    clearInterval(this.maintainTimer);
    const cleanerStopped = this.cleaner.stop();
    clearInterval(this.recheckTimer);
    if (this.loopDone) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([this.loopDone, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
      clearTimeout(timer);
    }
    await this.maintaining;
    await cleanerStopped;
    await this.readAhead?.rows;
    this.readAhead = undefined;
    await this.marks.settle().catch(() => undefined);
    try {
      await this.lanes.releaseAll();
      await sql.deregisterInstance(this.db, this.q, this.relayId);
    } catch (err) {
      this.logger.warn({ err }, 'could not release lanes at stop; they free up when the lease expires');
    }
    this.lanes.clear();
    await this.wake.close();
    const admin = this.admin;
    this.admin = undefined;
    if (admin) await admin.connecting.then(() => this.health.disconnectQuietly(admin.client)).catch(() => undefined);
    await this.health.close();
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

  /**
   * Renews, takes and gives back lanes so that live relays share them evenly; stands down instead
   * when the relay has failed to publish for longer than a lease.
   */
  private async maintainLanes(): Promise<void> {
    if (this.stopping) return;
    const failingMs = this.health.standDownDue();
    if (failingMs !== undefined) {
      if (await this.clusterAnswers()) {
        this.logger.info(
          { failingMs: Math.round(failingMs), blocked: this.blockedPartitions().length },
          'sends failed for longer than a lease, but the cluster answers: some partitions fail, not the cluster; not standing down',
        );
        this.health.postponeStandDown();
      } else {
        await this.standDown(failingMs);
        return;
      }
    }
    const { acquired } = await this.lanes.maintain(async () => {
      // Lanes given back after the pass in flight, which may still be publishing their rows, and
      // after its marking: a late mark would fail the fencing check and the rows go out again.
      await this.currentPass;
      await this.marks.settle().catch(() => undefined);
    });
    await this.wake.check();
    this.emit('relay:lanes', { held: this.heldLanes() });
    // New lanes may hold a backlog that no notification will announce.
    if (acquired > 0) this.wake.wakeUp();
    // An idle relay learns of a broker outage from a probe, not from a send. In the background:
    // never delays the renewals.
    if (this.health.probeDue(this.maintainEveryMs)) void this.health.probe();
  }

  /** Interval of lane maintenance (renewals, probes), in ms: a third of a lease. */
  private get maintainEveryMs(): number {
    return Math.max(200, Math.floor(this.options.leaseMs / 3));
  }

  /** A lane maintenance after the one running, if any (renewals and stand-downs never overlap). */
  private maintainSoon(): void {
    if (this.stopping) return;
    this.maintaining = this.maintaining
      .then(() => this.maintainLanes())
      .catch((err: Error) => {
        this.logger.warn({ err }, 'lane maintenance failed');
      });
  }

  /**
   * A relay that cannot publish (its producer does not connect, or every pass fails) for longer
   * than one lease stands down: it releases its lanes and leaves the live instances, so that a
   * healthy relay takes them over, instead of holding their events back. It keeps trying the
   * producer on each maintenance tick and rejoins once it connects.
   */
  private async standDown(failingMs: number): Promise<void> {
    if (this.health.enterStandDown()) {
      this.logger.warn(
        { failingMs: Math.round(failingMs), lanes: this.lanes.size },
        'cannot publish to Kafka for longer than a lease: releasing lanes until the producer works again',
      );
      this.emit('relay:standing-down', { failingMs });
    }
    const released = await this.lanes.releaseAll(async () => {
      // A pass that holds rows may still send or mark them: the lanes go after it. One that waits
      // for a producer has read nothing, and sends nothing once the lanes are gone (stillOwned).
      if (this.passHoldsRows) await this.currentPass;
      await this.marks.settle().catch(() => undefined);
    });
    if (released.length > 0) this.emit('relay:lanes', { held: [] });
    await sql.deregisterInstance(this.db, this.q, this.relayId);
    // A fresh producer that connects is the sign to rejoin (if sends still fail, the relay stands
    // down again one lease later). A connect the broker does not answer goes on in the background.
    await this.health.awaitProducer();
    if (!this.stopping && this.health.rejoin()) {
      this.logger.info({}, 'Kafka producer connected again; rejoining the relays');
    }
  }

  private async loop(): Promise<void> {
    let failures = 0;
    while (!this.stopping) {
      let published = 0;
      const began = performance.now();
      try {
        const pass = this.pass().finally(() => (this.passHoldsRows = false));
        this.currentPass = pass.catch(() => undefined);
        const { read, sent } = await pass;
        published = sent;
        failures = 0;
        this.emit('relay:pass', { read, sent, durationMs: performance.now() - began });
      } catch (err) {
        failures++;
        this.health.failing();
        this.readAhead = undefined;
        // The producer is dropped at once (`producerConnected` false) and a new one connects.
        const rebuilt = this.health.awaitProducer();
        await this.marks.settle().catch(() => undefined);
        const error = err instanceof Error ? err : new Error(String(err));
        this.logger.warn({ err: error, attempt: failures }, 'relay pass failed; backing off');
        this.emit('relay:error', { error, attempt: failures });
        await rebuilt;
        await this.wake.sleep(this.failureBackoffMs(failures), false);
        continue;
      }
      // A pass that read less than a full batch saw every visible row of its lanes: the next rows
      // come with a notification (which cuts the sleep short) or are found by the next poll. Only
      // after a full batch is the table read again at once (no empty read per event at low rates).
      if (published === 0 || !this.morePending) await this.wake.sleep(this.options.pollIntervalMs);
    }
  }

  /**
   * The sleep after the `failures`-th failed pass in a row, in ms: exponential with full jitter up
   * to `retryMaxMs`; at most {@link PARTITION_RECHECK_MS} while the cluster answers metadata
   * requests (it did within `brokerTimeoutMs`): its brokers are there and take writes again as soon
   * as enough replicas are back, and a relay that slept `retryMaxMs` then would add up to that much
   * to the outage.
   */
  private failureBackoffMs(failures: number): number {
    const backoff = fullJitterBackoffMs(failures, this.options.retryInitialMs, this.options.retryMaxMs);
    const clusterAnswers = performance.now() - this.metadataAnsweredAt < this.options.brokerTimeoutMs;
    return clusterAnswers ? Math.min(backoff, PARTITION_RECHECK_MS) : backoff;
  }

  /**
   * One pass: read pending rows of held lanes, publish them, queue the marking of what the broker
   * acknowledged. Resolves to the rows read and the rows acknowledged.
   */
  private async pass(): Promise<{ read: number; sent: number }> {
    this.morePending = false;
    const lanes = this.lanes.valid();
    if (lanes.length === 0) return { read: 0, sent: 0 };
    if (!this.health.producer) {
      await this.health.awaitProducer();
      if (!this.health.producer) throw noProducer(this.options.brokerTimeoutMs);
    }
    const producer = this.health.producer;
    const o = this.options;
    const read = {
      lanes: lanes.map((l) => l.lane),
      maxRows: o.batchSize,
      maxBytes: o.maxBatchBytes,
      holdKeys: o.holdKeyBehindFailure,
    };
    const leases = lanes.map((l) => `${l.lane}:${l.token}`).join(',');
    const wake = this.wake;
    // A batch read ahead while the previous one was sent, if read under the same leases.
    const ahead = this.readAhead;
    this.readAhead = undefined;
    let aheadRows = ahead?.leases === leases ? await ahead.rows : undefined;
    // A read ahead that found nothing says nothing of rows whose notification came while it ran
    // (they may have committed after its snapshot), and that notification's wake-up may already be
    // spent: read again rather than sleep until the next poll.
    if (aheadRows?.length === 0 && ahead!.wakes !== wake.wakes) aheadRows = undefined;
    // Wake-ups (notifications) counted when this batch's read began: a higher count now means rows
    // may have committed after its snapshot.
    const wakesAtRead = aheadRows && ahead ? ahead.wakes : wake.wakes;
    // Rows acknowledged but not marked yet are still pending in the table: not read again meanwhile.
    const rows =
      aheadRows ??
      (await sql.readPending(this.db, this.q, { ...read, ...this.waiting(), exclude: this.marks.pendingSeqs() }));
    if (rows.length === 0) return { read: 0, sent: 0 };
    const owned = this.lanes.stillOwned(rows, lanes);
    // Rows for a topic-partition that cannot take writes wait, and so do later rows of their keys
    // (the next reads skip those keys): only what can go out is sent.
    const { send: sendable, waiting } = this.gate ? this.gate.split(owned) : { send: owned, waiting: [] };
    if (waiting.length > 0) this.morePending = true;
    if (sendable.length === 0) return { read: rows.length, sent: 0 };
    this.passHoldsRows = true;
    if (this.isolateNext) {
      await this.marks.settle();
      // The last batch failed: a send per topic-partition, one per row only within the refused
      // chunk, so that a record at fault (too large, topic gone...) is found and only it counts an
      // attempt. A broker outage fails the first send and the loop backs off. Back to the batched
      // path (read ahead, marking queue) once a whole pass went through.
      const published = await this.isolate(sendable, lanes);
      this.isolateNext = false;
      this.morePending = true;
      return { read: rows.length, sent: published };
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
    this.morePending ||= pageRows >= o.batchSize || pageRows > rows.length;
    let inFlight = true;
    const readNext = (): void => {
      if (this.readAhead || this.stopping) return;
      const wakes = wake.wakes;
      const next = {
        leases,
        wakes,
        rows: sql
          .readPending(this.db, this.q, {
            ...read,
            ...this.waiting(),
            exclude: [...this.marks.pendingSeqs(), ...rows.map((r) => r.seq)],
          })
          .catch(() => undefined), // the next pass reads again
      };
      this.readAhead = next;
      if (!o.listen) return;
      // Nothing new yet and this batch still in flight: read again at the next notification (or
      // now, if one came during this read).
      void next.rows.then((found) => {
        if (!inFlight || this.readAhead !== next || found?.length !== 0) return;
        this.readAhead = undefined;
        if (wake.wakes !== wakes) readNext();
        else wake.onWake = readNext;
      });
    };
    if (this.morePending || (o.listen && wake.wakes !== wakesAtRead)) readNext();
    else if (o.listen) wake.onWake = readNext;
    let acked = 0;
    let failure: KafkaFailure | undefined;
    const sendStarted = this.health.sendStarted();
    try {
      await crashPoint('relay:before-send');
      // Chunks go one after another, so a key's order holds across them. Each is bounded: kafkajs
      // retries a broker that is gone for seconds, and waits `requestTimeout` (30 s) for one that
      // does not answer, while this relay should be giving its lanes to a healthy one.
      for (const chunk of chunks) {
        failure = firstFailure(await withDeadline(producer.send(chunk), o.brokerTimeoutMs, 'a send'));
        if (failure) throw failure.error;
        acked += chunk.length;
      }
      this.health.sendSucceeded();
    } catch (err) {
      this.readAhead = undefined;
      // The rows of failed chunks stay pending; those the broker acknowledged are marked.
      this.marks.add(markBatch(sendable.slice(0, acked), leases, lanes));
      // The cluster answered that a partition cannot take writes (no leader, too few in-sync
      // replicas): the relay asks which one; its rows wait from the next pass on, the others go
      // out in batches. The client recovers by itself: no new producer, no failure streak (the
      // kafkajs producer takes a new producer id before its next send after any failed one:
      // src/kafka/kafkajs/producer.ts).
      if (await this.explained(failure, sendable.slice(acked))) {
        this.health.sendAnswered();
        this.morePending = true;
        return { read: rows.length, sent: acked };
      }
      this.health.sendFailed(sendStarted);
      // Otherwise kafkajs may report a record's fault as another error (its internal retry of a
      // partly written batch ends in OUT_OF_ORDER_SEQUENCE_NUMBER), so the error's kind is not
      // trusted here: the next pass isolates.
      this.isolateNext = true;
      throw err;
    } finally {
      inFlight = false;
      wake.onWake = undefined;
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
    return { read: rows.length, sent: sendable.length };
  }

  /**
   * When a stand-down comes due: whether the cluster as a whole answers this relay, so that its
   * failures come from some partitions (a leader that died and is not replaced yet, a partition
   * without a leader or with too few in-sync replicas), not from the cluster. A peer relay would
   * meet the same partitions, so releasing the lanes would only stop their other partitions too. True
   * when the cluster answered a metadata request since the failure streak began and answers one for
   * the failing topics now (within {@link metadataTimeoutMs}). A relay that cannot reach the cluster
   * (unreachable, frozen, rejected credentials: its metadata requests fail too) stands down at
   * once: the first condition fails without a request.
   */
  private async clusterAnswers(): Promise<boolean> {
    const gate = this.gate;
    const since = this.health.failingSinceMs;
    if (!gate || since === undefined || this.metadataAnsweredAt < since) return false;
    try {
      await this.refreshGate(gate, [...new Set([...this.failedTopics, ...gate.blockedTopics()])]);
      return true;
    } catch {
      return false;
    }
  }

  /** What the read skips: the keys and keyless topics that wait for a blocked partition. */
  private waiting(): { waitingKeys: string[]; closedTopics: string[] } {
    return this.gate
      ? { waitingKeys: this.gate.keys(), closedTopics: this.gate.closedTopics() }
      : { waitingKeys: [], closedTopics: [] };
  }

  /**
   * Whether a failed send of `rows` is explained by a partition that cannot take writes. When the
   * cluster answered so (`failure.partitionUnavailable`), the relay asks it which partitions at once
   * (see {@link blockedBy}); a connection error or a timeout says nothing of the cluster's state, so
   * the relay treats it as before (failure streak, new producer, backoff) and asks in the
   * background, for its next pass, without delaying what the outage of a whole cluster needs.
   */
  private async explained(failure: KafkaFailure | undefined, rows: readonly sql.PendingRow[]): Promise<boolean> {
    if (failure?.partitionUnavailable) return this.blockedBy(rows);
    void this.blockedBy(rows);
    return false;
  }

  /** True when a failed send of `rows` is explained by a partition that cannot take writes (see {@link partitionVerdict}). */
  private async blockedBy(rows: readonly sql.PendingRow[]): Promise<boolean> {
    return (await this.partitionVerdict(rows)) === 'blocked';
  }

  /**
   * After a failed send of `rows`: asks the cluster for the partitions of their topics (twice at
   * most, a new admin client the second time: the first may have asked a dead broker; each bounded
   * by {@link metadataTimeoutMs}). `'blocked'`: one of the rows goes to a partition that cannot take
   * writes (it waits from now on, see relay/partitions.ts); `'answered'`: the cluster answers and
   * names none (a leader that just died is not replaced yet); `'unreachable'`: the cluster did not
   * answer, or the relay has no Kafka client to ask.
   */
  private async partitionVerdict(rows: readonly sql.PendingRow[]): Promise<'blocked' | 'answered' | 'unreachable'> {
    const gate = this.gate;
    if (!gate || rows.length === 0 || this.stopping) return 'unreachable';
    const topics = rows.map((r) => r.topic);
    this.failedTopics = [...new Set(topics)];
    let answered = false;
    for (let attempt = 0; attempt < 2 && !answered && !this.stopping; attempt++) {
      try {
        await this.refreshGate(gate, topics);
        answered = true;
      } catch (err) {
        this.logger.warn({ err, attempt }, 'the cluster did not answer a metadata request after a failed send');
      }
    }
    if (!answered) return 'unreachable';
    return gate.split(rows).waiting.length > 0 ? 'blocked' : 'answered';
  }

  /**
   * Longest wait for a metadata request of the partition checks, in ms: a cluster that answers
   * does so in milliseconds, and a relay whose whole cluster is down must not wait `brokerTimeoutMs`
   * again before it backs off.
   */
  private get metadataTimeoutMs(): number {
    return Math.min(this.options.brokerTimeoutMs, 2_000);
  }

  /**
   * While some topic-partition cannot take writes: asks the cluster for it again (every
   * {@link PARTITION_RECHECK_MS}), and wakes the loop when some take writes again, so that their
   * waiting events go out at once.
   */
  private async recheckPartitions(): Promise<void> {
    const gate = this.gate;
    if (!gate?.anyBlocked || this.rechecking || this.stopping) return;
    this.rechecking = true;
    try {
      const waitingBefore = gate.keys().length;
      await this.refreshGate(gate, gate.blockedTopics());
      if (gate.keys().length < waitingBefore) this.wake.wakeUp();
    } catch (err) {
      this.logger.debug({ err }, 'partition recheck failed');
    } finally {
      this.rechecking = false;
    }
  }

  /** Refreshes the gate's view of `topics`; emits `relay:partitions` when the blocked set changed. */
  private async refreshGate(gate: PartitionGate, topics: readonly string[]): Promise<void> {
    const changes = gate.changes;
    await gate.refresh(topics);
    if (gate.changes !== changes) this.emit('relay:partitions', { blocked: gate.blocked() });
  }

  /**
   * `fn` with the relay's admin client (connected on first use), bounded by {@link metadataTimeoutMs}. A
   * failure drops the client (disconnected once its connect settles); the next call makes a new one.
   */
  private async withAdmin<T>(what: string, fn: (admin: KafkaAdmin) => Promise<T>): Promise<T> {
    const timeoutMs = this.metadataTimeoutMs;
    // stop() disconnects the admin client: no new one after it (a refresh in the background may still ask).
    if (this.stopping) throw new LifecycleError('the relay is stopping');
    let conn = this.admin;
    if (!conn) {
      const client = this.client!.admin();
      conn = this.admin = { client, connecting: client.connect() };
    }
    try {
      await withDeadline(conn.connecting, timeoutMs, 'an admin connect');
      return await withDeadline(fn(conn.client), timeoutMs, what);
    } catch (err) {
      if (this.admin === conn) this.admin = undefined;
      const dropped = conn;
      void dropped.connecting.catch(() => undefined).then(() => this.health.disconnectQuietly(dropped.client));
      throw err;
    }
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
          void connecting.catch(() => undefined).then(() => this.health.disconnectQuietly(admin));
          throw err;
        }
        try {
          const limits = await withDeadline(readTopicLimits(admin, unknown), timeoutMs, 'a topic configuration read');
          for (const [topic, bytes] of limits) this.maxMessageBytes.set(topic, bytes);
        } catch (err) {
          this.logger.warn({ err, topics: unknown }, 'could not read max.message.bytes; using maxBatchBytes');
        } finally {
          await this.health.disconnectQuietly(admin);
        }
      }
    }
    // Keep 10 % below the topic's limit, and never above maxBatchBytes.
    return (topic) => Math.min(fallback, Math.floor((this.maxMessageBytes.get(topic) ?? fallback) * 0.9));
  }

  /**
   * The fencing check refused part of a marking (`marked` of `sent` rows) on `lanes`: their sends
   * stop until the next renewal (see `Lanes.fenceOut`).
   */
  private fencedOut(lanes: ReadonlySet<number>, sent: number, marked: number): void {
    this.lanes.fenceOut(lanes);
    this.logger.warn(
      { sent, marked, lanes: lanes.size },
      'marking refused by the fencing check (lanes taken over or released): their sends stop until the next lease renewal',
    );
  }

  /**
   * Sends the rows of a pass after a batch failed for a reason the cluster's metadata did not
   * explain, so that a record at fault (too large, topic deleted or forbidden) is found and only it
   * counts an attempt: one send per topic-partition first (rows of one key go to one partition, in
   * order), and one send per row only for the rows of the one send (a chunk of the topic's byte
   * limit) that the broker refused for a record's sake; the rows after it go out in batches again.
   * A record larger than its topic's limit is a chunk of its own, so it is the only suspect. So the
   * isolation costs a send per partition and per suspect row, not one per row of the batch. Later
   * rows of a failing key are not sent in this pass (per-key order).
   */
  private async isolate(rows: sql.PendingRow[], lanes: LaneLease[]): Promise<number> {
    const failedKeys = new Set<string>();
    const notHeld = (r: sql.PendingRow) => r.key === null || !failedKeys.has(r.key);
    let published = 0;
    /** The error of a partition that took nothing, for no reason the cluster gave (its leader just died). */
    let unsent: unknown;
    let stop = false;
    for (const group of this.byPartition(rows)) {
      let rest = group.filter(notHeld);
      while (rest.length > 0 && !stop) {
        let suspects = rest;
        if (rest.length > 1) {
          const sent = await this.sendGroup(rest, lanes);
          if (sent.fenced) {
            stop = true;
            break;
          }
          published += sent.acked;
          if (!sent.failure) break;
          const left = rest.slice(sent.acked);
          if (sent.failure.kind !== 'record') {
            // The partition failed, not a row: its rows (and keys) wait for a later pass, the other
            // partitions go on, unless the cluster as a whole does not answer.
            const verdict = await this.partitionVerdict(left);
            if (verdict === 'unreachable') {
              this.health.sendFailed(sent.startedAt);
              throw sent.failure.error;
            }
            this.health.sendAnswered();
            if (verdict === 'answered') unsent ??= sent.failure.error;
            for (const r of left) if (r.key !== null) failedKeys.add(r.key);
            break;
          }
          // A row of the chunk the broker refused is at fault: only that chunk's rows are suspects.
          // The failed send may have left the idempotent producer's sequence numbers ahead of the
          // broker's (see isolateRows): they are sent one by one by a new producer.
          if (!(await this.freshProducer())) {
            stop = true;
            break;
          }
          suspects = left.slice(0, sent.failedRows);
          rest = left.slice(sent.failedRows);
        } else {
          rest = [];
        }
        const outcome = await this.isolateRows(suspects, lanes, failedKeys);
        published += outcome.published;
        unsent ??= outcome.unsent;
        if (outcome.stop) stop = true;
        // The rows after the suspects go out in batches again, but those of a key that failed.
        rest = rest.filter(notHeld);
      }
      if (stop) break;
    }
    if (published > 0) this.emit('relay:published', { count: published, marked: published, lanes: lanes.length });
    // Nothing went out, and a partition failed for no reason the cluster gave: the pass fails
    // (backoff, and a failure streak that ends with the next acknowledged send).
    if (published === 0 && unsent !== undefined) throw unsent;
    return published;
  }

  /**
   * `rows` in groups of one topic-partition each, in the order of their first row. A row whose
   * partition is not known (no key, no metadata of its topic, no Kafka client to ask) is a group of
   * its own: it is sent alone.
   */
  private byPartition(rows: readonly sql.PendingRow[]): sql.PendingRow[][] {
    const groups = new Map<string, sql.PendingRow[]>();
    const out: sql.PendingRow[][] = [];
    for (const row of rows) {
      const partition = this.gate?.partitionOf(row);
      if (partition === undefined) {
        out.push([row]);
        continue;
      }
      const id = `${row.topic}\0${partition}`;
      let group = groups.get(id);
      if (!group) {
        groups.set(id, (group = []));
        out.push(group);
      }
      group.push(row);
    }
    return out;
  }

  /**
   * Sends the rows of one topic-partition in batches (split by the topic's byte limit) and marks
   * what was acknowledged: `acked` rows before the first failed batch, its `failure` (a timeout is
   * a broker failure) and `failedRows` (the rows of that batch, after the acknowledged ones),
   * `fenced` when the marking was refused by the fencing check, and when the send started (ms of
   * the health clock).
   */
  private async sendGroup(
    rows: readonly sql.PendingRow[],
    lanes: LaneLease[],
  ): Promise<{ acked: number; failure?: KafkaFailure; failedRows: number; fenced: boolean; startedAt: number }> {
    const records = rows.map(toRecord);
    const chunks = splitByTopicLimit(records, await this.topicLimits(records));
    let acked = 0;
    let failedRows = 0;
    let failure: KafkaFailure | undefined;
    const startedAt = this.health.sendStarted();
    try {
      for (const chunk of chunks) {
        failedRows = chunk.length;
        failure = firstFailure(
          await withDeadline(this.health.producer!.send(chunk), this.options.brokerTimeoutMs, 'a send'),
        );
        if (failure) break;
        acked += chunk.length;
        failedRows = 0;
      }
    } catch (err) {
      failure = { kind: 'broker', error: err instanceof Error ? err : new Error(String(err)) };
    }
    // A record's fault is an answer of the broker; what a broker failure means is decided by the caller.
    if (!failure || failure.kind === 'record') this.health.sendSucceeded();
    if (acked === 0) return { acked, failure, failedRows, fenced: false, startedAt };
    const marked = await sql.markPublished(
      this.scope,
      rows.slice(0, acked).map((r) => r.seq),
      lanes,
    );
    if (marked > 0) this.emit('relay:marked', { rows: marked });
    if (marked < acked) {
      this.fencedOut(new Set(rows.map((r) => r.lane)), acked, marked);
      return { acked: marked, failure, failedRows, fenced: true, startedAt };
    }
    return { acked, failure, failedRows, fenced: false, startedAt };
  }

  /** Drops the producer and connects a new one; false when none connected (or the relay stops). */
  private async freshProducer(): Promise<boolean> {
    if (this.stopping) return false;
    await this.health.awaitProducer();
    if (this.health.producer) return true;
    if (this.stopping) return false; // stop() came during the rebuild, which then made no producer
    throw noProducer(this.options.brokerTimeoutMs);
  }

  /**
   * Sends `rows` one at a time, so that only the guilty rows count an attempt; adds the keys of
   * failed rows to `failedKeys` and skips their later rows. A broker failure not explained by a
   * blocked partition rejects (the loop backs off). `stop`: the pass ends here (fenced out, or
   * stopping).
   */
  private async isolateRows(
    rows: readonly sql.PendingRow[],
    lanes: LaneLease[],
    failedKeys: Set<string>,
  ): Promise<{ published: number; stop: boolean; unsent?: unknown }> {
    const tokens = new Map(lanes.map((l) => [l.lane, l.token]));
    let published = 0;
    let unsent: unknown;
    for (const row of rows) {
      if (row.key !== null && failedKeys.has(row.key)) continue;
      if (this.lanes.stillOwned([row], lanes).length === 0) continue;
      const sendStarted = this.health.sendStarted();
      let failure: KafkaFailure | undefined;
      try {
        const sent = await withDeadline(
          this.health.producer!.send([toRecord(row)]),
          this.options.brokerTimeoutMs,
          'a send',
        );
        failure = firstFailure(sent);
        if (failure && failure.kind !== 'record') throw failure.error;
      } catch (err) {
        // Its partition cannot take writes, or failed while the cluster answers: the row and its
        // key wait for a later pass; the others go on. The cluster does not answer: the pass fails.
        const verdict = await this.partitionVerdict([row]);
        if (verdict === 'unreachable') {
          this.health.sendFailed(sendStarted);
          throw err;
        }
        this.health.sendAnswered();
        if (row.key !== null) failedKeys.add(row.key);
        if (verdict === 'answered') unsent ??= err;
        continue;
      }
      this.health.sendSucceeded(); // acknowledged, or the broker answered that this record is at fault (not the relay)
      if (failure) {
        if (row.key !== null) failedKeys.add(row.key);
        const attempts = row.attempts + 1;
        const message = `${failure.code ?? 'error'}: ${failure.error.message}`;
        const backoffMs =
          this.options.retryInitialMs +
          fullJitterBackoffMs(attempts, this.options.retryInitialMs, this.options.retryMaxMs);
        const parked = await sql.recordFailure(this.scope, {
          row,
          token: tokens.get(row.lane)!,
          error: message,
          backoffMs,
          maxAttempts: this.options.maxAttempts,
        });
        this.logger.warn(
          { eventId: row.event_id, topic: row.topic, attempts, parked, error: message },
          parked ? 'event parked' : 'event publish failed',
        );
        this.emit('relay:failed', { eventId: row.event_id, attempts, parked, error: message });
        // kafkajs' idempotent producer counts the rejected record's sequence number although the
        // broker did not, so its next send to that partition would fail OUT_OF_ORDER_SEQUENCE_NUMBER:
        // start over with a new producer id. Stopping: no new producer (stop() disconnects this
        // one); the rows left stay pending.
        if (!(await this.freshProducer())) return { published, stop: true, unsent };
        continue;
      }
      const marked = await sql.markPublished(this.scope, [row.seq], lanes);
      if (marked > 0) this.emit('relay:marked', { rows: marked });
      if (marked === 0) {
        this.fencedOut(new Set([row.lane]), 1, 0);
        return { published, stop: true, unsent };
      }
      published += marked;
    }
    return { published, stop: false, unsent };
  }
}

function markBatch(rows: readonly sql.PendingRow[], leases: string, held: readonly LaneLease[]): MarkBatch {
  return { seqs: rows.map((r) => r.seq), lanes: [...new Set(rows.map((r) => r.lane))], leases, held };
}

function payloadBytes(rows: readonly sql.PendingRow[]): number {
  let n = 0;
  for (const r of rows) n += r.payload.length;
  return n;
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
