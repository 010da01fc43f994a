/**
 * The broker killed (SIGKILL) and restarted under a running dedup consumer, on a private broker so
 * the shared one is untouched: every message is applied or dead-lettered afterwards, including the
 * dead letters that need the consumer's own producer (DESIGN G4, G5). A message may be
 * dead-lettered twice (sent, then redelivered before its offset commit: docs/guarantees.md G5), so
 * dead letters are compared as a set of event ids.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Kafka, logLevel } from 'kafkajs';
import { freePortBlock, startScratchBroker, type ScratchBroker } from '../../scripts/services.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import type { KafkaClient } from '../../src/kafka/types.js';
import { createTopicsOn, randomName, TEST_KAFKA_CLIENT } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { ConsumerRegistry, record, TestProducer } from './support.js';

let db: TestDatabase;
let broker: ScratchBroker;
let kafka: Kafka;
/** The client of the consumer under test: kafkajs, or @platformatic/kafka with `OUTBOXKIT_KAFKA_CLIENT=platformatic`. */
let consumerKafka: Kafka | KafkaClient;
// A port per Kafka line and process, away from test/relay/broker-restart.test.ts's range.
// Its broker's port and controller port: a free pair, from a base of this file's own.
const PORT = await freePortBlock(2, 19_292 + Number(process.pid % 50) * 2);

beforeAll(async () => {
  db = await createTestDatabase();
  broker = await startScratchBroker(PORT);
  kafka = new Kafka({
    clientId: 'consumer-broker-restart',
    brokers: broker.brokers,
    logLevel: logLevel.NOTHING,
    retry: { initialRetryTime: 100, retries: 3 },
  });
  consumerKafka =
    TEST_KAFKA_CLIENT === 'platformatic'
      ? createPlatformaticClient({
          clientId: 'consumer-broker-restart',
          brokers: broker.brokers,
          retry: { initialRetryTime: 100, retries: 3 },
        })
      : kafka;
}, 120_000);
afterAll(async () => {
  await broker?.destroy();
  await db?.drop();
});

describe('dedup consumer: broker killed and restarted', () => {
  const consumers = new ConsumerRegistry();
  afterAll(() => consumers.stopAll());

  it('applies or dead-letters every message sent before, during and after the outage', async () => {
    const topic = randomName('consumer-restart');
    const dlq = `${topic}.dlq`;
    await createTopicsOn(kafka, [
      { topic, numPartitions: 3 },
      { topic: dlq, numPartitions: 1 },
    ]);
    const applied = new Set<string>();
    const consumer = consumers.create({
      kafka: consumerKafka,
      topics: [topic],
      database: db.pool,
      sessionTimeoutMs: 6_000,
      maxAttempts: 2,
      handler: async ({ event }) => {
        if ((event.json() as { bad?: boolean }).bad) throw new Error('refused by the test');
        applied.add(event.id);
      },
    });
    const seen = record(consumer);
    await consumer.start();

    const producer = new TestProducer(kafka);
    const good: string[] = [];
    const bad: string[] = [];
    const sendRound = async (round: number) => {
      for (let p = 0; p < 3; p++) {
        const ids = await producer.send(topic, [
          { partition: p, value: { round, n: 1 } },
          { partition: p, value: { round, bad: true } },
          { partition: p, value: { round, n: 2 } },
        ]);
        good.push(ids[0]!, ids[2]!);
        bad.push(ids[1]!);
      }
    };
    await sendRound(1);
    await waitFor(() => applied.size === 6 && seen.deadLettered.length === 3, {
      timeoutMs: 30_000,
      message: 'round 1 applied and dead-lettered',
    });

    await broker.kill('SIGKILL');
    await new Promise((r) => setTimeout(r, 8_000)); // the consumer's clients fail and retry meanwhile
    await broker.restart();
    const back = Date.now();
    const crashes: string[] = [];
    consumer.on('consumer:crash', ({ error, restart }) => {
      let e: unknown = error;
      const chain: string[] = [];
      while (e instanceof Error) {
        chain.push(`${e.name}: ${e.message}`);
        e = e.cause;
      }
      crashes.push(`+${Date.now() - back} ms restart=${restart} ${chain.join(' <- ')}`);
    });
    await sendRound(2);
    const deadLettered = () => new Set(seen.deadLettered.map((d) => d.eventId));
    await waitFor(() => applied.size === 12 && deadLettered().size === 6, {
      timeoutMs: 90_000,
      message: () =>
        `round 2: ${applied.size}/12 applied, ${deadLettered().size}/6 dead-lettered, crashes:\n${crashes.join('\n')}`,
    });
    expect([...applied].sort()).toEqual([...good].sort());
    expect([...deadLettered()].sort()).toEqual([...bad].sort());
    await producer.close();
  }, 180_000);

  it("says 'crashed' when kafkajs gives up on the consumer, and stop() still works", async () => {
    const topic = randomName('consumer-crash');
    await createTopicsOn(kafka, [
      { topic, numPartitions: 1 },
      { topic: `${topic}.dlq`, numPartitions: 1 },
    ]);
    // The application's Kafka client refuses restarts: kafkajs then stops the consumer for good
    // after its retries, as it does on its own for errors it does not retry.
    const noRestart = new Kafka({
      clientId: 'consumer-no-restart',
      brokers: broker.brokers,
      logLevel: logLevel.NOTHING,
      retry: { initialRetryTime: 50, retries: 1, restartOnFailure: async () => false },
    });
    const consumer = consumers.create({
      kafka: noRestart,
      topics: [topic],
      database: db.pool,
      handler: async () => {},
    });
    const seen = record(consumer);
    await consumer.start();
    expect(consumer.state).toBe('running');
    await broker.kill('SIGKILL');
    try {
      await waitFor(() => consumer.state === 'crashed', { timeoutMs: 60_000, message: () => consumer.state });
      expect(seen.crashes.some((c) => !c.restart)).toBe(true);
    } finally {
      await broker.restart();
    }
    await consumer.stop();
    expect(consumer.state).toBe('stopped');
  }, 120_000);
});
