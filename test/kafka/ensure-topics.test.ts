/**
 * ensureTopics() (src/kafka/topics.ts) against the real broker: creates only what is missing,
 * reports what existed, waits for every partition's leader, and fails at once on an error that no
 * retry can fix. Its retries of the errors a restarting broker answers are exercised by
 * test/relay/broker-restart.test.ts (topics created while the broker comes back).
 */
import { describe, expect, inject, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { ensureTopics } from '../../src/kafka/topics.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import { spawnCli } from '../helpers/processes.js';
import { randomName, testKafka, topicExists } from '../helpers/kafka.js';

describe('ensureTopics', () => {
  it('creates the missing topics with their partitions and leaders, and leaves existing ones as they are', async () => {
    const kafka = testKafka();
    const [a, b] = [randomName('ensure-a'), randomName('ensure-b')];
    expect(await ensureTopics(kafka, [{ topic: a, numPartitions: 2 }])).toEqual({ created: [a], existing: [] });
    // `a` exists with 2 partitions: asking for 5 does not change it.
    expect(
      await ensureTopics(kafka, [
        { topic: a, numPartitions: 5 },
        { topic: b, numPartitions: 3 },
      ]),
    ).toEqual({ created: [b], existing: [a] });
    const admin = kafka.admin();
    await admin.connect();
    try {
      const { topics } = await admin.fetchTopicMetadata({ topics: [a, b] });
      const byName = new Map(topics.map((t) => [t.name, t.partitions]));
      expect(byName.get(a)).toHaveLength(2);
      expect(byName.get(b)).toHaveLength(3);
      expect([...byName.values()].flat().every((p) => p.leader >= 0)).toBe(true);
      await admin.deleteTopics({ topics: [a, b] });
    } finally {
      await admin.disconnect();
    }
  });

  it('several processes at once: none fails, and each topic is reported created by exactly one', async () => {
    const [x, y] = [randomName('ensure-race-x'), randomName('ensure-race-y')];
    // Separate clients, as separate services starting at the same moment would have.
    const results = await Promise.all([
      ensureTopics(testKafka(), [{ topic: x, numPartitions: 2 }]),
      ensureTopics(testKafka(), [
        { topic: x, numPartitions: 2 },
        { topic: y, numPartitions: 2 },
      ]),
      ensureTopics(testKafka(), [
        { topic: y, numPartitions: 2 },
        { topic: x, numPartitions: 2 },
      ]),
    ]);
    for (const topic of [x, y]) {
      expect(
        results.filter((r) => r.created.includes(topic)),
        topic,
      ).toHaveLength(1);
      const asked = results.filter((r) => r.created.includes(topic) || r.existing.includes(topic));
      expect(asked, topic).toHaveLength(topic === x ? 3 : 2);
    }
    const admin = testKafka().admin();
    await admin.connect();
    try {
      await admin.deleteTopics({ topics: [x, y] });
    } finally {
      await admin.disconnect();
    }
  });

  it('refuses bad input with InvalidOptionsError before creating anything; the same topic twice is asked once', async () => {
    const kafka = testKafka();
    const good = randomName('ensure-good');
    for (const bad of [
      [{ topic: good }, { topic: 'has space' }],
      [{ topic: '' }],
      [{ topic: good, numPartitions: 0 }],
      [{ topic: good, numPartitions: 1.5 }],
      [{ topic: good, replicationFactor: -5 }],
      [
        { topic: good, numPartitions: 1 },
        { topic: good, numPartitions: 2 },
      ],
      // Fields a topic spec does not have: kafkajs's createTopics names, a typo, a bad configEntries.
      [{ topic: good, partitions: 3 }],
      [{ topic: good, numPartitions: 3, replicaAssignment: [] }],
      [{ topic: good, replicationFactr: 1 }],
      [{ topic: good, configEntries: [{ name: 'retention.ms', value: 1 }] }],
      [{ topic: good, configEntries: [{ name: 'retention.ms', value: '1', sensitive: true }] }],
    ] as never[]) {
      const err = await ensureTopics(kafka, bad).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS'), `${JSON.stringify(bad)}: ${String(err)}`).toBe(true);
    }
    const admin = kafka.admin();
    await admin.connect();
    try {
      expect(await admin.listTopics()).not.toContain(good);
    } finally {
      await admin.disconnect();
    }
    expect(await ensureTopics(kafka, [{ topic: good }, { topic: good }])).toEqual({ created: [good], existing: [] });
  });

  it('names an unknown field of a topic and the accepted ones (partitions for numPartitions made 1 partition)', async () => {
    const topic = randomName('ensure-unknown');
    await expect(
      ensureTopics(testKafka(), [
        { topic: randomName('ensure-known'), numPartitions: 1 },
        { topic, partitions: 3 } as never,
      ]),
    ).rejects.toThrow(
      `ensureTopics: topic "${topic}" (topics[1]): unknown option "partitions"; ` +
        'the options are topic, numPartitions, replicationFactor, configEntries.',
    );
    await expect(ensureTopics(testKafka(), [{ topic, numPartitions: 0 }])).rejects.toThrow(
      `ensureTopics: topic "${topic}" (topics[0]): numPartitions must be a positive integer, or -1 for the broker's default, got 0.`,
    );
  });

  it('the CLI names the broker\'s reason for a refused topic (not only "Topic creation errors")', async () => {
    const topic = randomName('ensure-cli');
    const cli = spawnCli(['topics', 'ensure', topic, '--replication-factor', '3']);
    const { code } = await cli.exited;
    expect(code).toBe(1);
    expect(cli.output.join('')).toContain(
      `OUTBOXKIT_INVALID_OPTIONS: Kafka refused to create topic "${topic}": INVALID_REPLICATION_FACTOR`,
    );
  });

  it('timeoutMs bounds the whole call against a broker that refuses connections (BrokerUnavailableError with the cause)', async () => {
    const { Kafka, logLevel } = await import('kafkajs');
    // A port nothing listens on: every connection is refused, and kafkajs retries each connect.
    const unreachable = new Kafka({ clientId: 'ensure-timeout', brokers: ['127.0.0.1:1'], logLevel: logLevel.NOTHING });
    const started = Date.now();
    const err = await ensureTopics(unreachable, [{ topic: randomName('ensure-timeout') }], { timeoutMs: 2_000 }).then(
      () => undefined,
      (e: unknown) => e,
    );
    const took = Date.now() - started;
    expect(isOutboxkitError(err, 'OUTBOXKIT_BROKER_UNAVAILABLE'), String(err)).toBe(true);
    expect((err as Error).message).toMatch(/not ready within 2000 ms \(timeoutMs\)/);
    // Without the bound: kafkajs's connection retries on each of 6 attempts, about a minute.
    expect(took).toBeGreaterThanOrEqual(1_900);
    expect(took).toBeLessThan(8_000);
    await expect(ensureTopics(unreachable, [{ topic: 'x' }], { timeout: 5 } as never)).rejects.toThrow(
      /ensureTopics: unknown option "?timeout/,
    );
  });

  it('the CLI gives up after --timeout-ms on an unreachable broker and its process ends soon after', async () => {
    const started = Date.now();
    const cli = spawnCli(['topics', 'ensure', randomName('ensure-cli-timeout'), '--timeout-ms', '2000'], {
      KAFKA_BROKERS: '127.0.0.1:1',
    });
    const { code } = await cli.exited;
    expect(code).toBe(1);
    expect(cli.output.join('')).toMatch(/OUTBOXKIT_BROKER_UNAVAILABLE: Kafka topics not ready within 2000 ms/);
    // 2 s, the CLI's start-up (tsx) and at most the 2 s exit watchdog; kafkajs alone held it 30 s more.
    expect(Date.now() - started).toBeLessThan(20_000);
  });

  // A topic the broker refuses for what it asks: InvalidOptionsError naming the topic, the
  // broker's error and its reason (kafkajs drops the broker's message: the adapter names the refused
  // configuration entries itself), the client's error as cause, at once (no retries), nothing created.
  for (const client of ['kafkajs', 'platformatic'] as const) {
    const kafka = () =>
      client === 'kafkajs'
        ? testKafka()
        : createPlatformaticClient({ clientId: 'outboxkit-test', brokers: inject('kafkaBrokers') });
    const refused = async (spec: Record<string, unknown>) => {
      const started = Date.now();
      const err = await ensureTopics(kafka(), [spec as never]).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS'), String(err)).toBe(true);
      expect((err as Error).cause).toBeDefined();
      // The backoff of 5 retries would take about 6 s.
      expect(Date.now() - started).toBeLessThan(5_000);
      expect(await topicExists(spec.topic as string)).toBe(false);
      return (err as Error).message;
    };

    it(`${client}: a bad configuration entry is named, and nothing is created`, async () => {
      const topic = randomName('ensure-bad-config');
      const message = await refused({
        topic,
        numPartitions: 1,
        configEntries: [
          { name: 'retention.ms', value: '1000' },
          { name: 'retention.msx', value: '1000' },
        ],
      });
      expect(message).toContain(`Kafka refused to create topic "${topic}": INVALID_CONFIG: `);
      expect(message).toContain('retention.msx');
      expect(message).not.toMatch(/retention\.ms[^x]/);
    });

    it(`${client}: a replication factor above the brokers is named, and nothing is created`, async () => {
      const topic = randomName('ensure-rf');
      const message = await refused({ topic, numPartitions: 1, replicationFactor: 3 });
      expect(message).toContain(`Kafka refused to create topic "${topic}": INVALID_REPLICATION_FACTOR: `);
      expect(message).toMatch(client === 'kafkajs' ? /Replication-factor is invalid/ : /replication factor of 3/);
    });
  }
});
