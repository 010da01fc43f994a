/**
 * The kafkajs {@link KafkaProducer}: idempotent, acks=all, one request in flight, sends serialised,
 * every record of a send given the send's outcome. Also the producer of before the Kafka boundary
 * (`createKafkajsProducer`, `RelayProducer`), kept as deprecated aliases of `outboxkit/relay`.
 */
import { CompressionTypes, Partitioners, type Kafka, type Producer, type ProducerConfig } from 'kafkajs';
import { BrokerUnavailableError, optionNames, refuseUnknownOptions } from '../../errors.js';
import { serialisedSends, throwIfFailed } from '../outcomes.js';
import {
  resolveProducerSettings,
  type CompressionCodec,
  type KafkaAdmin,
  type KafkaClient,
  type KafkaFailure,
  type KafkaProducer,
  type OutboundRecord,
  type ProducerMessage,
  type ProducerSettings,
} from '../types.js';
import { kafkajsAdmin } from './admin.js';
import { failureOf } from './errors.js';

/**
 * The producer settings the relay's guarantees depend on; user settings cannot override them.
 * - `idempotence: true` with `acks: -1` (all in-sync replicas): no duplicates from internal
 *   retries, no loss on leader change.
 * - `maxInFlightRequests: 1`: kafkajs allows unlimited in-flight requests by default, which can
 *   reorder batches of one partition on retry.
 * - finite `retry.retries`: with idempotence kafkajs otherwise retries almost forever, so a
 *   failure never surfaces to the relay (which rebuilds the producer and backs off instead).
 */
export const SAFE_PRODUCER_CONFIG = Object.freeze({
  idempotent: true,
  maxInFlightRequests: 1,
  allowAutoTopicCreation: false,
} satisfies ProducerConfig);

/** One kafkajs DefaultPartitioner, used only for keyed records (for which it keeps no state). */
let keyPartitioner: ReturnType<typeof Partitioners.DefaultPartitioner> | undefined;

/**
 * The partition kafkajs's DefaultPartitioner (Java-compatible murmur2, the one
 * {@link kafkajsProducer} uses) gives a record with key `key` in a topic of `partitionCount`
 * partitions (`KafkaClient.partitionForKey`). A keyed choice depends only on the key and the count.
 */
export function kafkajsPartitionForKey(key: string | Buffer, partitionCount: number): number {
  keyPartitioner ??= Partitioners.DefaultPartitioner();
  const partitionMetadata = Array.from({ length: partitionCount }, (_, partitionId) => ({
    partitionId,
    leader: 0,
    replicas: [],
    isr: [],
    offlineReplicas: [],
    partitionErrorCode: 0,
  }));
  return keyPartitioner({ topic: '', partitionMetadata, message: { key, value: null } });
}

/** kafkajs's codec of each name (its `CompressionTypes` are Kafka's codec ids). */
const CODECS: Record<CompressionCodec, CompressionTypes> = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD,
};

/**
 * A kafkajs-backed {@link KafkaProducer} (see {@link KafkaClient.producer}). Java-compatible
 * murmur2 partitioner (a key lands where a Java producer would put it). A failed send fails every
 * one of its records with the same {@link KafkaFailure}: kafkajs fails a request as a whole.
 *
 * After a failed send, the next send first replaces the kafkajs producer by a new one (a new
 * producer id from the cluster, sequence numbers from 0; a failed replacement fails that send,
 * and the next one tries again). kafkajs 2.2.4 takes back the sequence numbers of every
 * partition of a Produce request that failed as a whole (eosManager.updateSequence with a
 * negative increment in producer/sendMessages.js), also of partitions the broker wrote: one
 * partition's error in a request that covers several, or a response lost with its broker (a
 * leader killed after its followers had the batch). Its next batch to such a partition reuses
 * sequence numbers the broker already holds; when its first sequence number and its record count
 * equal a batch among the last five the broker keeps per producer and partition, the broker
 * answers it as a duplicate, with that batch's offset, and writes nothing: the send succeeds and
 * its records are not in the topic (found on the 3-node cluster across a leader kill: 38 records
 * of one send, test/cluster/local-cluster.test.ts). Other counts meet OUT_OF_ORDER_SEQUENCE_NUMBER
 * until one matches. A new producer id has no batches at the broker to be mistaken for.
 *
 * @throws {@link InvalidOptionsError} naming an unknown setting (before creating the producer).
 */
