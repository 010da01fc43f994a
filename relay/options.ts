/**
 * The relay's options: what each one means, its unit and default, and their validation (once, before
 * anything connects).
 */
import { hostname } from 'node:os';
import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { z } from 'zod';
import type { Logger } from '../src/logger.js';
import { DEFAULT_SCHEMA } from '../src/constants.js';
import * as option from '../src/options.js';
import type { Kafka } from '../src/kafka/kafkajs/client.js';
import type { RelayProducer } from '../src/kafka/kafkajs/producer.js';
import type { KafkaClient, ProducerSettings } from '../src/kafka/types.js';

/** The Kafka client libraries the relay can make its client with. */
export const KAFKA_CLIENT_NAMES = ['kafkajs', 'platformatic'] as const;
export type KafkaClientName = (typeof KAFKA_CLIENT_NAMES)[number];

/**
 * The retention cleanup's options, the same for both relays (this one and the WAL relay,
 * relay/wal/wal-relay.ts; the cleanup is relay/cleanup.ts): published rows past their retention
 * are deleted by one relay at a time, the table relay holding lane 0 or the WAL relay holding the
 * slot's reader lease.
 */
export interface RetentionOptions {
  /**
   * How long published rows are kept before deletion, in ms. Never less than 65 min in effect
   * (`EVENT_ID_REUSE_WINDOW_MS`): a published row refuses a reused explicit event id for as long
   * as the writer would accept that id (docs/events.md, Event ids). @defaultValue 86_400_000 (24 h)
   */
  publishedRetentionMs?: number;
  /**
   * Interval of the retention cleanup, in ms (run by one relay: the table relay holding lane 0,
   * the WAL relay holding the slot's reader lease): how often it looks for published rows past
   * `publishedRetentionMs`. A cleanup that finds a backlog goes on, paced by
   * `cleanupRowsPerSecond`, until the backlog is gone. @defaultValue 60_000
   */
  cleanupIntervalMs?: number;
  /** Most rows deleted by one cleanup statement. @defaultValue 1_000 */
  cleanupBatchSize?: number;
  /**
   * Pace of the retention cleanup, in rows per second: after each full batch the cleaner waits
   * so that it deletes at most this many rows per second on average, leaving the database to the
   * writers (bench/cleanup.ts measures the writers' p99 with and without it). 0 deletes batches
   * back to back. With the defaults, a backlog of 1,000,000 published rows is deleted in about
   * 8 min 20 s. @defaultValue 2_000
   */
  cleanupRowsPerSecond?: number;
}

/** Options of {@link Relay}. */
export interface RelayOptions extends RetentionOptions {
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
   * The client library of the Kafka client the relay makes from `brokers`: `'kafkajs'`, or
   * `'platformatic'` for @platformatic/kafka (an optional peer dependency, `^1.35.0 || ^2.12.1`: `start()` rejects with
   * `KafkaClientUnavailableError` when it is missing, of an unsupported version or too new for
   * this Node.js). Both partition keys as Kafka's Java client does, so switching keeps each key on
   * its partition (docs/kafka.md, "Choosing a client"). Only with `brokers`: a client given as
   * `kafka` is already one or the other (`createPlatformaticClient()` of outboxkit/kafka).
   * @defaultValue 'kafkajs'
   */
  kafkaClient?: KafkaClientName;
  /**
   * A producer to use instead of the client's (tests, other clients). Its `send` rejects when a
   * record was not acknowledged; the rejection is read as kafkajs's (a record's fault or the
   * broker's, by its error type).
   */
  producer?: RelayProducer;
  /**
   * Tunable settings of the producer (compression, timeouts, retries, metadata age); never its
   * safety settings. `metadataMaxAgeMs` (default {@link RELAY_PRODUCER_DEFAULTS}: 30_000) bounds
   * how long after a topic grows the relay starts writing to its new partitions (docs/runbooks.md,
   * "Growing a topic").
   */
  producerOptions?: Pick<ProducerSettings, 'requestTimeoutMs' | 'retries' | 'compression' | 'metadataMaxAgeMs'>;
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
  /**
   * Lane lease length, in ms: how long a dead relay's lanes stay blocked. Must be above
   * `brokerTimeoutMs`. @defaultValue 10_000
   */
  leaseMs?: number;
  /**
   * Longest wait for Kafka, in ms: for a send's acknowledgement (kafkajs' own retries included), a
   * producer's connect, and the probe of an idle relay (every third of a lease). Past it the broker
   * counts as unreachable: the send fails with {@link BrokerUnavailableError} (its rows stay
   * pending and go again: at least once), `producerConnected` and readiness turn false, the relay
   * backs off and, after `leaseMs` of failing, stands down. Must be below `leaseMs` (else
   * {@link InvalidOptionsError}); keep it above the slowest acknowledgement of a healthy cluster
   * (acks=all). @defaultValue 5_000
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
   * Logger. Also gets kafkajs's own log entries (warn and above: `kafkajs: <message>` with
   * kafkajs's `namespace`, `broker`...) of the kafkajs client the relay makes from `brokers`;
   * without a logger those go to kafkajs's console logger. A `kafka` instance you pass keeps its own
   * logging (docs/kafka.md, "kafkajs's log"). @defaultValue no-op
   */
  logger?: Logger;
}

