/**
 * outboxkit's own view of a Kafka client: what the relay, the dedup consumer and the CLI need from
 * one, in outboxkit's terms. Every kafkajs call of the library sits behind these interfaces, in
 * src/kafka/kafkajs/ (`createKafkajsClient()`); another client (@platformatic/kafka is the next
 * one) implements the same interfaces and nothing else changes.
 *
 * The shapes follow what outboxkit needs, not kafkajs: a send reports an outcome per record, topic
 * configurations come back as name → value, offsets are decimal strings (Kafka offsets are 64-bit).
 * Where the two clients differ, the doc comment says how each one implements the method.
 *
 * No import of kafkajs here, not even of its types.
 */
import { optionNames, refuseUnknownOptions } from '../errors.js';

/** A header value as a client takes or gives it. */
export type RecordHeaderValue = Buffer | string;

/**
 * A record's headers. A name that occurs more than once in the record is an array of its values,
 * in order (kafkajs reads them so); `undefined` entries are ignored.
 */
export type RecordHeaders = Record<string, RecordHeaderValue | RecordHeaderValue[] | undefined>;

/** A record to produce, without its topic: what dead letters and replays are made of. */
export interface ProducerMessage {
  key: Buffer | string | null;
  /** Null produces a tombstone. */
  value: Buffer | null;
  headers?: RecordHeaders;
  /** The partition to write to; absent: the partitioner chooses by key (murmur2, as Kafka's Java client). */
  partition?: number;
}

/** A record to produce. */
export interface ProducerRecord extends ProducerMessage {
  topic: string;
}

/** One record the relay publishes: an outbox row (a narrower {@link ProducerRecord}). */
export interface OutboundRecord {
  topic: string;
  key: string | null;
  value: Buffer;
  headers: Record<string, string>;
}

/** Why a record was not written. */
export interface KafkaFailure {
  /**
   * `'record'`: a property of the record or its topic (too large, topic missing or forbidden,
   * invalid record); sending it again fails the same way. `'broker'`: the connection or the
   * cluster (broker down, leader moving, timeout); the same record may pass later.
   */
  kind: 'record' | 'broker';
  /** The Kafka protocol error name, when the broker gave one: `MESSAGE_TOO_LARGE`, `UNKNOWN_TOPIC_OR_PARTITION`... */
  code?: string;
  /**
   * True when the cluster answered that a partition of the send cannot take writes now: it has no
   * leader (or the client knows of no broker for its leader), its leader moved, or it has fewer
   * in-sync replicas than `min.insync.replicas` (NOT_ENOUGH_REPLICAS). The relay then asks the
   * cluster which partitions, and holds back only their events (relay/partitions.ts). Absent for a
   * connection error or a timeout, which say nothing of where the fault is.
   */
  partitionUnavailable?: boolean;
  /** The client's error, as it came. */
  error: Error;
}

/** What became of one record of a send. */
export type RecordOutcome = { ok: true; partition?: number; offset?: string } | { ok: false; failure: KafkaFailure };

/** What a send did: `outcomes[i]` belongs to `records[i]`. */
export interface SendResult {
  outcomes: RecordOutcome[];
}

/** Compression codecs (Kafka's names). A client may need a codec package for some of them. */
export type CompressionCodec = 'none' | 'gzip' | 'snappy' | 'lz4' | 'zstd';

/**
 * Settings of {@link KafkaClient.producer}. The producer is always idempotent with acks=all, one
 * request in flight per connection and no topic auto-creation: the relay's no-loss and per-key
 * order guarantees depend on those, so they are not settings.
 */
