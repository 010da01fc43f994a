/**
 * The @platformatic/kafka {@link KafkaAdmin}: what the relay asks the cluster (metadata, topic
 * configurations), topic creation, and the dedup consumer's offset and group requests.
 */
import type { KafkaAdmin, TopicPartitions, TopicSpec } from '../types.js';
import { protocolErrorName, topicRefusalOf, withAuthenticationMessage, withUnreachableMessage } from './errors.js';
import { topicRefusedError } from '../topic-refused.js';
import { loadPlatformaticKafka, type PlatformaticKafka } from './load.js';
import { retryDelayOf, saslMechanismOf, type PlatformaticConnection } from './producer.js';

type Admin = InstanceType<PlatformaticKafka['Admin']>;

/** Kafka's ConfigResource type of a topic (DescribeConfigs). */
const TOPIC_RESOURCE = 2;

/**
 * A @platformatic/kafka-backed {@link KafkaAdmin}; the module loads on `connect()`. An
 * authentication failure rejects with an error that names it (see
 * {@link withAuthenticationMessage}), brokers that could not be reached with a
 * `BrokerUnavailableError` naming them ({@link withUnreachableMessage}).
 */
export function platformaticAdmin(connection: PlatformaticConnection): KafkaAdmin {
  const admin = rawAdmin(connection);
  const mechanism = saslMechanismOf(connection);
  const named =
    <A extends unknown[], R>(method: (...args: A) => Promise<R>) =>
    (...args: A): Promise<R> =>
      method.apply(admin, args).catch((err: unknown) => {
        throw withUnreachableMessage(withAuthenticationMessage(err, mechanism), connection.bootstrapBrokers);
      });
  return {
    ...admin,
    connect: named(admin.connect),
    probe: named(admin.probe),
    listTopics: named(admin.listTopics),
    describeTopics: named(admin.describeTopics),
    describeTopicConfigs: named(admin.describeTopicConfigs),
    createTopic: named(admin.createTopic),
    partitionOffsets: named(admin.partitionOffsets),
    deleteGroup: named(admin.deleteGroup),
    groupOffsets: named(admin.groupOffsets),
    commitGroupOffsets: named(admin.commitGroupOffsets),
  };
}

