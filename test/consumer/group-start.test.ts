/**
 * consumer/group-start.ts against the real broker and PostgreSQL: where a dedup consumer group
 * begins on each topic with fromBeginning false. A topic's first start commits the end offset of
 * every partition for the group, once, also when members start at once; a topic the group already
 * consumed is left as it is; a running group refuses the commit, and the topic then goes by Kafka's
 * "latest" policy, with a warning.
 */
import type { Kafka } from 'kafkajs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { planGroupStart } from '../../consumer/group-start.js';
import { resolveDedupConsumerOptions } from '../../consumer/options.js';
import { createKafkajsClient } from '../../src/kafka/kafkajs/client.js';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName, testKafka } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { committedOffsets, createTopicsWithDlq, logEndOffsets, TestProducer } from './support.js';

/** A logger that keeps the messages of each level. */
function recordingLogger(): Logger & { infos: string[]; warns: string[] } {
  const infos: string[] = [];
  const warns: string[] = [];
  return {
    infos,
    warns,
    debug() {},
    info: (_o, m) => void infos.push(m),
    warn: (_o, m) => void warns.push(m),
    error() {},
  };
}

describe('planGroupStart (fromBeginning false)', () => {
  let db: TestDatabase;
  const kafka: Kafka = testKafka('outboxkit-group-start-test');
  const client = createKafkajsClient(kafka);
  const producer = new TestProducer();
  const members: { disconnect(): Promise<void> }[] = [];

  beforeAll(async () => {
    db = await createTestDatabase();
  });
  afterEach(async () => {
    await Promise.all(members.splice(0).map((m) => m.disconnect()));
  });
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  function options(groupId: string, topics: string[], logger: Logger, fromBeginning = false) {
    return resolveDedupConsumerOptions({
      kafka,
      groupId,
      topics,
      database: db.pool,
      fromBeginning,
      logger,
      handler: async () => {},
    });
  }

  /** Some records on each of the 3 partitions of `topic`. */
  async function publish(topic: string, perPartition: number): Promise<void> {
    await producer.send(
      topic,
      Array.from({ length: perPartition * 3 }, (_, i) => ({ partition: i % 3, value: { i } })),
    );
  }

  it("a topic's first start commits the end of every partition, once, when two members start at once", async () => {
    const [topic] = await createTopicsWithDlq(['group-start']);
    await publish(topic!, 2);
    const groupId = randomName('group');
    const loggers = [recordingLogger(), recordingLogger()];
    const plans = await Promise.all(loggers.map((l) => planGroupStart(client, options(groupId, [topic!], l))));

    expect(plans).toEqual([
      { fromBeginning: [topic], fromEnd: [] },
      { fromBeginning: [topic], fromEnd: [] },
    ]);
    expect(await committedOffsets(kafka, groupId, topic!)).toEqual(await logEndOffsets(kafka, topic!));
    // The advisory lock made the second member see the first one's commit.
    const firstStarts = loggers.flatMap((l) => l.infos).filter((m) => m.startsWith('First start of the group'));
    expect(firstStarts).toHaveLength(1);
  });

  it('a topic the group consumed already keeps its committed offsets', async () => {
    const [topic] = await createTopicsWithDlq(['group-start']);
    const groupId = randomName('group');
    await planGroupStart(client, options(groupId, [topic!], recordingLogger()));
    const first = await committedOffsets(kafka, groupId, topic!);
    await publish(topic!, 3);

    const logger = recordingLogger();
    expect(await planGroupStart(client, options(groupId, [topic!], logger))).toEqual({
      fromBeginning: [topic],
      fromEnd: [],
    });
    expect(await committedOffsets(kafka, groupId, topic!)).toEqual(first);
    expect(logger.infos).toEqual([]);
  });

  it('fromBeginning true commits nothing', async () => {
    const [topic] = await createTopicsWithDlq(['group-start']);
    const groupId = randomName('group');
    expect(await planGroupStart(client, options(groupId, [topic!], recordingLogger(), true))).toEqual({
      fromBeginning: [topic],
      fromEnd: [],
    });
    expect([...(await committedOffsets(kafka, groupId, topic!)).values()]).toEqual([-1, -1, -1]);
  });

  it("a topic new to a group whose members run: nothing committed, Kafka's latest policy, a warning", async () => {
    const [running, added] = await createTopicsWithDlq(['group-start-running', 'group-start-added']);
    await publish(added!, 1);
    const groupId = randomName('group');
    // A member of the group runs on another topic.
    const member = kafka.consumer({ groupId, maxWaitTimeInMs: 100 });
    members.push(member);
    await member.connect();
    await member.subscribe({ topic: running!, fromBeginning: true });
    let joined = false;
    member.on(member.events.GROUP_JOIN, () => (joined = true));
    await member.run({ eachMessage: async () => {} });
    await waitFor(() => joined, { timeoutMs: 30_000 });

    const logger = recordingLogger();
    expect(await planGroupStart(client, options(groupId, [added!], logger))).toEqual({
      fromBeginning: [],
      fromEnd: [added],
    });
    expect([...(await committedOffsets(kafka, groupId, added!)).values()]).toEqual([-1, -1, -1]);
    expect(logger.warns.join('\n')).toMatch(/has members already/);
  });
});
