/**
 * Options of the dedup consumer: one interface (what each option means, its unit and default), one
 * frozen defaults object, one declaration of the values (src/options.ts).
 */
import { z } from 'zod';
import { KAFKA_TOPIC_NAME } from '../src/outbox/event.js';
import { isKafkaClient, isKafkajsKafka, type Kafka } from '../src/kafka/kafkajs/client.js';
import type { KafkaClient } from '../src/kafka/types.js';
import type { DatabaseHandle, TransactionOf } from '../src/database.js';
import { isDrizzleTransaction } from '../src/drizzle-entity.js';
import { InvalidOptionsError } from '../src/errors.js';
import { noopLogger, type Logger } from '../src/logger.js';
import {
  boolean,
  fn,
  integer,
  parseOptions,
  retryDelays,
  retryDelaysInOrder,
  sentence,
  SHARED_OPTIONS,
  value,
} from '../src/options.js';
import { HEADER_EVENT_ID } from '../src/outbox/event.js';
import { DEFAULT_SCHEMA } from '../src/constants.js';
import { quoteSchema } from '../src/schema-name.js';
import { DEAD_LETTER_TOPIC_SUFFIX } from './dead-letter.js';
import type { ConsumedEvent, EventDecoder } from './consumed-event.js';
import { DEFAULT_INBOX_RETENTION_MS } from './inbox-cleanup.js';

/** What the handler receives for one event. */
export interface HandlerContext<D extends DatabaseHandle> {
  /**
   * The transaction that also holds the event's inbox row: a `pg.PoolClient` inside BEGIN when
   * `database` is a `pg.Pool`, drizzle's `tx` when it is a drizzle database. Write the event's
   * effects through it (and only through it): they commit together with the inbox row, or not
   * at all. Do not commit, roll back or keep it past the handler's promise.
   */
  tx: TransactionOf<D>;
  /** The event. */
  event: ConsumedEvent;
  /**
   * Aborted when the consumer stops or the partition is being taken away (rebalance). A handler
   * that stops on it has its transaction rolled back and the event runs again later (here or on
   * the partition's new owner); the interrupted run does not count as an attempt.
   */
  signal: AbortSignal;
  /**
   * Which attempt this run is on this member, from 1: the runs that counted before it, plus one.
   * Runs that ended in a database outage or were deferred by a `RetryLaterError` (within
   * `maxRetryLaterMs`) did not count.
   */
  attempt: number;
}

/** The application's handler: applies one event's effects through `ctx.tx`. */
export type DedupHandler<D extends DatabaseHandle> = (ctx: HandlerContext<D>) => Promise<void>;

/** Test-only hooks. Not part of the stable API; applications must not set them. */
export interface DedupConsumerHooks {
  /**
   * Called after the handler's transaction committed (outcome `applied`, or `duplicate` for the
   * empty transaction of a skipped event) and before the offset is resolved: the window in which
   * a crash makes Kafka redeliver an event whose effects are already committed. Crash tests kill
   * the process here. If it throws, the message is retried as after a database error.
   */
  afterCommit?(event: ConsumedEvent, outcome: 'applied' | 'duplicate'): Promise<void> | void;
}

