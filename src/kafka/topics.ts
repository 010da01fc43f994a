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
 * @throws {@link InvalidOptionsError} before anything is sent: a field a topic spec does not have
 *   (`partitions` for `numPartitions`: named, with the accepted fields), an illegal topic name, a
 *   partition count or replication factor that is not a positive integer (or -1), malformed
 *   `configEntries`, or one topic given twice with different settings (the same one twice is asked
 *   once).
 * @throws {@link InvalidOptionsError} at once (no retry, the topic not created) when the broker
 *   refuses a topic for what it asks: INVALID_CONFIG (a configuration name or value it does not
 *   take), INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR (more replicas than brokers),
 *   INVALID_REPLICA_ASSIGNMENT, INVALID_TOPIC_EXCEPTION, POLICY_VIOLATION,
 *   TOPIC_AUTHORIZATION_FAILED. The message names the topic, the error and the broker's reason
 *   (`Kafka refused to create topic "t1": INVALID_CONFIG: Unknown topic config name: retention.msx.`);
 *   kafkajs does not keep the broker's text, so there the reason is kafkajs's (`Configuration is
 *   invalid`) followed, for INVALID_CONFIG, by the entries the broker refuses when each is asked
 *   alone (`configEntries refused: retention.msx="1000"`). `cause` is the Kafka client's error.
 *   Topics before it in `topics` may have been created.
 * @throws the last error once the retries are spent, or at once another non-retriable error of
 *   the Kafka client.
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

/** A partition count or replication factor: a positive integer, or -1 for the broker's default (as kafkajs). */
const COUNT_RULE = "must be a positive integer, or -1 for the broker's default";
const countOrDefault = z
  .number({ error: COUNT_RULE })
  .int({ error: COUNT_RULE })
  .refine((n) => n === -1 || n >= 1, { error: COUNT_RULE });

/**
 * One topic of {@link ensureTopics}: the fields of {@link TopicSpec}, no other (`partitions`,
 * @platformatic/kafka's name for `numPartitions`, or kafkajs's `replicaAssignment`, which outboxkit
 * does not send, would otherwise be ignored: a topic created with the broker's defaults).
 */
const topicSpecSchema = z.strictObject({
  topic: z
    .string({ error: 'must be a string' })
    .refine((name) => KAFKA_TOPIC_NAME.test(name) && name !== '.' && name !== '..', {
      error:
        "must be a legal Kafka topic name: 1-249 characters of letters, digits, '.', '_' and '-' (not '.' or '..')",
    }),
  numPartitions: countOrDefault.optional(),
  replicationFactor: countOrDefault.optional(),
  configEntries: z
    .array(
      z.strictObject({ name: z.string({ error: 'must be a string' }), value: z.string({ error: 'must be a string' }) }),
      {
        error: 'must be an array of { name, value } strings',
      },
    )
    .optional(),
} satisfies Record<keyof TopicSpec, z.ZodType>);

/**
 * Validates `topics` (see {@link ensureTopics}) and drops repeats of one topic.
 *
 * @throws {@link InvalidOptionsError} naming the topic (and its index) and the field at fault: an
 *   unknown field (with the accepted ones), an illegal name, a count that is not a positive integer
 *   or -1, malformed `configEntries`; or one topic given twice with different settings.
 */
function checkTopics(topics: TopicSpec[]): TopicSpec[] {
  if (!Array.isArray(topics))
    throw new InvalidOptionsError('topics must be an array of { topic, numPartitions?, ... }.');
  const byName = new Map<string, TopicSpec>();
  topics.forEach((t: unknown, i) => {
    if (typeof t !== 'object' || t === null || Array.isArray(t)) {
      throw new InvalidOptionsError(`ensureTopics: topics[${i}] must be an object { topic, numPartitions?, ... }.`);
    }
    const name = (t as { topic?: unknown }).topic;
    const what = `ensureTopics: ${typeof name === 'string' ? `topic ${JSON.stringify(name)} ` : ''}(topics[${i}])`;
    const spec = parseOptions(topicSpecSchema, t, what);
    const seen = byName.get(spec.topic);
    if (seen !== undefined && JSON.stringify(seen) !== JSON.stringify(spec)) {
      throw new InvalidOptionsError(`Topic ${spec.topic} is given twice with different settings.`);
    }
    byName.set(spec.topic, spec);
  });
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
