/**
 * Kafka helpers for integration tests: the real broker, random topic and group names.
 */
import { randomBytes } from 'node:crypto';
import { Kafka, logLevel, type ITopicConfig } from 'kafkajs';
import pRetry from 'p-retry';
import { inject } from 'vitest';

/** A random name with a readable prefix, for topics and consumer groups. */
export function randomName(prefix: string): string {
  return `${prefix}-${randomBytes(5).toString('hex')}`;
}

/** A kafkajs client on the test broker. */
export function testKafka(clientId = 'outboxkit-test'): Kafka {
  return new Kafka({ clientId, brokers: inject('kafkaBrokers'), logLevel: logLevel.NOTHING });
}

/**
 * Whether a kafkajs error may pass on a later attempt: its `retriable` flag (set for
 * UNKNOWN_TOPIC_OR_PARTITION "This server does not host this topic-partition", NOT_CONTROLLER,
 * LEADER_NOT_AVAILABLE, connection errors, ...), the cause of a KafkaJSNumberOfRetriesExceeded
 * (the client's own retries spent on a retriable error), or every error of a KafkaJSAggregateError
 * (CreateTopics answers per topic) being retriable.
 */
export function isRetriableKafkaError(err: unknown): boolean {
  const e = err as { retriable?: unknown; name?: unknown; errors?: unknown; cause?: unknown } | null;
  if (e?.retriable === true) return true;
  if (e?.name === 'KafkaJSNumberOfRetriesExceeded') return isRetriableKafkaError(e.cause);
  return e?.name === 'KafkaJSAggregateError' && Array.isArray(e.errors) && e.errors.every(isRetriableKafkaError);
}

/** Topics that {@link createTopicsOn} waits for are missing a partition or a partition leader. */
class TopicsNotReadyError extends Error {
  override name = 'TopicsNotReadyError';
  readonly retriable = true;
}

/**
 * Creates `topics` on `kafka`'s cluster (an existing one is left as it is) and waits until each
 * has its partitions, every one with a leader. Right after a broker starts or restarts, and under
 * load, CreateTopics or the metadata that follows fails with retriable errors ("This server does
 * not host this topic-partition", NOT_CONTROLLER, connection refused) that kafkajs's createTopics
 * does not retry: each attempt (connect, create, wait for leaders) is retried with p-retry,
 * exponential backoff 200 ms to 2 s.
 *
 * @param options.retries - retries after the first attempt (default 5, about 6 s in all).
 * @throws the last error once the retries are spent, or at once a non-retriable kafkajs error.
 */
export async function createTopicsOn(
  kafka: Kafka,
  topics: ITopicConfig[],
  options: { retries?: number } = {},
): Promise<void> {
  const names = topics.map((t) => t.topic);
  await pRetry(
    async () => {
      const admin = kafka.admin();
      await admin.connect();
      try {
        // false when every topic exists already (an earlier attempt created them): then kafkajs
        // does not wait for leaders, so the wait below is ours.
        await admin.createTopics({ waitForLeaders: true, topics });
        const { topics: metadata } = await admin.fetchTopicMetadata({ topics: names });
        for (const t of topics) {
          const partitions = metadata.find((m) => m.name === t.topic)?.partitions ?? [];
          const wanted = t.numPartitions ?? 1;
          if (partitions.length < wanted || partitions.some((p) => p.leader < 0)) {
            throw new TopicsNotReadyError(
              `topic ${t.topic}: ${partitions.length} of ${wanted} partitions with leaders`,
            );
          }
        }
      } finally {
        await admin.disconnect().catch(() => undefined);
      }
    },
    {
      retries: options.retries ?? 5,
      minTimeout: 200,
      maxTimeout: 2_000,
      factor: 2,
      shouldRetry: ({ error }) => isRetriableKafkaError(error),
    },
  );
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