/** Options of {@link createDedupConsumer}. */
export interface DedupConsumerOptions<D extends DatabaseHandle> {
  /**
   * The Kafka client the consumer makes its group member, its producer (dead letters) and its admin
   * client from: a kafkajs `Kafka` (`new Kafka({ clientId, brokers })`, made into a client by
   * `createKafkajsClient`, which applies the kafkajs timer fix), or an outboxkit `KafkaClient`
   * (outboxkit/kafka: `createKafkajsClient(config)` or `createPlatformaticClient(config)` for
   * @platformatic/kafka; docs/kafka.md, "Choosing a client").
   */
  kafka: Kafka | KafkaClient;
  /** The Kafka consumer group; also the inbox's `consumer_group` (dedup is per group). 1-255 characters. */
  groupId: string;
  /** The topics to consume (1 or more legal Kafka topic names). They and their dead-letter topics must exist. */
  topics: string[];
  /** Where the handler transactions run: a `pg.Pool` or a drizzle database (node-postgres or postgres-js driver). */
  database: D;
  /**
   * Applies one event; see {@link HandlerContext}. Whatever it throws (network errors of the
   * services it calls included) rolls back and counts as an attempt: retried, then dead-lettered
   * after `maxAttempts`. `InvalidMessageError` dead-letters at once; `RetryLaterError` defers
   * without counting (bounded by `maxRetryLaterMs`). Only a failure of the consumer's own database
   * connection is an outage, never counted.
   */
  handler: DedupHandler<D>;
  /** The PostgreSQL schema holding the `inbox` table. @defaultValue 'outboxkit' */
  schema?: string;
  /**
   * Names the dead-letter topic of a source topic. Must return a legal topic name that is not one
   * of the consumed topics. `outboxkit dlq replay` derives the source topic from the default
   * name; with another naming it needs `--to <topic>`. @defaultValue (topic) => `${topic}.dlq`
   */
  deadLetterTopic?: (topic: string) => string;
  /**
   * Failed runs of the handler on one message (on one member) before it is dead-lettered. Whatever
   * the handler throws counts (network errors of the services it calls included); a
   * `RetryLaterError` within `maxRetryLaterMs` and a failure of the consumer's own database
   * connection do not. A handler that throws an `InvalidMessageError` (code
   * `OUTBOXKIT_INVALID_MESSAGE`) is dead-lettered after one.
   * @defaultValue 5
   */
  maxAttempts?: number;
  /**
   * Ceiling of the first retry delay, in ms. Retry `n` waits a uniformly random time below
   * `min(retryMaxMs, retryInitialMs * 2^(n-1))` (exponential backoff, full jitter), and at least
   * until the next fetch of its partition. @defaultValue 100
   */
  retryInitialMs?: number;
  /** Largest retry delay ceiling, in ms. @defaultValue 5_000 */
  retryMaxMs?: number;
  /**
   * Longest time one message may be deferred by its handler's `RetryLaterError` without counting
   * an attempt, in ms, from its first deferral on this member (like attempt counts, it lives in
   * memory: a rebalance or restart starts it again). Each deferral waits the `delayMs` the error
   * asks for (else the backoff), cut to what is left of this time. After it, a `RetryLaterError`
   * counts as an attempt like any other error: the message is dead-lettered after `maxAttempts`
   * and its partition moves on. 0: a `RetryLaterError` always counts. Every deferral is logged
   * (warn) and counted (`consumer:retry-later`, `outboxkit_consumer_retry_later_total`).
   * @defaultValue 900_000 (15 minutes)
   */
  maxRetryLaterMs?: number;
  /**
   * PostgreSQL `lock_timeout` of each handler transaction, in ms (0: none). Bounds the wait on the
   * inbox row of a concurrent delivery of the same event, and every lock wait of the handler.
   * @defaultValue 5_000
   */
  lockTimeoutMs?: number;
  /**
   * What one PostgreSQL transaction covers.
   * - `'message'`: one transaction per message (inbox claim, handler, COMMIT), then its offset is
   *   resolved. Every applied message costs one commit (one WAL flush).
   * - `'batch'`: consecutive messages of one fetched batch (one partition) share a transaction,
   *   at most `batchMaxMessages` of them and open for at most `batchMaxMs`; each message runs
   *   inside its own SAVEPOINT, so a failing handler rolls back only its own message (which is
   *   retried or dead-lettered as in `'message'` mode, after the messages before it committed).
   *   One COMMIT per transaction; the offsets of its messages are resolved only after it.
   *   The inbox rows of the messages already run stay locked until that COMMIT, so a concurrent
   *   delivery of one of them waits longer (still bounded by `lockTimeoutMs`); a crash before the
   *   COMMIT runs the whole group again (each effect still once).
   * @defaultValue 'message'
   */
  transactionScope?: 'message' | 'batch';
  /**
   * `transactionScope: 'batch'` only: most messages in one transaction. Every message that writes
   * takes a subtransaction id; PostgreSQL caches 64 of them per transaction
   * (`PGPROC_MAX_CACHED_SUBXIDS`), beyond which every session's snapshots get slower while the
   * transaction is open, so keep it at most 64 (a warning is logged at creation above). @defaultValue 50
   */
  batchMaxMessages?: number;
  /**
   * `transactionScope: 'batch'` only: no further message joins a transaction open for this long,
   * in ms (the commit follows the message in flight). Bounds how long inbox rows stay locked and
   * offsets wait. @defaultValue 1_000
   */
  batchMaxMs?: number;
  /** Partitions handled at once (kafkajs `partitionsConsumedConcurrently`); one message at a time within a partition. @defaultValue 3 */
  partitionsConsumedConcurrently?: number;
  /** The Kafka header that carries the event id (a UUID). @defaultValue 'event-id' */
  eventIdHeader?: string;
  /** Kafka group session timeout, in ms (kafkajs `sessionTimeout`). @defaultValue 30_000 */
  sessionTimeoutMs?: number;
  /** Heartbeat interval, in ms (kafkajs `heartbeatInterval`); also paces heartbeats during long handlers. Must be below `sessionTimeoutMs`. @defaultValue 3_000 */
  heartbeatIntervalMs?: number;
  /**
   * Longest time a fetch waits for new messages, in ms (kafkajs `maxWaitTimeInMs`; Kafka's Java
   * consumer's `fetch.max.wait.ms` is 500 too). It also paces retries: while every partition a
   * fetch would read is paused for a backoff, kafkajs waits this long before it fetches again, so a
   * retry comes after max(backoff, about this wait). It bounds how long `stop()` waits for a fetch
   * in flight. Must be below `sessionTimeoutMs`: an idle member heartbeats only between fetches.
   * @defaultValue 500
   */
  fetchMaxWaitMs?: number;
  /**
   * Longest age of the consumer's Kafka metadata, in ms (kafkajs `metadataMaxAge`, Kafka's
   * `metadata.max.age.ms`). Partitions added to a consumed topic are assigned within about this
   * long: the member that sees them first rejoins, the group rebalances, and they are read from
   * their beginning. Their events wait until then (they are not lost). One small metadata request
   * per member per interval. @defaultValue 30_000
   */
  metadataMaxAgeMs?: number;
  /**
   * Interval of offset commits while a batch is processed, in ms (kafkajs `autoCommitInterval`);
   * offsets are also committed at the end of every batch. A crash redelivers at most this much
   * (as duplicates, which the inbox skips). @defaultValue 5_000
   */
  autoCommitIntervalMs?: number;
  /**
   * Where the group begins on a topic it consumes for the first time: at the earliest message of
   * each partition (true), or at the end of each (false: only events published from then on).
   * With false, the first member to start commits the end offset of every partition of the topic
   * for the group, before it joins (consumer/group-start.ts).
   *
   * Either way, a partition without a committed offset of the group after that (one added to the
   * topic while the group runs or is stopped) is read from its beginning, so every event of every
   * partition is applied once: the inbox skips what was applied before. Exception: a topic the
   * group first consumes while other members of it run (a rolling deploy that adds the topic)
   * cannot get those commits; its partitions then begin at their end when assigned (a warning
   * says so). See docs/runbooks.md, "Growing a topic".
   * @defaultValue false
   */
  fromBeginning?: boolean;
  /**
   * How long the inbox keeps an applied event's row, in ms: the dedup window of G4 (docs/guarantees.md). It must
   * exceed the longest redelivery horizon (the topics' `retention.ms`, the relay's republish
   * window); at start the consumer reads each topic's `retention.ms` and warns (log and
   * `consumer:retention-warning`) when it is not shorter. The consumer does not delete rows
   * itself: run `cleanupInbox()` or `outboxkit inbox cleanup` with the same value.
   * @defaultValue 691_200_000 (8 days, above Kafka's default 7-day retention)
   */
  inboxRetentionMs?: number;
  /**
   * Also record each partition's progress in PostgreSQL, in the transaction of the effects (table
   * `consumer_progress`: a range of applied offsets from one fetched batch, and the event id and
   * Kafka timestamp of the record at its end). A member that gets a partition after a crash, a
   * rebalance or an offset reset then skips the redelivered records the row proves applied,
   * without an inbox claim each, in a fetched batch that holds that last record again; every
   * other record (dead-lettered ones included) goes through the inbox as usual. Kafka's committed
   * offsets stay authoritative (progress never moves the consumer), and a recreated topic or a
   * later copy of an event never matches the stored record. Costs one small row update in each
   * applied message's transaction (no extra round trip with a `pg.Pool`); needs migration 0001.
   * See README "Partition progress". @defaultValue false
   */
  recordProgress?: boolean;
  /**
   * A partition this member owns is stuck when it has messages to handle (a fetched batch not
   * finished, or messages beyond it up to the high watermark of its last fetch) and made no
   * progress (no message applied, skipped as a duplicate or dead-lettered) for this long, in ms.
   * `health()` reports it, `consumer:partition-stuck` and `consumer:partition-recovered` tell the
   * transitions (logged at warn), and `consumerMetrics()` exports it per topic-partition. Set it
   * above your slowest handler run and above the longest wait you consider normal: a retry backoff
   * (`retryMaxMs`) or a `RetryLaterError` delay counts as no progress. README "Partition health".
   * @defaultValue 60_000 (1 minute)
   */
  stuckAfterMs?: number;
  /** Structured logger (pino-compatible). @defaultValue a no-op logger */
  logger?: Logger;
  /** Test-only hooks; see {@link DedupConsumerHooks}. @defaultValue none */
  hooks?: DedupConsumerHooks;
  /**
   * Deserialisation hook behind `event.decoded()`, for example `(value) => registry.decode(value)`
   * for a Confluent Schema Registry. See {@link EventDecoder}. `event.value` (bytes) and
   * `event.json()` stay available. @defaultValue none: `decoded()` parses JSON
   */
  decode?: EventDecoder;
  /**
   * Runs each handler inside an OpenTelemetry CONSUMER span (`<topic> process`), child of the
   * trace context in the message's headers (W3C `traceparent`, written by `enqueue()`), when the
   * optional peer `@opentelemetry/api` is installed and a tracer provider is registered; else
   * costs one check per message. See docs/tracing.md. @defaultValue true
   */
  tracing?: boolean;
}

