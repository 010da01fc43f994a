/**
 * A group's offsets committed from outside the group, for {@link KafkaAdmin.commitGroupOffsets}:
 * one OffsetCommit request without a member id and with generation -1 (what Kafka's AdminClient
 * `alterConsumerGroupOffsets` sends). The group coordinator accepts it only while the group has no
 * members, and checks that itself, atomically with the commit (Kafka's GroupCoordinator: a commit
 * with a negative generation is a "simple" commit only for an empty group); with members it
 * answers UNKNOWN_MEMBER_ID (or REBALANCE_IN_PROGRESS while the group syncs).
 *
 * kafkajs 2.2 has no public call for that request. Its `admin.setOffsets` asks whether the group is
 * empty, then joins it with a consumer of its own, seeks each partition and commits one partition
 * at a time as that member: it takes seconds (the join, then a fetch of paused partitions that
 * waits its 5 s), and a member joining between its question and its join shares the group with it.
 * So the request is sent through a kafkajs `Cluster` made by the `Kafka` instance's own factory
 * (kafkajs's private `createCluster`, an own property of every `Kafka`, found by its symbol's
 * description): the brokers, TLS, SASL and retry settings of that instance, nothing else. Where
 * that factory cannot be found (another kafkajs than 2.2), `admin.setOffsets` is used instead:
 * slower, and with the race above.
 */
import type { Admin, Kafka } from 'kafkajs';
import type { KafkaAdmin } from '../types.js';
import { kafkaErrorType } from './errors.js';

/**
 * Errors of a commit from outside the group that say the group has members (Kafka protocol error
 * names): the coordinator does not know the empty member id, or the group is being rebalanced.
 */
const GROUP_ACTIVE_ERRORS: ReadonlySet<string> = new Set([
  'UNKNOWN_MEMBER_ID',
  'REBALANCE_IN_PROGRESS',
  'ILLEGAL_GENERATION',
]);

/** The description of kafkajs's private `Kafka` property that makes clusters (src/index.js, 2.2.x). */
const CREATE_CLUSTER = 'private:Kafka:createCluster';

/** What this module uses of a kafkajs `Cluster` and of its group coordinator (kafkajs 2.2's shapes). */
interface KafkajsCluster {
  connect(): Promise<void>;
  disconnect(): Promise<void>;
  findGroupCoordinator(request: { groupId: string }): Promise<{
    offsetCommit(request: {
      groupId: string;
      groupGenerationId: number;
      memberId: string;
      topics: { topic: string; partitions: { partition: number; offset: string }[] }[];
    }): Promise<unknown>;
  }>;
}

type CreateCluster = (options: { allowAutoTopicCreation: boolean }) => KafkajsCluster;

/** kafkajs's cluster factory of `kafka`, or undefined when this kafkajs has none we recognise. */
function clusterFactoryOf(kafka: Kafka): CreateCluster | undefined {
  const symbol = Object.getOwnPropertySymbols(kafka).find((s) => s.description === CREATE_CLUSTER);
  const factory = symbol === undefined ? undefined : (kafka as unknown as Record<symbol, unknown>)[symbol];
  return typeof factory === 'function' ? (factory as CreateCluster) : undefined;
}

/** Group states in which Kafka accepts a commit from outside the group (DescribeGroups). */
const EMPTY_GROUP_STATES: ReadonlySet<string> = new Set(['Empty', 'Dead']);

/**
 * Commits `offsets` of `topic` for `groupId` from outside the group (see the module's comment).
 *
 * @returns `'group-active'` when the group has members (nothing committed), else `'committed'`.
 * @throws the kafkajs error of any other failure (a retriable one when the broker cannot answer).
 */
export async function commitGroupOffsetsOutsideGroup(
  kafka: Kafka,
  admin: Admin,
  groupId: string,
  topic: string,
  offsets: readonly { partition: number; offset: string }[],
): Promise<'committed' | 'group-active'> {
  if (offsets.length === 0) return 'committed';
  const createCluster = clusterFactoryOf(kafka);
  if (createCluster === undefined) return setOffsetsAsMember(admin, groupId, topic, offsets);
  const cluster = createCluster({ allowAutoTopicCreation: false });
  try {
    await cluster.connect();
    const coordinator = await cluster.findGroupCoordinator({ groupId });
    await coordinator.offsetCommit({
      groupId,
      groupGenerationId: -1,
      memberId: '',
      topics: [{ topic, partitions: offsets.map(({ partition, offset }) => ({ partition, offset })) }],
    });
    return 'committed';
  } catch (err) {
    const type = kafkaErrorType(err);
    if (type !== undefined && GROUP_ACTIVE_ERRORS.has(type)) return 'group-active';
    throw err;
  } finally {
    await cluster.disconnect().catch(() => {});
  }
}

/**
 * The fallback: kafkajs's `admin.setOffsets` (see the module's comment), after asking whether the
 * group has members; asked again when it fails, since a member may have joined meanwhile.
 */
async function setOffsetsAsMember(
  admin: Admin,
  groupId: string,
  topic: string,
  offsets: readonly { partition: number; offset: string }[],
): Promise<'committed' | 'group-active'> {
  const hasMembers = async () => {
    const { groups } = await admin.describeGroups([groupId]);
    return !EMPTY_GROUP_STATES.has(groups[0]?.state ?? 'Dead');
  };
  if (await hasMembers()) return 'group-active';
  try {
    await admin.setOffsets({
      groupId,
      topic,
      partitions: offsets.map(({ partition, offset }) => ({ partition, offset })),
    });
    return 'committed';
  } catch (err) {
    if (await hasMembers().catch(() => false)) return 'group-active';
    throw err;
  }
}

/** The committed offsets of `groupId` for every partition of `topic`; null where none (kafkajs says -1). */
export async function groupOffsetsOf(
  admin: Admin,
  groupId: string,
  topic: string,
): ReturnType<KafkaAdmin['groupOffsets']> {
  const [entry] = await admin.fetchOffsets({ groupId, topics: [topic] });
  return (entry?.partitions ?? []).map((p) => ({
    partition: p.partition,
    // A negative offset is none: kafkajs says -1; a reset may have committed -1 (latest) or -2 (earliest).
    offset: /^[0-9]+$/.test(p.offset) ? p.offset : null,
  }));
}
