/**
 * Kafka helpers for integration tests: the real broker, random topic and group names.
 */
import { randomBytes } from 'node:crypto';
import { Kafka, logLevel, type ITopicConfig } from 'kafkajs';
import { inject } from 'vitest';
import { ensureTopics } from '../../src/kafka/topics.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import { waitFor } from './wait-for.js';
import type { KafkaClient } from '../../src/kafka/types.js';

/** A random name with a readable prefix, for topics and consumer groups. */
export function randomName(prefix: string): string {
  return `${prefix}-${randomBytes(5).toString('hex')}`;
}

/** A kafkajs client on the test broker. */
export function testKafka(clientId = 'outboxkit-test'): Kafka {
  return new Kafka({ clientId, brokers: inject('kafkaBrokers'), logLevel: logLevel.NOTHING });
}

/**
 * The client library the relay tests run on: `OUTBOXKIT_KAFKA_CLIENT=platformatic` runs them on
 * @platformatic/kafka (docs/kafka.md, "Choosing a client"), anything else on kafkajs.
 */
export const TEST_KAFKA_CLIENT: 'kafkajs' | 'platformatic' =
  process.env.OUTBOXKIT_KAFKA_CLIENT === 'platformatic' ? 'platformatic' : 'kafkajs';

/**
 * A client on the test broker for the product under test (the relay): a kafkajs `Kafka`, or an
 * outboxkit {@link KafkaClient} over @platformatic/kafka when {@link TEST_KAFKA_CLIENT} says so.
 */
export function testRelayKafka(clientId = 'outboxkit-test'): Kafka | KafkaClient {
  return TEST_KAFKA_CLIENT === 'platformatic'
    ? createPlatformaticClient({ clientId, brokers: inject('kafkaBrokers') })
    : testKafka(clientId);
}

/**
 * A client on the test broker for the dedup consumer under test: a kafkajs `Kafka`, or an outboxkit
 * {@link KafkaClient} over @platformatic/kafka when {@link TEST_KAFKA_CLIENT} says so (the
 * consumer's group member, dead-letter producer and admin then all run on it).
 */
export function testConsumerKafka(clientId = 'outboxkit-consumer-test'): Kafka | KafkaClient {
  return testRelayKafka(clientId);
}

/**
 * Creates `topics` on `kafka`'s cluster (an existing one is left as it is) and waits until each
 * has its partitions, every one with a leader: the product's {@link ensureTopics}, which retries
 * the errors a broker answers right after it starts or under load. Then waits (up to 30 s) until
 * every partition's leader answers for it: on a loaded machine a KRaft broker can name a leader in
 * its metadata before that leader hosts the partition's log, and a first send then fails with
 * UNKNOWN_TOPIC_OR_PARTITION ("This server does not host this topic-partition").
 *
 * @param options.retries - retries of the creation after the first attempt (default 5, about 6 s in all).
 */
export async function createTopicsOn(
  kafka: Kafka,
  topics: ITopicConfig[],
  options: { retries?: number } = {},
): Promise<void> {
  await ensureTopics(kafka, topics, options);
  await untilHosted(
    kafka,
    topics.map((t) => t.topic),
  );
}

/** Resolves when a ListOffsets request for every partition of each topic is answered by its leader. */
async function untilHosted(kafka: Kafka, topics: string[]): Promise<void> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    await waitFor(
      async () => {
        for (const topic of topics) await admin.fetchTopicOffsets(topic);
        return true;
      },
      { timeoutMs: 30_000, intervalMs: 200, message: `the leaders of ${topics.join(', ')} host their partitions` },
    );
  } finally {
    await admin.disconnect();
  }
}

/**
 * Creates topics with random names (at least 3 partitions by default) on the test broker and
 * waits until they have leaders (see {@link createTopicsOn}). Returns the names in the order of
 * `prefixes`.
 */
export async function createTopics(
  prefixes: string[],
  options: { partitions?: number; configEntries?: { name: string; value: string }[] } = {},
): Promise<string[]> {
  const names = prefixes.map(randomName);
  await createTopicsOn(
    testKafka(),
    names.map((topic) => ({
      topic,
      numPartitions: options.partitions ?? 3,
      replicationFactor: 1,
      configEntries: options.configEntries,
    })),
  );
  return names;
}

/** Reads every message of `topic` from the beginning until `until` is true or the timeout passes. */
export async function readTopic<T>(
  topic: string,
  map: (m: {
    key: string | null;
    value: Buffer | null;
    headers: Record<string, string>;
    partition: number;
    offset: string;
  }) => T,
  until: (all: T[]) => boolean,
  timeoutMs = 30_000,
): Promise<T[]> {
  const kafka = testKafka('outboxkit-test-reader');
  const consumer = kafka.consumer({ groupId: randomName('reader') });
  const out: T[] = [];
  await consumer.connect();
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`readTopic(${topic}): timed out with ${out.length} messages`)),
        timeoutMs,
      );
      consumer
        .run({
          eachMessage: async ({ message, partition }) => {
            const headers: Record<string, string> = {};
            for (const [k, v] of Object.entries(message.headers ?? {})) if (v !== undefined) headers[k] = String(v);
            out.push(
              map({
                key: message.key?.toString() ?? null,
                value: message.value,
                headers,
                partition,
                offset: message.offset,
              }),
            );
            if (until(out)) {
              clearTimeout(timer);
              resolve();
            }
          },
        })
        .catch(reject);
    });
  } finally {
    await consumer.disconnect();
  }
  return out;
}

/** Whether `topic` exists on the test broker. */
export async function topicExists(topic: string): Promise<boolean> {
  const admin = testKafka().admin();
  await admin.connect();
  try {
    return (await admin.listTopics()).includes(topic);
  } finally {
    await admin.disconnect();
  }
}

/** Messages written to `topic` (the sum of its partitions' high watermarks), on `kafka`'s cluster. */
export async function messagesIn(topic: string, kafka: Kafka = testKafka()): Promise<number> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const offsets = await admin.fetchTopicOffsets(topic);
    return offsets.reduce((n, p) => n + Number(p.high), 0);
  } finally {
    await admin.disconnect();
  }
}
