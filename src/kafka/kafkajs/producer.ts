/**
 * The relay's Kafka producer, behind a small interface of outboxkit's own so that another client
 * (for example @confluentinc/kafka-javascript) can be added later without touching the relay.
 */
import { CompressionTypes, Partitioners, type Kafka, type Producer, type ProducerConfig } from 'kafkajs';
import { refuseUnknownOptions } from '../../errors.js';

/** One record to publish. */
export interface OutboundRecord {
  topic: string;
  key: string | null;
  value: Buffer;
  headers: Record<string, string>;
}

/** What the relay needs from a Kafka producer. */
export interface RelayProducer {
  connect(): Promise<void>;
  /**
   * Publishes the records and resolves once the broker acknowledged all of them (acks=all).
   * Rejects if any was not acknowledged; then some may have been written (the relay republishes
   * them: at least once).
   */
  send(records: readonly OutboundRecord[]): Promise<void>;
  disconnect(): Promise<void>;
}

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

/** Settings of {@link createKafkajsProducer} users may tune (the safety settings are not among them). */
export interface KafkajsProducerOptions {
  /** Broker-side acknowledgement timeout of one produce request, in ms. @defaultValue 30_000 */
  requestTimeoutMs?: number;
  /** kafkajs retries inside one send before it rejects. @defaultValue 5 */
  retries?: number;
  /** Record batch compression (kafkajs ships gzip; others need a codec package). @defaultValue CompressionTypes.None */
  compression?: CompressionTypes;
  /** Called after every send with its record count and duration in ms (metrics). A throw is ignored. */
  onSend?: (sent: { records: number; durationMs: number; ok: boolean }) => void;
}

/** Every option name of {@link KafkajsProducerOptions}; the compiler keeps it in step with the interface. */
export const KAFKAJS_PRODUCER_OPTION_NAMES: readonly string[] = Object.keys({
  requestTimeoutMs: true,
  retries: true,
  compression: true,
  onSend: true,
} satisfies Record<keyof KafkajsProducerOptions, true>);

/**
 * A kafkajs-backed {@link RelayProducer}. Sends are serialised: kafkajs' idempotent producer can
 * assign broken sequence numbers under concurrent sends on one producer (case C09), so at most one
 * `send()` is in flight at a time, whoever calls it.
 *
 * @param kafka - a kafkajs client.
 * @param options - see {@link KafkajsProducerOptions}.
 * @throws {@link InvalidOptionsError} naming an unknown option name (before creating the producer).
 */
export function createKafkajsProducer(kafka: Kafka, options: KafkajsProducerOptions = {}): RelayProducer {
  refuseUnknownOptions(options ?? {}, KAFKAJS_PRODUCER_OPTION_NAMES, 'createKafkajsProducer');
  const producer: Producer = kafka.producer({
    ...SAFE_PRODUCER_CONFIG,
    // Java-compatible murmur2 of the key: the same partition a Java producer would choose.
    createPartitioner: Partitioners.DefaultPartitioner,
    retry: { retries: options.retries ?? 5, initialRetryTime: 100, maxRetryTime: 2_000 },
  });
  let tail: Promise<unknown> = Promise.resolve();

  return {
    connect: () => producer.connect(),
    disconnect: () => producer.disconnect(),
    send(records) {
      const run = async (): Promise<void> => {
        const byTopic = new Map<string, { key: string | null; value: Buffer; headers: Record<string, string> }[]>();
        for (const r of records) {
          let list = byTopic.get(r.topic);
          if (!list) byTopic.set(r.topic, (list = []));
          list.push({ key: r.key, value: r.value, headers: r.headers });
        }
        const began = performance.now();
        let ok = false;
        try {
          await producer.sendBatch({
            acks: -1,
            timeout: options.requestTimeoutMs ?? 30_000,
            compression: options.compression ?? CompressionTypes.None,
            topicMessages: [...byTopic].map(([topic, messages]) => ({ topic, messages })),
          });
          ok = true;
        } finally {
          try {
            options.onSend?.({ records: records.length, durationMs: performance.now() - began, ok });
          } catch {
            // metrics must never fail a send
          }
        }
      };
      const result = tail.then(run, run);
      tail = result.catch(() => undefined);
      return result;
    },
  };
}