export function kafkajsProducer(kafka: Kafka, settings: ProducerSettings = {}): KafkaProducer {
  const { retries, retryInitialMs, retryMaxMs, requestTimeoutMs, compression, metadataMaxAgeMs, onSend } =
    resolveProducerSettings(settings);
  // The partition kafkajs chose for each message of a send (its last choice, retries included).
  const assigned = new WeakMap<object, number>();
  const makeProducer = (): Producer =>
    kafka.producer({
      ...SAFE_PRODUCER_CONFIG,
      // kafkajs refreshes it before a send once older than this: the partitioner then sees
      // partitions added to a topic.
      ...(metadataMaxAgeMs === undefined ? {} : { metadataMaxAge: metadataMaxAgeMs }),
      // Java-compatible murmur2 of the key: the same partition a Java producer would choose. Naming
      // it also spares every start kafkajs's "v2.0.0 switched default partitioner" warning. Each
      // choice is remembered, so that a send's answer can be checked against it
      // (unacknowledgedPartitions).
      createPartitioner: () => {
        const choose = Partitioners.DefaultPartitioner();
        return (args) => {
          const partition = choose(args);
          assigned.set(args.message, partition);
          return partition;
        };
      },
      // The client's own retry timing unless the caller sets it (kafkajs merges the two).
      retry: {
        retries,
        ...(retryInitialMs === undefined ? {} : { initialRetryTime: retryInitialMs }),
        ...(retryMaxMs === undefined ? {} : { maxRetryTime: retryMaxMs }),
      },
    });
  let producer = makeProducer();
  /**
   * Set by a failed send: the kafkajs producer is replaced (a new producer id) before the next
   * send. See {@link kafkajsProducer}'s doc: its sequence numbers may be behind the broker's.
   */
  let suspect = false;
  /** disconnect() was called: a replacement made meanwhile is disconnected, not kept. */
  let closed = false;
  const codec = typeof compression === 'number' ? compression : CODECS[compression];
  /** A new kafkajs producer (a new producer id, sequence numbers from 0) in place of a suspect one. */
  const replaceProducer = async (): Promise<void> => {
    const old = producer;
    producer = makeProducer();
    await old.disconnect().catch(() => undefined);
    await producer.connect();
    suspect = false;
    // disconnect() came while this one connected: it disconnected the old one only.
    if (closed) await producer.disconnect().catch(() => undefined);
  };
  const probes = prober(() => kafkajsAdmin(kafka));
  return {
    connect: () => {
      closed = false;
      return producer.connect();
    },
    async disconnect() {
      closed = true;
      const closing = probes.close();
      try {
        await producer.disconnect();
      } finally {
        await closing;
      }
    },
    probe: () => probes.probe(),
    send: serialisedSends(onSend, async (records) => {
      const byTopic = new Map<string, ProducerMessage[]>();
      for (const r of records) {
        let list = byTopic.get(r.topic);
        if (!list) byTopic.set(r.topic, (list = []));
        list.push({
          key: r.key,
          value: r.value,
          headers: r.headers,
          ...(r.partition === undefined ? {} : { partition: r.partition }),
        });
      }
      let failure: KafkaFailure | undefined;
      try {
        if (suspect && !closed) await replaceProducer();
        const answers = await producer.sendBatch({
          acks: -1,
          timeout: requestTimeoutMs,
          compression: codec,
          topicMessages: [...byTopic].map(([topic, messages]) => ({ topic, messages })),
        });
        const missing = unacknowledgedPartitions(byTopic, (m) => assigned.get(m), answers);
        if (missing.length > 0) failure = notAcknowledged(missing);
      } catch (err) {
        failure = failureOf(err);
      }
      if (failure) suspect = true;
      return failure;
    }),
  };
}

/**
 * The topic-partitions of the messages of `sent` (by topic; `partitionOf` gives each one's
 * partition) that no answer of `answers` covers, as `topic-partition` strings.
 *
 * kafkajs 2.2.4 resolves a send whose partition moved, during its retries, to a broker that had
 * already answered for other partitions of the same send, without sending that partition's
 * messages again (sendMessages.js keeps each broker's first answer and skips it on retry;
 * tulios/kafkajs#1798): the send succeeds, some records are not written. Found on a 3-node
 * cluster with a leader killed mid-send (test/cluster/). A message whose partition is unknown
 * (`undefined`: the partitioner was not asked) counts as unacknowledged.
 */
export function unacknowledgedPartitions<M>(
  sent: ReadonlyMap<string, readonly M[]>,
  partitionOf: (message: M) => number | undefined,
  answers: readonly { topicName: string; partition: number }[],
): string[] {
  // On the relay's hot path: no allocation per message unless a partition is missing.
  const answered = new Map<string, Set<number>>();
  for (const a of answers) {
    let partitions = answered.get(a.topicName);
    if (!partitions) answered.set(a.topicName, (partitions = new Set()));
    partitions.add(a.partition);
  }
  const missing = new Set<string>();
  for (const [topic, messages] of sent) {
    const partitions = answered.get(topic);
    for (const m of messages) {
      const partition = partitionOf(m);
      if (partition === undefined || !partitions?.has(partition)) missing.add(`${topic}-${partition ?? '?'}`);
    }
  }
  return [...missing];
}

/** The failure of a send that kafkajs resolved without an answer for `missing` (a broker failure: sent again). */
function notAcknowledged(missing: readonly string[]): KafkaFailure {
  return {
    kind: 'broker',
    error: new BrokerUnavailableError(
      `kafkajs resolved the send without an acknowledgement for ${missing.join(', ')} ` +
        '(a partition leader moved during the send): its records count as not sent and go again.',
    ),
  };
}