function rawAdmin(connection: PlatformaticConnection): KafkaAdmin {
  let admin: Admin | undefined;
  const initialMs = typeof connection.retryDelay === 'number' ? connection.retryDelay : 100;
  const make = (kafka: PlatformaticKafka, strict: boolean): Admin =>
    new kafka.Admin({
      ...connection,
      retryDelay: retryDelayOf(initialMs, Math.max(initialMs, 1_000)),
      strict,
    } as ConstructorParameters<PlatformaticKafka['Admin']>[0]);
  const get = async (): Promise<Admin> => {
    if (admin) return admin;
    const kafka = await loadPlatformaticKafka();
    admin ??= make(kafka, true);
    return admin;
  };
  /**
   * Creates `spec`'s topic with its configurations. 1.35.0 checks `createTopics`'s options against
   * a schema without `configs` (its types and its CreateTopics request carry them; 2.12.1's schema
   * has them), so with `strict: true` it refuses every topic configuration. A client made without
   * `strict` skips that check (1.35.0 and 2.12.1 read `strict` only there: `kValidateOptions`),
   * for this one request, whose fields come from the typed {@link TopicSpec}.
   */
  const createWithConfigs = async (spec: TopicSpec & { configEntries: { name: string; value: string }[] }) => {
    const lenient = make(await loadPlatformaticKafka(), false);
    try {
      await lenient.createTopics({
        topics: [spec.topic],
        partitions: spec.numPartitions ?? -1,
        replicas: spec.replicationFactor ?? -1,
        configs: spec.configEntries.map(({ name, value }) => ({ name, value })),
      });
    } finally {
      await lenient.close().catch(() => undefined);
    }
  };
  return {
    async connect() {
      await (await get()).metadata({ topics: [] });
    },
    async disconnect() {
      const a = admin;
      admin = undefined;
      await a?.close();
    },
    async probe() {
      await (await get()).metadata({ topics: [], forceUpdate: true });
    },
    async listTopics() {
      return (await get()).listTopics({ includeInternals: true });
    },
    async describeTopics(topics): Promise<TopicPartitions[]> {
      const metadata = await (await get()).metadata({ topics: [...topics], forceUpdate: true });
      return topics.map((name) => {
        const t = metadata.topics.get(name);
        return {
          name,
          partitions: (t?.partitions ?? []).map((p, partition) => ({
            partition,
            leader: p.leader >= 0 ? p.leader : null,
            replicas: p.replicas,
            isr: p.isr,
          })),
        };
      });
    },
    async describeTopicConfigs(topics, configNames) {
      const described = await (
        await get()
      ).describeConfigs({
        resources: topics.map((resourceName) => ({
          resourceType: TOPIC_RESOURCE,
          resourceName,
          configurationKeys: [...configNames],
        })),
        includeSynonyms: false,
        includeDocumentation: false,
      });
      const out = new Map<string, Record<string, string | null>>();
      for (const d of described) {
        const values: Record<string, string | null> = {};
        for (const c of d.configs) values[c.name] = c.isSensitive ? null : (c.value ?? null);
        out.set(d.resourceName, values);
      }
      return out;
    },
    async createTopic(spec) {
      const a = await get();
      try {
        const { configEntries } = spec;
        if (configEntries?.length) await createWithConfigs({ ...spec, configEntries });
        else {
          await a.createTopics({
            topics: [spec.topic],
            partitions: spec.numPartitions ?? -1,
            replicas: spec.replicationFactor ?? -1,
          });
        }
      } catch (err) {
        if (protocolErrorName(err) === 'TOPIC_ALREADY_EXISTS') return 'exists';
        const refusal = topicRefusalOf(err);
        if (refusal) throw topicRefusedError(spec.topic, refusal.name, refusal.message, err);
        throw err;
      }
      // Until every partition has a leader (as kafkajs's createTopics waits), at most ~10 s.
      for (let i = 0; i < 50; i++) {
        const [t] = await this.describeTopics([spec.topic]);
        if (t && t.partitions.length > 0 && t.partitions.every((p) => p.leader !== null)) break;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
      return 'created';
    },
    async partitionOffsets(topic) {
      const a = await get();
      const [t] = await this.describeTopics([topic]);
      const partitions = (t?.partitions ?? []).map((p) => p.partition);
      const list = (timestamp: bigint) =>
        a.listOffsets({
          topics: [{ name: topic, partitions: partitions.map((partitionIndex) => ({ partitionIndex, timestamp })) }],
        } as Parameters<Admin['listOffsets']>[0]);
      // ListOffsets with Kafka's special timestamps: -2 the earliest offset, -1 the log end.
      const [lows, highs] = await Promise.all([list(-2n), list(-1n)]);
      const offsetOf = (listed: Awaited<ReturnType<Admin['listOffsets']>>, partition: number) =>
        listed.find((x) => x.name === topic)?.partitions.find((p) => p.partitionIndex === partition)?.offset ?? 0n;
      return partitions.map((partition) => ({
        partition,
        low: offsetOf(lows, partition).toString(),
        high: offsetOf(highs, partition).toString(),
      }));
    },
    async deleteGroup(groupId) {
      await (await get()).deleteGroups({ groups: [groupId] });
    },
    async groupOffsets(groupId, topic) {
      const a = await get();
      const [t] = await this.describeTopics([topic]);
      const partitions = (t?.partitions ?? []).map((p) => p.partition);
      const [group] = await a.listConsumerGroupOffsets({
        groups: [{ groupId, topics: [{ name: topic, partitionIndexes: partitions }] }],
      });
      const committed = group?.topics.find((x) => x.name === topic)?.partitions ?? [];
      return partitions.map((partition) => {
        const offset = committed.find((p) => p.partitionIndex === partition)?.committedOffset;
        return { partition, offset: offset === undefined || offset < 0n ? null : offset.toString() };
      });
    },
    async commitGroupOffsets(groupId, topic, offsets) {
      try {
        await (
          await get()
        ).alterConsumerGroupOffsets({
          groupId,
          topics: [
            {
              name: topic,
              partitionOffsets: offsets.map((o) => ({ partition: o.partition, offset: BigInt(o.offset) })),
            },
          ],
        });
        return 'committed';
      } catch (err) {
        const name = protocolErrorName(err);
        if (name === 'UNKNOWN_MEMBER_ID' || name === 'REBALANCE_IN_PROGRESS' || name === 'ILLEGAL_GENERATION') {
          return 'group-active';
        }
        throw err;
      }
    },
  };
}
