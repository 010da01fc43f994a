/**
 * The @platformatic/kafka {@link KafkaProducer}: idempotent, acks=all, one request in flight per
 * connection, a bounded number of retries, explicit serializers, the Java client's partitioner;
 * sends serialised, every record of a send given the send's outcome.
 */
import { BrokerUnavailableError } from '../../errors.js';
import { serialisedSends } from '../outcomes.js';
import {
  resolveProducerSettings,
  type CompressionCodec,
  type KafkaFailure,
  type KafkaProducer,
  type ProducerRecord,
  type ProducerSettings,
  type RecordHeaderValue,
} from '../types.js';
import {
  isPlatformaticAuthenticationFailure,
  platformaticFailureOf,
  protocolErrorName,
  withAuthenticationMessage,
  withUnreachableMessage,
} from './errors.js';
import { loadPlatformaticKafka, type PlatformaticKafka } from './load.js';

/** Connection settings of a @platformatic/kafka client (`bootstrapBrokers`, TLS, SASL, timeouts). */
export type PlatformaticConnection = Record<string, unknown> & { clientId: string; bootstrapBrokers: string[] };

type Key = string | Buffer;
type Header = RecordHeaderValue;
type Producer = InstanceType<PlatformaticKafka['Producer']> & {
  send(options: { messages: Message[] }): Promise<{ offsets?: { topic: string; partition: number; offset: bigint }[] }>;
};
/** A record as the client takes it. */
export interface Message {
  topic: string;
  key?: Key;
  value?: Buffer;
  headers?: Map<Buffer, Header>;
  partition?: number;
}

/** What {@link placeMessages} reads of the client's metadata (its `ClusterMetadata`). */
export interface PlacementMetadata {
  brokers: ReadonlyMap<number, unknown>;
  topics: ReadonlyMap<
    string,
    { partitionsCount: number; partitions: readonly ({ leader: number } | undefined)[] } | undefined
  >;
}

/** A partition of a send that has no leader the client knows of. */
export interface Leaderless {
  topic: string;
  partition: number;
}

/**
 * `messages`, each with the partition it goes to (the client then does not ask its partitioner),
 * and the first partition among them without a leader: a leader of -1 (LEADER_NOT_AVAILABLE, kept
 * by ./metadata-fix.ts) or one not among `metadata.brokers`. The same placement as
 * {@link javaPartitioner}: a given partition stays (the client takes it modulo the partition count,
 * and so is it checked), a keyed record goes to `toPositive(murmur2(key)) % partitions`; a record
 * without a key goes round robin (per topic, `next`) over the partitions that have a leader, as
 * kafkajs places it, or over all of them when none has. A message of a topic `metadata` does not
 * hold is left to the client.
 */
export function placeMessages(
  messages: readonly Message[],
  metadata: PlacementMetadata,
  murmur2: (key: Buffer) => number,
  next: Map<string, number>,
): { messages: Message[]; leaderless?: Leaderless } {
  let leaderless: Leaderless | undefined;
  const writable = (topic: NonNullable<ReturnType<PlacementMetadata['topics']['get']>>, partition: number) => {
    const leader = topic.partitions[partition]?.leader;
    return leader !== undefined && leader >= 0 && metadata.brokers.has(leader);
  };
  const placed = messages.map((m) => {
    const topic = metadata.topics.get(m.topic);
    if (!topic || !(topic.partitionsCount > 0)) return m;
    const count = topic.partitionsCount;
    let partition: number;
    if (m.partition !== undefined) partition = m.partition;
    else if (m.key !== undefined) {
      partition = (murmur2(Buffer.isBuffer(m.key) ? m.key : Buffer.from(m.key, 'utf8')) & 0x7fffffff) % count;
    } else {
      const n = next.get(m.topic) ?? 0;
      next.set(m.topic, (n + 1) % 0x7fffffff);
      const candidates = [...Array(count).keys()].filter((p) => writable(topic, p));
      partition = candidates.length > 0 ? candidates[n % candidates.length]! : n % count;
    }
    if (!leaderless && !writable(topic, partition % count))
      leaderless = { topic: m.topic, partition: partition % count };
    return { ...m, partition };
  });
  return leaderless ? { messages: placed, leaderless } : { messages: placed };
}

/**
 * The error of a send refused because `at` has no leader: retriable (`canRetry`), its cause the
 * client's own LEADER_NOT_AVAILABLE `ProtocolError`, so that {@link platformaticFailureOf} reads it
 * as a partition that cannot take writes (as kafkajs' KafkaJSBrokerNotFound).
 */
