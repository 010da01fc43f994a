/**
 * KafkaAdmin.groupOffsets and commitGroupOffsets of the kafkajs adapter
 * (src/kafka/kafkajs/group-offsets.ts) against the real broker: a commit from outside the group
 * lands on every partition while the group has no members, and is refused, with nothing committed,
 * while it has one. Both ways of sending it: the request through kafkajs's own cluster factory, and
 * the fallback through `admin.setOffsets` when that factory cannot be found.
 */
import type { Admin, Consumer, Kafka } from 'kafkajs';
import { afterEach, describe, expect, inject, it } from 'vitest';
import { createKafkajsClient } from '../../src/kafka/kafkajs/client.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import { commitGroupOffsetsOutsideGroup } from '../../src/kafka/kafkajs/group-offsets.js';
import type { KafkaAdmin } from '../../src/kafka/types.js';
import { createTopics, randomName, testKafka } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';

const kafka: Kafka = testKafka('outboxkit-group-offsets-test');

/** A running member of `groupId` on `topic`. */
async function runningMember(groupId: string, topic: string): Promise<Consumer> {
  const member = kafka.consumer({ groupId, maxWaitTimeInMs: 100 });
  await member.connect();
  await member.subscribe({ topic, fromBeginning: true });
  let joined = false;
  member.on(member.events.GROUP_JOIN, () => (joined = true));
  await member.run({ eachMessage: async () => {} });
  await waitFor(() => joined, { timeoutMs: 30_000 });
  return member;
}

describe('commitGroupOffsets (kafkajs)', () => {
  const open: { disconnect(): Promise<void> }[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((c) => c.disconnect()));
  });

  /**
   * What both adapters must do: a commit of every partition of an empty group lands; with a member
   * running, the commit is refused as 'group-active' and nothing moves.
   */
  async function commitsWhileEmptyRefusesWhileActive(admin: KafkaAdmin, topic: string): Promise<void> {
    const groupId = randomName('group');
    expect(await admin.groupOffsets(groupId, topic)).toEqual(
      [0, 1, 2].map((partition) => ({ partition, offset: null })),
    );
    const offsets = [0, 1, 2].map((partition) => ({ partition, offset: '0' }));
    expect(await admin.commitGroupOffsets(groupId, topic, offsets)).toBe('committed');
    expect(await admin.groupOffsets(groupId, topic)).toEqual(offsets);

    open.push(await runningMember(groupId, topic));
    const later = [0, 1, 2].map((partition) => ({ partition, offset: '5' }));
    expect(await admin.commitGroupOffsets(groupId, topic, later)).toBe('group-active');
    expect(await admin.groupOffsets(groupId, topic)).toEqual(offsets);
  }

  it('commits every partition of an empty group in one request; refuses while the group has a member', async () => {
    const [topic] = await createTopics(['group-offsets']);
    const admin = createKafkajsClient(kafka).admin();
    await admin.connect();
    open.push(admin);
    await commitsWhileEmptyRefusesWhileActive(admin, topic!);
  });

  it('the same on @platformatic/kafka (alterConsumerGroupOffsets), with its partition offsets', async () => {
    const [topic] = await createTopics(['group-offsets']);
    const admin = createPlatformaticClient({
      clientId: 'outboxkit-group-offsets-test',
      brokers: inject('kafkaBrokers'),
    }).admin();
    await admin.connect();
    open.push(admin);

    expect(await admin.partitionOffsets(topic!)).toEqual(
      [0, 1, 2].map((partition) => ({ partition, low: '0', high: '0' })),
    );
    await commitsWhileEmptyRefusesWhileActive(admin, topic!);
  });

  it("without kafkajs's cluster factory: the same through admin.setOffsets", async () => {
    const [topic] = await createTopics(['group-offsets']);
    const groupId = randomName('group');
    const admin: Admin = kafka.admin();
    await admin.connect();
    open.push(admin);
    // An object without kafkajs's private property: the fallback.
    const noFactory = {} as Kafka;
    const offsets = [0, 1, 2].map((partition) => ({ partition, offset: '0' }));

    expect(await commitGroupOffsetsOutsideGroup(noFactory, admin, groupId, topic!, offsets)).toBe('committed');
    const [entry] = await admin.fetchOffsets({ groupId, topics: [topic!] });
    expect(entry!.partitions.map((p) => p.offset)).toEqual(['0', '0', '0']);

    open.push(await runningMember(groupId, topic!));
    expect(await commitGroupOffsetsOutsideGroup(noFactory, admin, groupId, topic!, offsets)).toBe('group-active');
  });
});