/** Resolved relay options: the settings, defaults applied (the connections and the logger are the caller's). */
export type ResolvedRelayOptions = Omit<
  z.output<typeof relayOptionsSchema>,
  'connectionString' | 'pool' | 'brokers' | 'kafka' | 'producer' | 'producerOptions' | 'logger'
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
  cleanupRowsPerSecond: 2_000,
});

/**
 * Defaults of the relay's `producerOptions` that differ from the client's: kafkajs (like Kafka's
 * Java producer) refreshes its metadata every 5 min, and until then writes nothing to partitions
 * added to a topic.
 */
export const RELAY_PRODUCER_DEFAULTS = Object.freeze({
  /** ms. */
  metadataMaxAgeMs: 30_000,
});

/** `producerOptions` of the relays (this one and the WAL relay, relay/wal/wal-relay.ts), declared once. */
export const RELAY_PRODUCER_OPTIONS_SCHEMA = z.strictObject({
  requestTimeoutMs: z.number().optional(),
  retries: z.number().optional(),
  compression: z.union([z.string(), z.number()]).optional(),
  metadataMaxAgeMs: option.integer(100, 86_400_000).optional(),
} satisfies Record<keyof NonNullable<RelayOptions['producerOptions']>, z.ZodType>);

/**
 * `brokers`, `kafka` and `kafkaClient` of the relays (this one and the WAL relay,
 * relay/wal/wal-relay.ts), declared once: spread into each relay's options schema.
 */
export const RELAY_KAFKA_OPTIONS_SHAPE = {
  brokers: option.value<string[]>('an array of host:port strings', Array.isArray).optional(),
  kafka: option
    .value<Kafka | KafkaClient>(
      'a kafkajs Kafka or an outboxkit KafkaClient',
      (v) => typeof v === 'object' && v !== null,
    )
    .optional(),
  kafkaClient: z
    .enum(KAFKA_CLIENT_NAMES, { error: `must be one of ${KAFKA_CLIENT_NAMES.join(', ')}` })
    .default('kafkajs'),
} satisfies Record<'brokers' | 'kafka' | 'kafkaClient', z.ZodType>;

/**
 * The retention cleanup's options of the relays (this one and the WAL relay,
 * relay/wal/wal-relay.ts), declared once with their defaults ({@link RELAY_DEFAULTS}): spread into
 * each relay's options schema.
 */
export const RELAY_RETENTION_OPTIONS_SHAPE = {
  publishedRetentionMs: option.integer(0).default(RELAY_DEFAULTS.publishedRetentionMs),
  cleanupIntervalMs: option.integer(100).default(RELAY_DEFAULTS.cleanupIntervalMs),
  cleanupBatchSize: option.integer(1).default(RELAY_DEFAULTS.cleanupBatchSize),
  cleanupRowsPerSecond: option.integer(0).default(RELAY_DEFAULTS.cleanupRowsPerSecond),
} satisfies Record<keyof RetentionOptions, z.ZodType>;