function leaderlessError(kafka: PlatformaticKafka, at: Leaderless): Error {
  const cause = new kafka.ProtocolError('LEADER_NOT_AVAILABLE', null, { topic: at.topic, partition: at.partition });
  return Object.assign(
    new Error(
      `Partition ${at.partition} of topic ${at.topic} has no leader (LEADER_NOT_AVAILABLE): it cannot take writes now; ` +
        'no record of this send was written.',
      { cause },
    ),
    { name: 'LeaderNotAvailableError', canRetry: true, topic: at.topic, partition: at.partition },
  );
}

/**
 * `attempt` (one send, which resolves with its failure or `undefined` and never rejects) bounded
 * by `timeoutMs`, when given: past it `abandon(timeoutMs)` is called and its failure is the send's,
 * without waiting for the attempt, which goes on and whose outcome is ignored. Under
 * {@link serialisedSends} the next send then starts at once instead of behind it.
 */
export function withinSendTimeout<R>(
  attempt: (records: R) => Promise<KafkaFailure | undefined>,
  timeoutMs: number | undefined,
  abandon: (timeoutMs: number) => KafkaFailure,
): (records: R) => Promise<KafkaFailure | undefined> {
  if (timeoutMs === undefined) return attempt;
  return (records) => {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<KafkaFailure>((resolve) => {
      timer = setTimeout(() => resolve(abandon(timeoutMs)), timeoutMs);
    });
    return Promise.race([attempt(records), timedOut]).finally(() => clearTimeout(timer));
  };
}

/** Kafka's codec names by codec id (kafkajs's `CompressionTypes` values, accepted as before). */
const CODEC_BY_ID: readonly CompressionCodec[] = ['none', 'gzip', 'snappy', 'lz4', 'zstd'];

/**
 * Fewest retries given to the client: its idempotent producer replaces 0 and 1 by
 * `Number.MAX_SAFE_INTEGER` (@platformatic/kafka 1.35.0, clients/producer/producer.js), which
 * would retry a failing send forever instead of reporting it.
 */
export const PLATFORMATIC_MIN_RETRIES = 2;

/**
 * Java-compatible partitioner: a keyed record goes to `toPositive(murmur2(key)) % partitions`
 * (Kafka's `BuiltInPartitioner.partitionForKey`, kafkajs's DefaultPartitioner); the client takes
 * the modulo. Records without a key go round robin per topic, as kafkajs sends them (the client's
 * own `compatibilityPartitioner` would put every one of them on partition 0). The client's default
 * partitioner (`murmur2 >>> 0`) puts about half of all keys of a 6-partition topic elsewhere
 * (test/kafka/partitioner.test.ts).
 */
function javaPartitioner(kafka: PlatformaticKafka): (message: { topic: string }, key: Buffer | undefined) => number {
  const next = new Map<string, number>();
  return (message, key) => {
    if (key !== undefined) return kafka.murmur2(key) & 0x7fffffff;
    const n = next.get(message.topic) ?? 0;
    next.set(message.topic, (n + 1) % 0x7fffffff);
    return n;
  };
}

/**
 * The client's `retryDelay`: exponential from `initialMs` (attempt counts from 1), capped at
 * `maxMs`; none after UNKNOWN_TOPIC_OR_PARTITION or an authentication failure. The client retries a
 * missing topic's metadata like any stale metadata: at its default delay (1 s, 3 retries) a send or
 * a metadata request naming a missing topic took longer than the relay's `brokerTimeoutMs` and was
 * read as a broker outage (never parked) instead of the record error it is
 * (test/relay/relay.test.ts, "a missing topic"). It also retries a refused SASL authentication (it
 * wraps it in a retriable network error), which can only be refused again: at these delays a
 * connect with a wrong password failed after 6.8-7.9 s, past `brokerTimeoutMs`; without a delay it
 * fails after 3.5 s (six attempts; the broker answers a failed authentication after its
 * `connection.failed.authentication.delay.ms`).
 */
export function retryDelayOf(
  initialMs: number,
  maxMs: number,
): (client: unknown, operationId: string, attempt: number, retries: number, error: Error) => number {
  return (_client, _operationId, attempt, _retries, error) =>
    protocolErrorName(error) === 'UNKNOWN_TOPIC_OR_PARTITION' || isPlatformaticAuthenticationFailure(error)
      ? 0
      : Math.min(maxMs, initialMs * 2 ** Math.max(0, attempt - 1));
}

/** The SASL mechanism of `connection` (`PLAIN`, `SCRAM-SHA-256`...), if it authenticates. */
export function saslMechanismOf(connection: PlatformaticConnection): string | undefined {
  const mechanism = (connection.sasl as { mechanism?: unknown } | undefined)?.mechanism;
  return typeof mechanism === 'string' ? mechanism : undefined;
}

const toBuffer = (v: string | Buffer | null | undefined): Buffer | undefined =>
  v === null || v === undefined ? undefined : Buffer.isBuffer(v) ? v : Buffer.from(v, 'utf8');

