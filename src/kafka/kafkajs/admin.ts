/**
 * The kafkajs {@link KafkaAdmin}: a kafkajs admin client in outboxkit's shapes. Errors are
 * kafkajs's, as they come, except a topic the broker refuses to create (`createTopic`):
 * `InvalidOptionsError` (../topic-refused.ts).
 */
import type { Admin, ConfigResourceTypes, Kafka } from 'kafkajs';
import type { KafkaAdmin, TopicSpec } from '../types.js';
import { TOPIC_REFUSAL_CODES, topicRefusedError } from '../topic-refused.js';
import { commitGroupOffsetsOutsideGroup, groupOffsetsOf } from './group-offsets.js';

/**
 * Kafka's ConfigResource type of a topic (DescribeConfigs). kafkajs's `ConfigResourceTypes.TOPIC`,
 * written out: kafkajs is CommonJS and Node's ESM loader does not see that enum as a named export.
 */
const TOPIC_RESOURCE_TYPE = 2 as ConfigResourceTypes;

/** How long `createTopic` waits for a new topic's partition leaders, in ms (kafkajs' own createTopics timeout). */
export const LEADER_WAIT_MS = 5_000;

/**
 * Resolves once every partition of `topic` has a leader, asking every 100 ms for at most
 * {@link LEADER_WAIT_MS}. kafkajs' `waitForLeaders` did this by retrying a metadata request until
 * it stopped failing; with the metadata fix (./metadata-fix.ts) a partition without a leader no
 * longer fails it, so the leaders are checked here. A broker that does not know the new topic yet
 * (UNKNOWN_TOPIC_OR_PARTITION) is asked again.
 *
 * @throws Error `Timed out while waiting for topic leaders` (as kafkajs), with the last error as `cause`.
 */
async function waitForLeaders(admin: Admin, topic: string): Promise<void> {
  const deadline = performance.now() + LEADER_WAIT_MS;
  let last: unknown;
  for (;;) {
    try {
      const { topics } = await admin.fetchTopicMetadata({ topics: [topic] });
      const partitions = topics[0]?.partitions ?? [];
      if (partitions.length > 0 && partitions.every((p) => p.leader >= 0)) return;
      last = undefined;
    } catch (err) {
      last = err;
    }
    if (performance.now() >= deadline) {
      throw new Error(`Timed out while waiting for topic leaders of ${topic}`, { cause: last });
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** A topic's error in kafkajs's "Topic creation errors" (KafkaJSAggregateError of KafkaJSCreateTopicError). */
interface CreateTopicError {
  type?: unknown;
  code?: unknown;
  message?: unknown;
}

/** The refusal (see {@link TOPIC_REFUSAL_CODES}) among `err`'s per-topic errors, if any. */
function refusalOf(err: unknown): { type: string; message: string } | undefined {
  const errors = (err as { errors?: unknown } | null)?.errors;
  if (!Array.isArray(errors)) return undefined;
  for (const e of errors as CreateTopicError[]) {
    if (typeof e?.code === 'number' && TOPIC_REFUSAL_CODES.has(e.code)) {
      return { type: String(e.type), message: typeof e.message === 'string' ? e.message : '' };
    }
  }
  return undefined;
}

/**
 * `err` itself, or for a refusal of the topic (see {@link TOPIC_REFUSAL_CODES}) an
 * `InvalidOptionsError` naming it. kafkajs keeps the error's name but drops the broker's message
 * (its CreateTopics parser reads only the error code), so for INVALID_CONFIG each configuration
 * entry is asked alone (`validateOnly`, nothing created) to name the ones the broker refuses.
 */
async function refusedOr(admin: Admin, spec: TopicSpec, err: unknown): Promise<unknown> {
  const refusal = refusalOf(err);
  if (!refusal) return err;
  let reason = refusal.message;
  const entries = spec.configEntries ?? [];
  if (refusal.type === 'INVALID_CONFIG' && entries.length > 0) {
    const refused: string[] = [];
    for (const entry of entries) {
      const alone = await admin
        .createTopics({ validateOnly: true, topics: [{ ...spec, configEntries: [entry] }] })
        .then(
          () => undefined,
          (e: unknown) => refusalOf(e),
        );
      if (alone?.type === 'INVALID_CONFIG') refused.push(`${entry.name}=${JSON.stringify(entry.value)}`);
    }
    if (refused.length > 0) reason = `${reason.replace(/\.$/, '')} (configEntries refused: ${refused.join(', ')})`;
  }
  return topicRefusedError(spec.topic, refusal.type, reason, err);
}

/** A kafkajs-backed {@link KafkaAdmin} (see `KafkaClient.admin`). */
export function kafkajsAdmin(kafka: Kafka): KafkaAdmin {
  const admin = kafka.admin();
  return {
    connect: () => admin.connect(),
    disconnect: () => admin.disconnect(),
    async probe() {
      await admin.describeCluster();
    },
    listTopics: () => admin.listTopics(),
    async describeTopics(topics) {
      const { topics: metadata } = await admin.fetchTopicMetadata({ topics: [...topics] });
      return metadata.map((t) => ({
        name: t.name,
        // kafkajs says -1 for a partition without a leader.
        partitions: t.partitions.map((p) => ({
          partition: p.partitionId,
          leader: p.leader < 0 ? null : p.leader,
          replicas: p.replicas,
          isr: p.isr,
        })),
      }));
    },
    async describeTopicConfigs(topics, configNames) {
      const { resources } = await admin.describeConfigs({
        includeSynonyms: false,
        resources: topics.map((name) => ({ type: TOPIC_RESOURCE_TYPE, name, configNames: [...configNames] })),
      });
      const configs = new Map<string, Record<string, string | null>>();
      for (const r of resources) {
        const values: Record<string, string | null> = {};
        for (const e of r.configEntries) values[e.configName] = e.configValue ?? null;
        configs.set(r.resourceName, values);
      }
      return configs;
    },
    async createTopic(spec) {
      // One topic per request: kafkajs resolves false when the topic exists, but fails the whole
      // request when only some of its topics exist.
      const created = await admin
        .createTopics({ waitForLeaders: false, topics: [spec] })
        .catch(async (err: unknown) => {
          throw await refusedOr(admin, spec, err);
        });
      if (created) await waitForLeaders(admin, spec.topic);
      return created ? 'created' : 'exists';
    },
    async partitionOffsets(topic) {
      return (await admin.fetchTopicOffsets(topic)).map((p) => ({ partition: p.partition, low: p.low, high: p.high }));
    },
    async deleteGroup(groupId) {
      await admin.deleteGroups([groupId]);
    },
    groupOffsets: (groupId, topic) => groupOffsetsOf(admin, groupId, topic),
    commitGroupOffsets: (groupId, topic, offsets) =>
      commitGroupOffsetsOutsideGroup(kafka, admin, groupId, topic, offsets),
  };
}
