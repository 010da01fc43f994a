/**
 * Creating Kafka topics that the relay and the consumers expect (they never auto-create one),
 * through a {@link KafkaClient}'s admin.
 *
 * kafkajs's `admin.createTopics` does not retry the errors a cluster answers right after a broker
 * starts or restarts, or under load, although Kafka marks them retriable: UNKNOWN_TOPIC_OR_PARTITION
 * ("This server does not host this topic-partition") while the leaders are elected, NOT_CONTROLLER,
 * LEADER_NOT_AVAILABLE, REQUEST_TIMED_OUT, a refused connection. {@link ensureTopics} retries the
 * whole step (connect, create, wait for every partition's leader) with p-retry.
 */
import pRetry from 'p-retry';
import { z } from 'zod';
import { withTimeout } from '../deadline.js';
import { BrokerUnavailableError, InvalidOptionsError, isOutboxkitError } from '../errors.js';
import { integer, parseOptions } from '../options.js';
import { KAFKA_TOPIC_NAME } from '../outbox/event.js';
import { kafkaClientOf, type Kafka } from './kafkajs/client.js';
import type { KafkaClient, TopicSpec } from './types.js';

/**
 * Some topics still miss a partition or a partition leader after CreateTopics: the cluster cannot
 * serve them yet (retriable; thrown once the retries are spent).
 */
function topicsNotReady(message: string): BrokerUnavailableError {
  return new BrokerUnavailableError(message);
}

/** Options of {@link ensureTopics}. */
export interface EnsureTopicsOptions {
  /** Attempts after the first one; backoff 200 ms doubling to 2 s (about 6 s for 5). @defaultValue 5 */
  retries?: number;
  /**
   * Longest time the whole call may take, in ms, retries included: past it, the attempt in flight
   * is abandoned and {@link BrokerUnavailableError} is thrown (its `cause` the last attempt's
   * error). Without it, a broker that cannot be reached fails after kafkajs's own connection
   * retries on each attempt: about a minute. @defaultValue none
   */
  timeoutMs?: number;
}

const ensureTopicsOptionsSchema = z.strictObject({
  retries: integer(0).default(5),
  timeoutMs: integer(1).optional(),
} satisfies Record<keyof EnsureTopicsOptions, z.ZodType>);

/**
 * What {@link ensureTopics} found: the topics this call created, and the others (they existed
 * before, or another process created them at the same time).
 */
export interface EnsureTopicsResult {
  created: string[];
  existing: string[];
}

/**
 * Creates those of `topics` that do not exist (an existing topic is left as it is, whatever its
 * partitions or settings) and waits until every topic has its partitions, each with a leader.
 * Each attempt (connect, list, create, read the metadata) is retried on a retriable error
 * ({@link KafkaClient.isRetriable}; with kafkajs, `isRetriableKafkaError`) with exponential
 * backoff, 200 ms doubling to 2 s, p-retry.
 *
 * @param kafka - a kafkajs `Kafka` instance (made into a client by `createKafkajsClient`) or a
 *   {@link KafkaClient}; an admin of it is connected and disconnected here.
 * @param topics - topic specs (kafkajs's `ITopicConfig` fits): `topic`, `numPartitions` (omitted:
 *   the broker's `num.partitions`), `replicationFactor` (omitted: the broker's
 *   `default.replication.factor`), `configEntries`.
 * @throws {@link InvalidOptionsError} before anything is sent: an illegal topic name, a partition
 *   count or replication factor that is not a positive integer, or one topic given twice with
 *   different settings (the same one twice is asked once).
 * @throws the last error once the retries are spent, or at once a non-retriable kafkajs error
 *   (for example TOPIC_AUTHORIZATION_FAILED, INVALID_REPLICATION_FACTOR, POLICY_VIOLATION).
 *   A broker that cannot be reached fails after kafkajs's own connection retries (with its
 *   defaults, about 10 s per attempt) on each of these attempts: about a minute in all, unless
 *   `timeoutMs` is given.
 * @throws {@link BrokerUnavailableError} when `timeoutMs` passed first (`cause`: the last error).
 * @throws {@link InvalidOptionsError} on an unknown or invalid option.
 */