/** Default values of {@link DedupConsumerOptions}. */
export const DEDUP_CONSUMER_DEFAULTS = Object.freeze({
  schema: DEFAULT_SCHEMA,
  deadLetterTopic: (topic: string): string => `${topic}${DEAD_LETTER_TOPIC_SUFFIX}`,
  maxAttempts: 5,
  retryInitialMs: 100,
  retryMaxMs: 5_000,
  maxRetryLaterMs: 900_000,
  lockTimeoutMs: 5_000,
  transactionScope: 'message' as 'message' | 'batch',
  batchMaxMessages: 50,
  batchMaxMs: 1_000,
  partitionsConsumedConcurrently: 3,
  eventIdHeader: HEADER_EVENT_ID,
  sessionTimeoutMs: 30_000,
  heartbeatIntervalMs: 3_000,
  fetchMaxWaitMs: 500,
  metadataMaxAgeMs: 30_000,
  autoCommitIntervalMs: 5_000,
  fromBeginning: false,
  inboxRetentionMs: DEFAULT_INBOX_RETENTION_MS,
  recordProgress: false,
  stuckAfterMs: 60_000,
  logger: noopLogger,
  tracing: true,
});

/** Options after defaults and validation. */
export interface ResolvedDedupConsumerOptions<D extends DatabaseHandle> extends Required<
  Omit<DedupConsumerOptions<D>, 'hooks' | 'deadLetterTopic' | 'decode'>