export interface ProducerSettings {
  /** Broker-side acknowledgement timeout of one produce request, in ms. @defaultValue 30_000 */
  requestTimeoutMs?: number;
  /** The client's retries inside one send before it reports the send failed. @defaultValue 5 */
  retries?: number;
  /** First delay between those retries, in ms. @defaultValue the client's own retry setting */
  retryInitialMs?: number;
  /** Largest delay between those retries, in ms. @defaultValue the client's own retry setting */
  retryMaxMs?: number;
  /**
   * Record batch compression: a codec name, or Kafka's codec id (0 none, 1 gzip, 2 snappy, 3 lz4,
   * 4 zstd; the values of kafkajs's `CompressionTypes`, accepted as before). @defaultValue 'none'
   */
  compression?: CompressionCodec | number;
  /**
   * Longest age of the producer's cluster metadata, in ms: at its first send after this long it
   * asks the cluster again, and from then on writes to partitions added to a topic meanwhile (keys
   * then move: docs/runbooks.md, "Growing a topic"). Kafka's `metadata.max.age.ms`.
   * @defaultValue the client's (kafkajs and Kafka's Java client: 300_000)
   */
  metadataMaxAgeMs?: number;
  /**
   * Longest a send may take, in ms, its wait behind the send before it and the client's retries
   * included. Past it the send fails as a broker failure (records of it may still be written), and
   * the client's producer it went through is closed and replaced (a new producer id) for the next
   * send, which so does not wait behind a request the broker holds or the client still retries.
   * The relay gives its `brokerTimeoutMs`. Honoured by the @platformatic/kafka adapter; the kafkajs
   * adapter ignores it (its sends are unbounded as before; the relay's own deadline bounds its
   * wait). @defaultValue none
   */
  sendTimeoutMs?: number;
  /** Called after every send with its record count, duration in ms and whether all went through (metrics). A throw is ignored. */
  onSend?: (sent: { records: number; durationMs: number; ok: boolean }) => void;
}

/** Every name of {@link ProducerSettings}; the compiler keeps it in step with the interface. */
export const PRODUCER_SETTING_NAMES = optionNames<ProducerSettings>({
  requestTimeoutMs: true,
  retries: true,
  retryInitialMs: true,
  retryMaxMs: true,
  compression: true,
  metadataMaxAgeMs: true,
  sendTimeoutMs: true,
  onSend: true,
});

/** {@link ProducerSettings} with the defaults both adapters share filled in. */
export type ResolvedProducerSettings = Required<
  Pick<ProducerSettings, 'retries' | 'requestTimeoutMs' | 'compression'>
> &
  Omit<ProducerSettings, 'retries' | 'requestTimeoutMs' | 'compression'>;

/**
 * Checks `settings` for unknown names and fills in the shared defaults (5 retries, a 30_000 ms
 * request timeout, no compression); the retry delays and metadata age stay the client's own when
 * absent.
 *
 * @throws `InvalidOptionsError` (src/errors.ts) naming an unknown setting.
 */
export function resolveProducerSettings(settings: ProducerSettings = {}): ResolvedProducerSettings {
  refuseUnknownOptions(settings ?? {}, PRODUCER_SETTING_NAMES, 'producer');
  const { retries = 5, requestTimeoutMs = 30_000, compression = 'none', ...rest } = settings ?? {};
  return { ...rest, retries, requestTimeoutMs, compression };
}

/**
 * A producer. Sends are serialised (at most one in flight, whoever calls): an idempotent producer
 * can assign broken sequence numbers under concurrent sends (kafkajs does: test/relay/cases.test.ts,
 * "concurrent sends on an idempotent producer").
 */
export interface KafkaProducer {
  /**
   * Connects. Rejects with the client's error when the cluster cannot be reached. (kafkajs
   * connects here; @platformatic/kafka connects on first use, so its adapter asks the cluster's
   * metadata here instead.)
   */
  connect(): Promise<void>;
  /**
   * Publishes `records` and resolves once the broker acknowledged them (acks=all) or refused them:
   * `outcomes[i]` says what became of `records[i]`. It does not reject for a Kafka failure; a
   * record not acknowledged has a failure, and may still have been written (at least once).
   *
   * Granularity depends on the client. kafkajs fails a whole request: every record of a failed send
   * gets the same failure, and no record carries its partition or offset (kafkajs reports those per
   * partition). A client that reports per partition (@platformatic/kafka, whose errors name the
   * topic-partition) fails only the records of the partitions that failed.
   */
  send(records: readonly ProducerRecord[]): Promise<SendResult>;
  /**
   * Resolves when the cluster answers a metadata request (no topics), rejects with the client's
   * error otherwise: how an idle relay learns of an outage. Absent when the producer cannot tell
   * (a `RelayProducer` given to the relay without a Kafka client). kafkajs asks through an admin
   * client of the same `Kafka` instance, connected on the first probe, dropped after a failed one
   * and disconnected with the producer; @platformatic/kafka asks through the producer's own
   * `metadata()`.
   */
  probe?(): Promise<void>;
  /** Disconnects (after the send in flight, if any). */
  disconnect(): Promise<void>;
}

