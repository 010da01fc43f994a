/**
 * The consumer side's producers (the dedup consumer's dead-letter producer and `dlq replay`'s)
 * use kafkajs's DefaultPartitioner (named, or wrapped by outboxkit's kafkajs producer) (Java-compatible murmur2, as the relay does), so a consumer
 * start no longer logs kafkajs's "v2.0.0 switched default partitioner" warning.
 */
import { Kafka, logLevel, Partitioners, type LogEntry, type ProducerConfig } from 'kafkajs';
import pg from 'pg';
import { afterAll, describe, expect, inject, it, vi } from 'vitest';
import { replayDeadLetters } from '../../consumer/dead-letter-replay.js';
import { HEADER_DLQ_ORIGINAL_TOPIC } from '../../consumer/dead-letter.js';
import { createDedupConsumer } from '../../consumer/index.js';
import { HEADER_EVENT_ID } from '../../src/index.js';
import { createTopics, testKafka } from '../helpers/kafka.js';

const PARTITIONER_WARNING = /switched default partitioner/;

/** A client whose log entries (WARN and above) are kept in `warnings`. */
function capturingKafka(): { kafka: Kafka; warnings: string[] } {
  const warnings: string[] = [];
  const kafka = new Kafka({
    clientId: 'partitioner-test',
    brokers: inject('kafkaBrokers'),
    logLevel: logLevel.WARN,
    logCreator: () => (entry: LogEntry) => {
      warnings.push(entry.log.message);
    },
  });
  return { kafka, warnings };
}

/**
 * Whether `createPartitioner` chooses what kafkajs's DefaultPartitioner (Java-compatible murmur2)
 * chooses, for 200 keys over 6 partitions: the producer may wrap it (outboxkit's kafkajs producer
 * remembers each choice to check the broker's answers), never replace it.
 */
function choosesLikeDefault(createPartitioner: ProducerConfig['createPartitioner']): boolean {
  if (!createPartitioner) return false;
  const ours = createPartitioner();
  const reference = Partitioners.DefaultPartitioner();
  const partitionMetadata = [0, 1, 2, 3, 4, 5].map((partitionId) => ({
    partitionId,
    leader: 1,
    replicas: [1],
    isr: [1],
    partitionErrorCode: 0,
    offlineReplicas: [],
  }));
  for (let i = 0; i < 200; i++) {
    const args = { topic: 't', partitionMetadata, message: { key: `order-${i}`, value: '{}' } };
    if (ours(args) !== reference(args)) return false;
  }
  return true;
}

const pool = new pg.Pool({ connectionString: inject('databaseUrl'), max: 1 });
afterAll(() => pool.end());

describe('consumer-side producers name the partitioner', () => {
  it("the dedup consumer's dead-letter producer: no partitioner warning", async () => {
    const { kafka, warnings } = capturingKafka();
    const producer = vi.spyOn(kafka, 'producer');
    // The dead-letter producer is created with the consumer; start() is not needed.
    createDedupConsumer({ kafka, groupId: 'g', topics: ['orders'], database: pool, handler: async () => {} });
    expect(producer).toHaveBeenCalledTimes(1);
    expect(choosesLikeDefault(producer.mock.calls[0]![0]?.createPartitioner)).toBe(true);
    expect(warnings.filter((w) => PARTITIONER_WARNING.test(w))).toEqual([]);
    // Control: kafkajs warns once per process, so a producer without a partitioner warns now
    // (the assertion above could not pass because an earlier producer had used the warning up).
    kafka.producer();
    expect(warnings.filter((w) => PARTITIONER_WARNING.test(w))).toHaveLength(1);
  });

  it("dlq replay's producer uses the DefaultPartitioner", async () => {
    const [dlq, target] = await createTopics(['partitioner-dlq', 'partitioner-target'], { partitions: 1 });
    const writer = testKafka().producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await writer.connect();
    try {
      await writer.send({
        topic: dlq!,
        messages: [
          {
            key: 'order-1',
            value: '{}',
            headers: {
              [HEADER_EVENT_ID]: '0190d9a5-7e6b-7c1a-9f0e-3b5a1c2d4e6f',
              [HEADER_DLQ_ORIGINAL_TOPIC]: target!,
            },
          },
        ],
      });
    } finally {
      await writer.disconnect();
    }
    const { kafka } = capturingKafka();
    const producer = vi.spyOn(kafka, 'producer');
    // `to`: this dead-letter topic is not named <topic>.dlq (replay never trusts the header for it).
    const result = await replayDeadLetters(kafka, dlq!, { all: true, to: target!, timeoutMs: 20_000 });
    expect(result.replayed.map((r) => r.topic)).toEqual([target]);
    expect(producer).toHaveBeenCalledTimes(1);
    expect(choosesLikeDefault((producer.mock.calls[0]![0] as ProducerConfig).createPartitioner)).toBe(true);
  });
});