> {
  /** The decode hook, if any. */
  decode: EventDecoder | undefined;
  /** The quoted schema, ready for SQL. */
  schemaSql: string;
  /** Dead-letter topic of each consumed topic. */
  deadLetterTopics: ReadonlyMap<string, string>;
  hooks: DedupConsumerHooks;
}

function isDatabase(database: unknown): boolean {
  if (typeof database !== 'object' || database === null || isDrizzleTransaction(database)) return false;
  const isPool = typeof (database as { connect?: unknown }).connect === 'function' && 'totalCount' in database;
  const isDrizzle = typeof (database as { transaction?: unknown }).transaction === 'function';
  return isPool || isDrizzle;
}

/** The consumer's options, declared once: types, ranges, defaults and the rules between them. */
const dedupConsumerSchema = z
  .strictObject({
    kafka: value<Kafka | KafkaClient>(
      'a kafkajs Kafka instance (new Kafka({ clientId, brokers })) or an outboxkit KafkaClient (createPlatformaticClient(config))',
      (k) => isKafkajsKafka(k) || isKafkaClient(k),
    ),
    groupId: z
      .string({ error: 'must be a string of 1-255 characters' })
      .min(1, { error: 'must be a string of 1-255 characters' })
      .max(255, { error: 'must be a string of 1-255 characters' }),
    topics: z
      .array(z.unknown(), { error: 'must be a non-empty array of topic names' })
      .min(1, { error: 'must be a non-empty array of topic names' })
      .superRefine((topics, ctx) => {
        for (const topic of topics) {
          if (typeof topic !== 'string' || !KAFKA_TOPIC_NAME.test(topic)) {
            ctx.addIssue(
              sentence(
                `invalid topic ${JSON.stringify(topic)}: Kafka topics are 1-249 characters of letters, digits, '.', '_' and '-'.`,
              ),
            );
            return;
          }
        }
        if (new Set(topics).size !== topics.length) ctx.addIssue(sentence('topics must not repeat a topic.'));
      })
      .transform((topics) => topics as string[]),
    database: value<DatabaseHandle>(
      'a pg.Pool or a drizzle database (not a transaction, nor a pg.Client: the consumer opens one transaction per message)',
      isDatabase,
    ),
    handler: fn<DedupHandler<DatabaseHandle>>('({ tx, event, signal, attempt }) => Promise<void>'),
    schema: SHARED_OPTIONS.schema,
    deadLetterTopic: fn<(topic: string) => string>('(topic) => dead-letter topic name').default(
      () => DEDUP_CONSUMER_DEFAULTS.deadLetterTopic,
    ),
    maxAttempts: integer(1, 1_000).default(DEDUP_CONSUMER_DEFAULTS.maxAttempts),
    ...retryDelays({ initialMs: DEDUP_CONSUMER_DEFAULTS.retryInitialMs, maxMs: DEDUP_CONSUMER_DEFAULTS.retryMaxMs }),
    maxRetryLaterMs: integer(0, 2_147_483_647).default(DEDUP_CONSUMER_DEFAULTS.maxRetryLaterMs),
    lockTimeoutMs: integer(0, 2_147_483_647).default(DEDUP_CONSUMER_DEFAULTS.lockTimeoutMs),
    transactionScope: z
      .enum(['message', 'batch'], { error: "must be 'message' or 'batch'" })
      .default(DEDUP_CONSUMER_DEFAULTS.transactionScope),
    batchMaxMessages: integer(1, 10_000).default(DEDUP_CONSUMER_DEFAULTS.batchMaxMessages),
    batchMaxMs: integer(0, 2_147_483_647).default(DEDUP_CONSUMER_DEFAULTS.batchMaxMs),
    partitionsConsumedConcurrently: integer(1, 1_000).default(DEDUP_CONSUMER_DEFAULTS.partitionsConsumedConcurrently),
    eventIdHeader: z
      .string({ error: 'must be a non-empty string' })
      .min(1, { error: 'must be a non-empty string' })
      .default(DEDUP_CONSUMER_DEFAULTS.eventIdHeader),
    sessionTimeoutMs: integer(1).default(DEDUP_CONSUMER_DEFAULTS.sessionTimeoutMs),
    heartbeatIntervalMs: integer(1).default(DEDUP_CONSUMER_DEFAULTS.heartbeatIntervalMs),
    fetchMaxWaitMs: integer(0).default(DEDUP_CONSUMER_DEFAULTS.fetchMaxWaitMs),
    metadataMaxAgeMs: integer(100, 86_400_000).default(DEDUP_CONSUMER_DEFAULTS.metadataMaxAgeMs),
    autoCommitIntervalMs: integer(0).default(DEDUP_CONSUMER_DEFAULTS.autoCommitIntervalMs),
    fromBeginning: boolean().default(DEDUP_CONSUMER_DEFAULTS.fromBeginning),
    inboxRetentionMs: integer(1).default(DEDUP_CONSUMER_DEFAULTS.inboxRetentionMs),
    recordProgress: boolean().default(DEDUP_CONSUMER_DEFAULTS.recordProgress),
    // The upper bound is a timer's (setTimeout fires at once beyond 2^31 - 1 ms).
    stuckAfterMs: integer(1, 2_147_483_647).default(DEDUP_CONSUMER_DEFAULTS.stuckAfterMs),
    logger: SHARED_OPTIONS.logger,
    hooks: value<DedupConsumerHooks>('an object', (h) => typeof h === 'object' && h !== null).default(() => ({})),
    decode: fn<EventDecoder>('(value, event) => decoded value').optional(),
    tracing: boolean().default(DEDUP_CONSUMER_DEFAULTS.tracing),
  } satisfies Record<keyof DedupConsumerOptions<DatabaseHandle>, z.ZodType>)
  .superRefine((o, ctx) => {
    retryDelaysInOrder(o, ctx);
    // The broker expels a member that sends no heartbeat for a session: one per interval must fit.
    if (o.heartbeatIntervalMs >= o.sessionTimeoutMs) {
      ctx.addIssue(
        sentence(
          `heartbeatIntervalMs (${o.heartbeatIntervalMs}) must be below sessionTimeoutMs (${o.sessionTimeoutMs}); a third of it is usual.`,
        ),
      );
    }
    // An idle member heartbeats only between fetches (kafkajs's runner; the keep-alive covers
    // batches being processed), and a fetch of idle partitions waits fetchMaxWaitMs: a wait as long
    // as the session would expel the member at every idle fetch, each time a rebalance.
    if (o.fetchMaxWaitMs >= o.sessionTimeoutMs) {
      ctx.addIssue(
        sentence(
          `fetchMaxWaitMs (${o.fetchMaxWaitMs}) must be below sessionTimeoutMs (${o.sessionTimeoutMs}): an idle member ` +
            'heartbeats only between fetches, so a longer fetch wait expels it from the group. ' +
            `Lower fetchMaxWaitMs (default ${DEDUP_CONSUMER_DEFAULTS.fetchMaxWaitMs}) or raise sessionTimeoutMs.`,
        ),
      );
    }
  });