/**
 * outboxkit's record headers as the client's Map, keyed by each header's name as a Buffer of its
 * own: a name given as an array of values is sent once per value, in order, as kafkajs sends it
 * and reads it back. The client writes one record header per Map entry (`appendVarIntMap`,
 * 1.35.0 and 2.12.1), and two Buffers of the same bytes are two entries, where two equal strings
 * would be one. (A Kafka record may repeat a header name; the dead-letter and replay paths carry
 * the original record's headers as they came.)
 */
function headersOf(headers: ProducerRecord['headers']): Map<Buffer, Header> | undefined {
  if (!headers) return undefined;
  const map = new Map<Buffer, Header>();
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [value]) map.set(Buffer.from(name, 'utf8'), v);
  }
  return map;
}

/**
 * A @platformatic/kafka-backed {@link KafkaProducer} (see {@link KafkaClient.producer}). The module
 * loads and the client's producer is made in `connect()`, which then asks the cluster's metadata
 * (the client connects on first use).
 *
 * Safety settings, which no setting overrides: `idempotent: true` (the client then forces acks=all
 * and `maxInflights: 1`, both also given explicitly), at least {@link PLATFORMATIC_MIN_RETRIES}
 * retries (fewer means unbounded to the client), `autocreateTopics: false`, `strict: true`,
 * explicit serializers (strings as UTF-8, buffers as they are), {@link javaPartitioner}. Each
 * Produce request waits at most `requestTimeoutMs` (the client's `timeout`); the relay bounds the
 * whole send, retries included, by its `brokerTimeoutMs`.
 *
 * A send with a record for a partition without a leader (leader -1 in the client's metadata, as
 * ./metadata-fix.ts keeps it, even after a forced refresh) is refused whole before the client gets
 * it: every record of it fails with a retriable LEADER_NOT_AVAILABLE failure marked
 * `partitionUnavailable` (as kafkajs' KafkaJSBrokerNotFound), nothing of it is written, and the
 * producer stays as it is. The relay then asks the cluster which partitions cannot take writes and
 * holds back only their keys (relay/partitions.ts), so that its next sends leave them out. Records
 * are placed by {@link placeMessages} (the same partitions as {@link javaPartitioner}; a record
 * without a key only on partitions with a leader).
 *
 * After a failed send the next send first replaces the client's producer (a new producer id,
 * sequence numbers from 0), as the kafkajs adapter does: whether this client's sequence numbers
 * stay right across a partly failed request has not been verified, and a new producer id cannot
 * meet batches of the old one at the broker.
 *
 * With `sendTimeoutMs` (the relay gives its `brokerTimeoutMs`) a send that has not settled by then
 * fails as a broker failure (not `partitionUnavailable`: no answer says where the fault is), and
 * the client's producer it went through is closed at once (its request in flight fails; its records
 * may have been written) and dropped: the next send makes a new one (a new producer id, new
 * connections) instead of waiting behind a request the broker holds. Found on the 3-node cluster
 * (C27, test/cluster/partial-outage.test.ts): a Produce request with acks=all appended just before
 * its partition fell below `min.insync.replicas` got no answer for the whole `requestTimeoutMs`;
 * the relay gave up on it after `brokerTimeoutMs`, and every later send of the other partitions
 * waited behind it (sends are serialised) until they timed out too.
 *
 * @throws {@link InvalidOptionsError} naming an unknown setting (before anything connects).
 */