/** The relay's options, declared once: types, ranges, defaults and the rules between them. */
const relayOptionsSchema = z
  .strictObject({
    connectionString: option.value<string>('a PostgreSQL connection string', (v) => typeof v === 'string').optional(),
    pool: option.value<pg.Pool>('a pg.Pool', (v) => typeof v === 'object' && v !== null).optional(),
    ...RELAY_KAFKA_OPTIONS_SHAPE,
    producer: option
      .value<RelayProducer>('a producer with connect, send and disconnect', (v) => typeof v === 'object' && v !== null)
      .optional(),
    producerOptions: RELAY_PRODUCER_OPTIONS_SCHEMA.optional(),
    schema: option.SHARED_OPTIONS.schema,
    relayId: z
      .string({ error: 'must be a string' })
      .default(() => `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`),
    batchSize: option.integer(1).default(RELAY_DEFAULTS.batchSize),
    maxBatchBytes: option.integer(1).default(RELAY_DEFAULTS.maxBatchBytes),
    pollIntervalMs: option.integer(10).default(RELAY_DEFAULTS.pollIntervalMs),
    listen: option.boolean().default(RELAY_DEFAULTS.listen),
    leaseMs: option.integer(1_000).default(RELAY_DEFAULTS.leaseMs),
    brokerTimeoutMs: option.integer(100).default(RELAY_DEFAULTS.brokerTimeoutMs),
    ...option.retryDelays({ initialMs: RELAY_DEFAULTS.retryInitialMs, maxMs: RELAY_DEFAULTS.retryMaxMs }, 1),
    verifyTopics: option.boolean().default(RELAY_DEFAULTS.verifyTopics),
    maxAttempts: option.integer(1).default(RELAY_DEFAULTS.maxAttempts),
    holdKeyBehindFailure: option.boolean().default(RELAY_DEFAULTS.holdKeyBehindFailure),
    ...RELAY_RETENTION_OPTIONS_SHAPE,
    logger: option.SHARED_OPTIONS.logger,
  } satisfies Record<keyof RelayOptions, z.ZodType>)
  .superRefine((o, ctx) => {
    option.retryDelaysInOrder(o, ctx);
    brokerTimeoutBelowLease(o, ctx);
    if (!o.pool && !o.connectionString) ctx.addIssue(option.sentence('The relay needs `connectionString` or `pool`.'));
    if (!o.producer && !o.kafka && !(o.brokers && o.brokers.length > 0)) {
      ctx.addIssue(option.sentence('The relay needs `brokers`, `kafka` or `producer`.'));
    }
    if (o.kafkaClient !== 'kafkajs' && (o.kafka || o.producer)) {
      ctx.addIssue(
        option.sentence(
          `kafkaClient (flag --kafka-client) chooses the client the relay makes from \`brokers\`; with \`kafka\` or \`producer\` ` +
            'it would be ignored. Give `kafka: createPlatformaticClient(config)` (outboxkit/kafka) instead, or only `brokers`.',
        ),
      );
    }
  });

/**
 * The rule between `brokerTimeoutMs` and `leaseMs`: a relay counts a failure only when a wait for
 * Kafka ends (up to `brokerTimeoutMs`), and stands down `leaseMs` after its failing began
 * (relay/broker-health.ts). A timeout as long as the lease would let a hung broker keep the relay
 * holding every lane for the whole timeout, past the lease that bounds how long a dead relay
 * blocks them. Named by option and by CLI flag (the CLI shows only the flags).
 */
function brokerTimeoutBelowLease(o: { brokerTimeoutMs: number; leaseMs: number }, ctx: z.RefinementCtx): void {
  if (o.brokerTimeoutMs < o.leaseMs) return;
  ctx.addIssue(
    option.sentence(
      `brokerTimeoutMs (flag --broker-timeout-ms) must be below leaseMs (flag --lease-ms), got ${o.brokerTimeoutMs} and ${o.leaseMs}: ` +
        'a send waits up to brokerTimeoutMs and the relay stands down only after leaseMs of failing, so a hung broker ' +
        'would keep it holding its lanes past their lease. Lower brokerTimeoutMs or raise leaseMs ' +
        `(defaults ${RELAY_DEFAULTS.brokerTimeoutMs} and ${RELAY_DEFAULTS.leaseMs}).`,
    ),
  );
}

/**
 * Validates relay options once (`new Relay()` and `createRelay()` call it before connecting).
 *
 * @throws {@link InvalidOptionsError} naming the unknown option names, if any (of the options or of
 *   `producerOptions`, listing the known ones), else the first invalid option, else the first rule
 *   between options that fails (`retryMaxMs` ≥ `retryInitialMs`, `brokerTimeoutMs` < `leaseMs`).
 */
export function resolveRelayOptions(options: RelayOptions): ResolvedRelayOptions {
  return option.parseOptions(relayOptionsSchema, options, 'createRelay');
}