/** A topic to create (kafkajs's `ITopicConfig` fits). */
export interface TopicSpec {
  topic: string;
  /** Partitions; absent or -1: the broker's `num.partitions`. */
  numPartitions?: number;
  /** Replication factor; absent or -1: the broker's `default.replication.factor`. */
  replicationFactor?: number;
  /** Topic configurations, such as `{ name: 'retention.ms', value: '604800000' }`. */
  configEntries?: { name: string; value: string }[];
}

/** A topic's partitions and their leaders, from a metadata request. */
export interface TopicPartitions {
  name: string;
  /**
   * `leader` is the broker id of the partition's leader, null while it has none (an election);
   * `replicas` the broker ids of its assigned replicas (their count is the replication factor),
   * `isr` those of its in-sync replicas, when the client reports them.
   */
  partitions: { partition: number; leader: number | null; replicas?: number[]; isr?: number[] }[];
}

/** A partition's earliest (`low`) and log-end (`high`) offsets, decimal strings. */
export interface PartitionOffsets {
  partition: number;
  low: string;
  high: string;
}

/**
 * An admin client. Each method rejects with the client's error (see
 * {@link KafkaClient.isRetriable}).
 */
export interface KafkaAdmin {
  connect(): Promise<void>;
  disconnect(): Promise<void>;
  /** Resolves when the cluster answers a metadata request without topics (kafkajs `describeCluster`). */
  probe(): Promise<void>;
  /**
   * The names of every topic of the cluster. A metadata request for all topics: unlike one that
   * names topics, it can never auto-create one.
   */
  listTopics(): Promise<string[]>;
  /** Partitions and leaders of `topics` (kafkajs `fetchTopicMetadata`; @platformatic/kafka `metadata`). */
  describeTopics(topics: readonly string[]): Promise<TopicPartitions[]>;
  /**
   * The values of `configNames` of each of `topics` (DescribeConfigs, without synonyms), by topic
   * then name: `max.message.bytes`, `retention.ms`... A value the broker hides (a sensitive one) is
   * null; a name the broker did not return is absent.
   */
  describeTopicConfigs(
    topics: readonly string[],
    configNames: readonly string[],
  ): Promise<Map<string, Record<string, string | null>>>;
  /**
   * Creates one topic and waits for its partitions' leaders. `'exists'` when the topic existed
   * (also when another process created it meanwhile). kafkajs resolves `createTopics` to false
   * then; @platformatic/kafka fails with TOPIC_ALREADY_EXISTS, which its adapter turns into
   * `'exists'`.
   *
   * @throws `InvalidOptionsError` when the broker refuses the topic for what it asks
   *   (INVALID_CONFIG, INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, INVALID_REPLICA_ASSIGNMENT,
   *   INVALID_TOPIC_EXCEPTION, POLICY_VIOLATION, TOPIC_AUTHORIZATION_FAILED): the message names the
   *   topic, the error and the reason; `cause` is the client's error (src/kafka/topic-refused.ts).
   *   Other errors are the client's.
   */
  createTopic(spec: TopicSpec): Promise<'created' | 'exists'>;
  /** Each partition's earliest and log-end offsets (ListOffsets; kafkajs `fetchTopicOffsets`). */
  partitionOffsets(topic: string): Promise<PartitionOffsets[]>;
  /** Deletes a consumer group (it must have no members). */
  deleteGroup(groupId: string): Promise<void>;
  /**
   * The offsets group `groupId` committed for each partition of `topic` (OffsetFetch), decimal
   * strings; null for a partition without one. Every partition of the topic is listed.
   */
  groupOffsets(groupId: string, topic: string): Promise<{ partition: number; offset: string | null }[]>;
  /**
   * Commits `offsets` of `topic` for group `groupId` from outside the group, all in one request
   * (OffsetCommit without a member id and with generation -1, as Kafka's AdminClient
   * `alterConsumerGroupOffsets`). Kafka accepts such a commit only while the group has no
   * members: `'group-active'` when it has some (UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS,
   * ILLEGAL_GENERATION), and nothing is committed. kafkajs has no public call for it: its adapter
   * sends the request through a kafkajs cluster of its own (src/kafka/kafkajs/group-offsets.ts);
   * @platformatic/kafka's `alterConsumerGroupOffsets` is that request.
   */
  commitGroupOffsets(
    groupId: string,
    topic: string,
    offsets: readonly { partition: number; offset: string }[],
  ): Promise<'committed' | 'group-active'>;
}

