/**
 * The @platformatic/kafka {@link KafkaProducer}: idempotent, acks=all, one request in flight per
 * connection, a bounded number of retries, explicit serializers, the Java client's partitioner;
 * sends serialised, every record of a send given the send's outcome.
 */
import { serialisedSends } from '../outcomes.js';
import {
  resolveProducerSettings,
  type CompressionCodec,
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
interface Message {
  topic: string;
  key?: Key;
  value?: Buffer;
  headers?: Map<Buffer, Header>;
  partition?: number;
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
 * After a failed send the next send first replaces the client's producer (a new producer id,
 * sequence numbers from 0), as the kafkajs adapter does: whether this client's sequence numbers
 * stay right across a partly failed request has not been verified, and a new producer id cannot
 * meet batches of the old one at the broker.
 *
 * @throws {@link InvalidOptionsError} naming an unknown setting (before anything connects).
 */
export function platformaticProducer(
  connection: PlatformaticConnection,
  settings: ProducerSettings = {},
): KafkaProducer {
  const { retries, retryInitialMs, retryMaxMs, requestTimeoutMs, compression, metadataMaxAgeMs, onSend } =
    resolveProducerSettings(settings);
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
    const old = producer;
    producer = makeProducer(kafka!);
    await old?.close().catch(() => undefined);
    await producer.metadata({ topics: [] });
    suspect = false;
    if (closed) await producer.close().catch(() => undefined);
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
    send: serialisedSends(onSend, async (records) => {
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
        await p.send({ messages });
        return undefined;
      } catch (err) {
        suspect = true;
        return platformaticFailureOf(withAuthenticationMessage(err, mechanism));
      }
    }),
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
