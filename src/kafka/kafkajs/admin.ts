/**
 * The kafkajs {@link KafkaAdmin}: a kafkajs admin client in outboxkit's shapes. Errors are
 * kafkajs's, as they come.
 */
import type { ConfigResourceTypes, Kafka } from 'kafkajs';
import type { KafkaAdmin } from '../types.js';

/**
 * Kafka's ConfigResource type of a topic (DescribeConfigs). kafkajs's `ConfigResourceTypes.TOPIC`,
 * written out: kafkajs is CommonJS and Node's ESM loader does not see that enum as a named export.
 */
const TOPIC_RESOURCE_TYPE = 2 as ConfigResourceTypes;

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
      const created = await admin.createTopics({ waitForLeaders: true, topics: [spec] });
      return created ? 'created' : 'exists';
    },
    async partitionOffsets(topic) {
      return (await admin.fetchTopicOffsets(topic)).map((p) => ({ partition: p.partition, low: p.low, high: p.high }));
    },
    async deleteGroup(groupId) {
      await admin.deleteGroups([groupId]);
    },
  };
}