export async function ensureTopics(
  kafka: Kafka | KafkaClient,
  topics: TopicSpec[],
  options: EnsureTopicsOptions = {},
): Promise<EnsureTopicsResult> {
  const o = parseOptions(ensureTopicsOptionsSchema, options, 'ensureTopics');
  topics = checkTopics(topics);
  const client = kafkaClientOf(kafka);
  const names = topics.map((t) => t.topic);
  let existing: Set<string> | undefined;
  // Topics this call created (across attempts: a retried attempt must not count them as found).
  const created = new Set<string>();
  // Stops p-retry's next attempt once timeoutMs passed (the one in flight is abandoned).
  const deadline = o.timeoutMs === undefined ? undefined : new AbortController();
  let lastError: unknown;
  let inFlight: { disconnect(): Promise<void> } | undefined;
  const attempts = pRetry(
    async () => {
      const admin = client.admin();
      inFlight = admin;
      await admin.connect();
      try {
        // What existed before the first attempt that listed.
        existing ??= new Set((await admin.listTopics()).filter((t) => names.includes(t)));
        const missing = topics.filter((t) => !existing!.has(t.topic));
        // One request per topic. Another process creating the same topics at the same time (two
        // services starting) then makes the topic "existing", not an error.
        for (const t of missing) {
          if (created.has(t.topic)) continue;
          if ((await admin.createTopic(t)) === 'created') created.add(t.topic);
        }
        // kafkajs does not wait for the leaders of a topic it did not create: check them all here.
        const metadata = await admin.describeTopics(names);
        for (const t of missing) {
          const partitions = metadata.find((m) => m.name === t.topic)?.partitions ?? [];
          const wanted = Math.max(1, t.numPartitions ?? 1);
          if (partitions.length < wanted || partitions.some((p) => p.leader === null)) {
            throw topicsNotReady(`topic ${t.topic}: ${partitions.length} of ${wanted} partitions with leaders`);
          }
        }
      } finally {
        await admin.disconnect().catch(() => undefined);
      }
    },
    {
      retries: o.retries,
      minTimeout: 200,
      maxTimeout: 2_000,
      factor: 2,
      signal: deadline?.signal,
      onFailedAttempt: ({ error }) => {
        lastError = error;
      },
      shouldRetry: ({ error }) => isOutboxkitError(error, 'OUTBOXKIT_BROKER_UNAVAILABLE') || client.isRetriable(error),
    },
  );
  if (o.timeoutMs === undefined) await attempts;
  else {
    await withTimeout(attempts, o.timeoutMs, () => {
      deadline!.abort();
      // The abandoned attempt's admin stops its connection retries (they would hold the process).
      void inFlight?.disconnect().catch(() => undefined);
      return new BrokerUnavailableError(
        `Kafka topics not ready within ${o.timeoutMs} ms (timeoutMs): ${lastError instanceof Error ? lastError.message : 'no answer from the brokers'}.`,
        lastError === undefined ? {} : { cause: lastError },
      );
    });
  }
  return { created: names.filter((n) => created.has(n)), existing: names.filter((n) => !created.has(n)) };
}

/** Validates `topics` (see {@link ensureTopics}) and drops repeats of one topic. */
function checkTopics(topics: TopicSpec[]): TopicSpec[] {
  if (!Array.isArray(topics))
    throw new InvalidOptionsError('topics must be an array of { topic, numPartitions?, ... }.');
  const byName = new Map<string, TopicSpec>();
  for (const t of topics) {
    const name: unknown = t?.topic;
    if (typeof name !== 'string' || !KAFKA_TOPIC_NAME.test(name) || name === '.' || name === '..') {
      throw new InvalidOptionsError(
        `Invalid topic ${JSON.stringify(name)}: Kafka topics are 1-249 characters of letters, digits, '.', '_' and '-'.`,
      );
    }
    for (const field of ['numPartitions', 'replicationFactor'] as const) {
      const v: unknown = t[field];
      // -1 asks the broker's default, as kafkajs does.
      if (v !== undefined && v !== -1 && !(typeof v === 'number' && Number.isInteger(v) && v >= 1)) {
        throw new InvalidOptionsError(`${field} of topic ${name} must be a positive integer, got ${String(v)}.`);
      }
    }
    const seen = byName.get(name);
    if (seen !== undefined && JSON.stringify(seen) !== JSON.stringify(t)) {
      throw new InvalidOptionsError(`Topic ${name} is given twice with different settings.`);
    }
    byName.set(name, t);
  }
  return [...byName.values()];
}

/**
 * Why acks=all is weak on a topic, or undefined when it is not: with replication factor 1 an
 * acknowledged event lives on one broker (its loss loses the event, and the partition has no leader
 * until that broker returns); with `min.insync.replicas` 1 and 3 replicas or more, acks=all is
 * satisfied by the leader alone once the followers fall out of the ISR, so one broker's loss can
 * lose acknowledged events. (Kafka's documentation, "Replication" and the producer's `acks`.)
 *
 * @param replicationFactor - the topic's replicas per partition.
 * @param minInsyncReplicas - its effective `min.insync.replicas`, or undefined when unknown.
 */
export function weakAcksReason(replicationFactor: number, minInsyncReplicas: number | undefined): string | undefined {
  if (replicationFactor === 1) {
    return 'replication factor 1: an acknowledged event lives on one broker, and its partitions stop while that broker is down';
  }
  if (minInsyncReplicas === 1 && replicationFactor >= 3) {
    return `min.insync.replicas 1 with ${replicationFactor} replicas: acks=all can be met by the leader alone, so one broker's loss can lose acknowledged events (set min.insync.replicas to 2)`;
  }
  return undefined;
}