/**
 * Applies defaults and validates once.
 *
 * @throws {@link InvalidOptionsError} naming the unknown option names, if any (and listing the
 * known ones), else the first invalid option and the accepted values.
 */
export function resolveDedupConsumerOptions<D extends DatabaseHandle>(
  options: DedupConsumerOptions<D>,
): ResolvedDedupConsumerOptions<D> {
  const { deadLetterTopic: namer, ...o } = parseOptions(dedupConsumerSchema, options, 'createDedupConsumer');
  const deadLetterTopics = new Map<string, string>();
  for (const topic of o.topics) {
    const dlq = namer(topic);
    if (typeof dlq !== 'string' || !KAFKA_TOPIC_NAME.test(dlq)) {
      throw new InvalidOptionsError(
        `createDedupConsumer: deadLetterTopic(${JSON.stringify(topic)}) returned ${JSON.stringify(dlq)}, which is not a legal Kafka topic name.`,
      );
    }
    if (o.topics.includes(dlq)) {
      throw new InvalidOptionsError(
        `createDedupConsumer: deadLetterTopic(${JSON.stringify(topic)}) returned a consumed topic (${dlq}); a failing message would loop forever.`,
      );
    }
    deadLetterTopics.set(topic, dlq);
  }
  return {
    ...o,
    database: o.database as D,
    handler: o.handler as unknown as DedupHandler<D>,
    decode: o.decode,
    schemaSql: quoteSchema(o.schema),
    deadLetterTopics,
  };
}