export function platformaticProducer(
  connection: PlatformaticConnection,
  settings: ProducerSettings = {},
): KafkaProducer {
  const {
    retries,
    retryInitialMs,
    retryMaxMs,
    requestTimeoutMs,
    compression,
    metadataMaxAgeMs,
    sendTimeoutMs,
    onSend,
  } = resolveProducerSettings(settings);
  const codec = typeof compression === 'number' ? (CODEC_BY_ID[compression] ?? 'none') : compression;
  const initialMs = retryInitialMs ?? 100;
  const maxMs = Math.max(initialMs, retryMaxMs ?? 2_000);

  const mechanism = saslMechanismOf(connection);
  /**
   * `promise`, its authentication failure said as one (see {@link withAuthenticationMessage}), and
   * brokers that could not be reached too ({@link withUnreachableMessage}).
   */
  const named = <T>(promise: Promise<T>): Promise<T> =>
    promise.catch((err: unknown) => {
      throw withUnreachableMessage(withAuthenticationMessage(err, mechanism), connection.bootstrapBrokers);
    });

  let kafka: PlatformaticKafka | undefined;
  let producer: Producer | undefined;
  let suspect = false;
  let closed = false;
  /**
   * Counts the client producers dropped after a send outlived `sendTimeoutMs`: a send abandoned
   * so, still running, then leaves the adapter's state (`producer`, `suspect`) as it is.
   */
  let generation = 0;
  /** The round robin of records without a key, per topic ({@link placeMessages}). */
  const next = new Map<string, number>();

  const makeProducer = (k: PlatformaticKafka): Producer =>
    new k.Producer({
      ...connection,
      idempotent: true,
      acks: -1,
      maxInflights: 1,
      retries: Math.max(PLATFORMATIC_MIN_RETRIES, retries),
      retryDelay: retryDelayOf(initialMs, maxMs),
      timeout: requestTimeoutMs,
      ...(metadataMaxAgeMs === undefined ? {} : { metadataMaxAge: metadataMaxAgeMs }),
      autocreateTopics: false,
      strict: true,
      compression: codec,
      partitioner: javaPartitioner(k),
      serializers: {
        key: (key?: Key | null) => toBuffer(key),
        value: (value?: Buffer | null) => toBuffer(value),
        headerKey: (name?: Key) => toBuffer(name),
        headerValue: (value?: Header) => toBuffer(value),
      },
    } as ConstructorParameters<PlatformaticKafka['Producer']>[0]) as Producer;

  const connected = async (): Promise<Producer> => {
    kafka ??= await loadPlatformaticKafka();
    producer ??= makeProducer(kafka);
    return producer;
  };

  /** A new client producer (a new producer id) in place of a suspect one. */
  const replaceProducer = async (): Promise<void> => {
    const g = generation;
    const old = producer;
    const next = (producer = makeProducer(kafka!));
    await old?.close().catch(() => undefined);
    await next.metadata({ topics: [] });
    if (g !== generation) return;
    suspect = false;
    if (closed) await next.close().catch(() => undefined);
  };

  /**
   * A send outlived `sendTimeoutMs`: its client producer is closed (its request in flight fails)
   * and dropped; the next send makes a new one.
   */
  const abandon = (timeoutMs: number): KafkaFailure => {
    generation++;
    const old = producer;
    producer = undefined;
    suspect = false;
    void old?.close().catch(() => undefined);
    return {
      kind: 'broker',
      error: new BrokerUnavailableError(
        `Kafka did not answer a send within sendTimeoutMs (${timeoutMs} ms): the send counts as failed (its records ` +
          'may have been written); the client producer it went through is closed, the next send goes through a new one.',
      ),
    };
  };

  const attempt = async (records: readonly ProducerRecord[]): Promise<KafkaFailure | undefined> => {
    const g = generation;
    let messages: Message[];
    try {
      messages = records.map(toMessage);
    } catch (err) {
      // A record outboxkit cannot hand to the client (a header name or value neither a string nor a Buffer): its own fault.
      suspect = true;
      return { kind: 'record', error: err as Error };
    }
    try {
      await connected();
      if (suspect && !closed) await replaceProducer();
      const p = await connected();
      // Placed here, where a partition without a leader is seen: such a send is refused, retriably,
      // before the client gets it (see the factory's comment). The client's cached metadata first;
      // a leader it lacks may be back (the relay releases a partition's keys on the cluster's word).
      const topics = [...new Set(messages.map((m) => m.topic))];
      let placement = placeMessages(messages, await p.metadata({ topics }), kafka!.murmur2, next);
      if (placement.leaderless) {
        placement = placeMessages(messages, await p.metadata({ topics, forceUpdate: true }), kafka!.murmur2, next);
      }
      if (placement.leaderless) return platformaticFailureOf(leaderlessError(kafka!, placement.leaderless));
      await p.send({ messages: placement.messages });
      return undefined;
    } catch (err) {
      // Abandoned meanwhile (`sendTimeoutMs`): its producer is gone already, the next one is not suspect.
      if (g === generation) suspect = true;
      return platformaticFailureOf(withAuthenticationMessage(err, mechanism));
    }
  };

  return {
    async connect() {
      closed = false;
      const p = await connected();
      await named(p.metadata({ topics: [] }));
    },
    async disconnect() {
      closed = true;
      const p = producer;
      producer = undefined;
      await p?.close();
    },
    async probe() {
      const p = await connected();
      await named(p.metadata({ topics: [], forceUpdate: true }));
    },
    send: serialisedSends(onSend, withinSendTimeout(attempt, sendTimeoutMs, abandon)),
  };
}

function toMessage(r: ProducerRecord): Message {
  const headers = headersOf(r.headers);
  const key = toBuffer(r.key);
  const value = toBuffer(r.value);
  return {
    topic: r.topic,
    ...(key === undefined ? {} : { key }),
    ...(value === undefined ? {} : { value }),
    ...(headers ? { headers } : {}),
    ...(r.partition === undefined ? {} : { partition: r.partition }),
  };
}