/** A consumed record. kafkajs's `KafkaMessage` fits. */
export interface InboundMessage {
  key: Buffer | null;
  /** Null for a tombstone. */
  value: Buffer | null;
  /** Raw headers: a repeated name is an array of its values, in order (both adapters). */
  headers?: RecordHeaders;
  /** Its offset, a decimal string. */
  offset: string;
  /** Its Kafka timestamp in ms since the epoch, a decimal string (-1 when the record has none). */
  timestamp: string;
}

/**
 * The records of one partition from one fetch, handed to {@link GroupConsumerRun.eachBatch}, with
 * what the consumer needs to keep its offsets right. Marked offsets are committed by the client
 * (see {@link GroupConsumerRun.autoCommitIntervalMs}), never an unmarked one.
 */
export interface InboundBatch {
  readonly topic: string;
  readonly partition: number;
  /** In offset order; control records and aborted transactions' records left out. */
  readonly messages: readonly InboundMessage[];
  /**
   * The offset the fetch began at (every record from there to the first message is one there is
   * nothing to handle for: a control record, an aborted one, one compacted away), when the client
   * tells; kafkajs does (its `Batch#fetchedOffset`, outside its typings).
   */
  readonly fetchedOffset?: string;
  /** The partition's high watermark when fetched, a decimal string. */
  readonly highWatermark: string;
  /**
   * The offset of the last record the fetch returned, filtered ones included, or the high
   * watermark minus one when it returned none (kafkajs `Batch#lastOffset()`).
   */
  readonly lastOffset: string;
  /**
   * Marks the record at `offset` processed, and with it those before it: the client fetches from
   * the next one and may commit it (kafkajs `resolveOffset`; marking the last message also marks
   * the control records after it). Nothing is ever marked without this call.
   */
  markProcessed(offset: string): void;
  /** Commits the marked offsets if the commit interval has passed (kafkajs `commitOffsetsIfNecessary`). */
  commitIfDue(): Promise<void>;
  /**
   * Tells the group coordinator this member is alive. Rejects with the client's error; one for
   * which {@link GroupConsumer.isRebalance} is true means the partitions may go: end the batch
   * by throwing it out of `eachBatch`, the client then commits what is marked and rejoins.
   * kafkajs throttles heartbeats to its interval. @platformatic/kafka heartbeats by itself: its
   * adapter sends nothing here, and rejects with a rebalance error once the group rebalanced since
   * the batch began (a revoked partition also shows through {@link InboundBatch.isActive}).
   */
  heartbeat(): Promise<void>;
  /**
   * False once the consumer stops, or the batch went stale (a seek; a revoked partition): stop
   * processing it (kafkajs `isRunning() && !isStale()`).
   */
  isActive(): boolean;
  /**
   * Pauses this partition: no more fetches of it until the returned function resumes it, from
   * the first unmarked record. kafkajs pauses the partition itself; @platformatic/kafka's adapter
   * runs its own fetch loop, which leaves a paused partition out and, on resume, fetches it again
   * from its first unmarked record.
   */
  pause(): () => void;
}

/** Settings of {@link KafkaClient.groupConsumer}. Topics are never auto-created. */
export interface GroupConsumerSettings {
  groupId: string;
  /** Group session timeout, in ms. @defaultValue the client's (kafkajs: 30_000) */
  sessionTimeoutMs?: number;
  /** Heartbeat interval, in ms. @defaultValue the client's (kafkajs: 3_000) */
  heartbeatIntervalMs?: number;
  /** Longest time a fetch waits for new records, in ms. @defaultValue the client's (kafkajs: 5_000) */
  fetchMaxWaitMs?: number;
  /**
   * Longest age of the member's cluster metadata, in ms: how soon it sees partitions added to a
   * subscribed topic, and rejoins its group so that they are assigned (Kafka's
   * `metadata.max.age.ms`). @defaultValue the client's (kafkajs and Kafka's Java client: 300_000)
   */
  metadataMaxAgeMs?: number;
}

