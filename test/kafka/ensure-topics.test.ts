/**
 * ensureTopics() (src/kafka/topics.ts) against the real broker: creates only what is missing,
 * reports what existed, waits for every partition's leader, and fails at once on an error that no
 * retry can fix. Its retries of the errors a restarting broker answers are exercised by
 * test/relay/broker-restart.test.ts (topics created while the broker comes back).
 */
import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { ensureTopics } from '../../src/kafka/topics.js';
import { spawnCli } from '../helpers/processes.js';
import { randomName, testKafka } from '../helpers/kafka.js';

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
    ]) {
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

  it('the CLI names the broker\'s reason for a refused topic (not only "Topic creation errors")', async () => {
    const topic = randomName('ensure-cli');
    const cli = spawnCli(['topics', 'ensure', topic, '--replication-factor', '3']);
    const { code } = await cli.exited;
    expect(code).toBe(1);
    expect(cli.output.join('')).toMatch(new RegExp(`Topic creation errors \\(${topic}: INVALID_REPLICATION_FACTOR`));
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

  it('a non-retriable error (a replication factor above the brokers) fails at once, without retries', async () => {
    const started = Date.now();
    const err = await ensureTopics(testKafka(), [{ topic: randomName('ensure-rf'), replicationFactor: 3 }]).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeDefined();
    expect(JSON.stringify((err as { errors?: unknown }).errors ?? err)).toMatch(
      /INVALID_REPLICATION_FACTOR|replication/i,
    );
    // The backoff of 5 retries would take about 6 s.
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});