/**
 * The probes of a producer that cannot ask the cluster itself: through an admin client, connected
 * on the first probe and kept for the next ones. After a failed probe it is dropped (the next probe
 * gets a new one) and disconnected once its request settled: a disconnect during its connect could
 * leave a connection behind.
 */
function prober(makeAdmin: () => KafkaAdmin): { probe(): Promise<void>; close(): Promise<void> } {
  let admin: KafkaAdmin | undefined;
  /** The probe in flight, settled (never rejects), until it settles. */
  let asking: Promise<unknown> | undefined;
  const disconnectAfter = (a: KafkaAdmin, settled: Promise<unknown>) =>
    void settled.then(() => a.disconnect().catch(() => undefined));
  return {
    probe() {
      const a = (admin ??= makeAdmin());
      const asked = a.connect().then(() => a.probe());
      const settled = asked.catch(() => undefined);
      asking = settled;
      void settled.then(() => {
        if (asking === settled) asking = undefined;
      });
      return asked.catch((err: unknown) => {
        if (admin === a) admin = undefined;
        disconnectAfter(a, settled);
        throw err;
      });
    },
    async close() {
      const a = admin;
      admin = undefined;
      if (!a) return;
      if (asking) disconnectAfter(a, asking);
      else await a.disconnect().catch(() => undefined);
    },
  };
}

// ------------------------------------------------------------------------------------------------
// Before the Kafka boundary: the relay's own producer interface, kept for existing callers.
// ------------------------------------------------------------------------------------------------

/**
 * What the relay needed from a Kafka producer before {@link KafkaProducer}: a send that resolves
 * when every record was acknowledged and rejects otherwise (some may have been written then: the
 * relay republishes them, at least once). The relay still takes one (`RelayOptions.producer`) and
 * reads a rejection as kafkajs's: a record's fault or the broker's, by its error type.
 */
export interface RelayProducer {
  connect(): Promise<void>;
  send(records: readonly OutboundRecord[]): Promise<void>;
  disconnect(): Promise<void>;
}

/** Settings of {@link createKafkajsProducer} users may tune (the safety settings are not among them). */
export type KafkajsProducerOptions = Pick<ProducerSettings, 'requestTimeoutMs' | 'retries' | 'compression' | 'onSend'>;

/** Every option name of {@link KafkajsProducerOptions}; the compiler keeps it in step with the type. */
export const KAFKAJS_PRODUCER_OPTION_NAMES = optionNames<KafkajsProducerOptions>({
  requestTimeoutMs: true,
  retries: true,
  compression: true,
  onSend: true,
});

/**
 * The relay's kafkajs retry timing inside one send: 100 ms doubling to 2 s. A broker gone for
 * seconds fails the send within the relay's `brokerTimeoutMs`, and the relay backs off itself.
 */
export const RELAY_PRODUCER_RETRY = Object.freeze({ retryInitialMs: 100, retryMaxMs: 2_000 });

/**
 * A kafkajs-backed {@link RelayProducer}: {@link kafkajsProducer} with the relay's retry timing,
 * whose send rejects with kafkajs's error when a record was not acknowledged.
 *
 * @deprecated use `createKafkajsClient(kafka).producer(settings)` from `outboxkit/kafka`, whose
 *   send reports an outcome per record.
 * @throws {@link InvalidOptionsError} naming an unknown option name (before creating the producer).
 */
export function createKafkajsProducer(kafka: Kafka, options: KafkajsProducerOptions = {}): RelayProducer {
  refuseUnknownOptions(options ?? {}, KAFKAJS_PRODUCER_OPTION_NAMES, 'createKafkajsProducer');
  const producer = kafkajsProducer(kafka, { ...options, ...RELAY_PRODUCER_RETRY });
  return {
    connect: () => producer.connect(),
    disconnect: () => producer.disconnect(),
    send: async (records) => throwIfFailed(await producer.send(records)),
  };
}

/**
 * A {@link RelayProducer} as a {@link KafkaProducer}: a rejected send fails every record with the
 * rejection read as kafkajs's ({@link failureOf}). It probes through `client`'s admin, if given.
 */
export function fromRelayProducer(producer: RelayProducer, client?: KafkaClient): KafkaProducer {
  const probes = client ? prober(() => client.admin()) : undefined;
  return {
    connect: () => producer.connect(),
    async disconnect() {
      const closing = probes?.close();
      try {
        await producer.disconnect();
      } finally {
        await closing;
      }
    },
    ...(probes ? { probe: () => probes.probe() } : {}),
    async send(records) {
      let failure: KafkaFailure | undefined;
      try {
        await producer.send(records as readonly OutboundRecord[]);
      } catch (err) {
        failure = failureOf(err);
      }
      return { outcomes: records.map(() => (failure ? { ok: false, failure } : { ok: true })) };
    },
  };
}