/** How {@link GroupConsumer.run} consumes. */
export interface GroupConsumerRun {
  /** Partitions whose batches run at once (one batch at a time per partition). @defaultValue 1 */
  concurrency?: number;
  /**
   * Commit the marked offsets at most this often while batches run, in ms, and also after each
   * batch, before a rebalance and when disconnecting. Absent: never commit (a reader whose group
   * is thrown away). @platformatic/kafka's adapter turns its own autocommit off (it would commit
   * what it fetched) and commits what is marked, checking the group generation itself.
   */
  autoCommitIntervalMs?: number;
  /**
   * Processes one partition's batch. What it throws ends the batch: the client commits what is
   * marked, then rejoins on a rebalance error, restarts the consumer on a retriable error, and
   * crashes on any other (see {@link GroupConsumerEvents.crash}). @platformatic/kafka's adapter
   * fetches with its own loop (the client's one stream has no per-partition pause or seek) and
   * makes one batch per partition and fetch.
   */
  eachBatch(batch: InboundBatch): Promise<void>;
}

/** What a {@link GroupConsumer} reports. */
export interface GroupConsumerEvents {
  /** This member joined the group (again): the partitions it now owns, by topic. */
  join: { assignment: Record<string, number[]> };
  /**
   * The consumer failed: `willRestart` when the client restarts it itself; otherwise nothing is
   * consumed any more.
   */
  crash: { error: Error; willRestart: boolean };
}

/**
 * A member of a consumer group: what the dedup consumer and `dlq list` need. The order of calls:
 * `connect`, `subscribe`, `run`, and at the end `disconnect`.
 */
export interface GroupConsumer {
  connect(): Promise<void>;
  /**
   * Subscribes to `topics`. `fromBeginning`: where a partition of theirs without a committed offset
   * of the group starts (also one added to the topic later, or one whose committed offset fell out
   * of the topic's retention): at its earliest record, else at its end. May be called more than
   * once before `run`, each call with its own `fromBeginning` for its topics.
   */
  subscribe(topics: readonly string[], options: { fromBeginning: boolean }): Promise<void>;
  /** Starts consuming in the background; resolves once started (not when the group is joined: see the `join` event). */
  run(options: GroupConsumerRun): Promise<void>;
  /**
   * Stops consuming (the batches in flight finish), commits what is marked, leaves the group and
   * disconnects.
   */
  disconnect(): Promise<void>;
  /** Listens to an event; returns the function that removes the listener. */
  on<K extends keyof GroupConsumerEvents>(event: K, listener: (payload: GroupConsumerEvents[K]) => void): () => void;
  /**
   * Whether an error of {@link InboundBatch.heartbeat} means the group is rebalancing or this
   * member left it (kafkajs: REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
   * NOT_COORDINATOR_FOR_GROUP, FENCED_INSTANCE_ID).
   */
  isRebalance(error: unknown): boolean;
}

/** One Kafka client (one cluster, one set of credentials), making outboxkit's producers, admins and consumers. */
export interface KafkaClient {
  /** A new producer, not connected. Throws an `InvalidOptionsError` naming an unknown setting. */
  producer(settings?: ProducerSettings): KafkaProducer;
  /** A new admin client, not connected. */
  admin(): KafkaAdmin;
  /** A new group member, not connected. */
  groupConsumer(settings: GroupConsumerSettings): GroupConsumer;
  /**
   * The partition its producers write a record with key `key` to, of a topic with
   * `partitionCount` partitions: Kafka's Java-client partitioner (murmur2 of the key's UTF-8 bytes,
   * positive, modulo the count), which every client must match (docs/kafka.md). The relay uses it
   * to tell which pending events go to a partition that cannot take writes.
   */
  partitionForKey(key: string | Buffer, partitionCount: number): number;
  /**
   * Whether an error of this client may pass on a later attempt (kafkajs: its `retriable` flag,
   * through its retries-exceeded and aggregate errors; @platformatic/kafka: `canRetry`).
   */
  isRetriable(error: unknown): boolean;
}
