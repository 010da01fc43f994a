/**
 * Prometheus metrics of the dedup consumer: applied, duplicates, retries, dead-lettered and the
 * handler latency, labelled by group and topic, never by event id.
 */
import client from 'prom-client';
import { v7 as uuidv7 } from 'uuid';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { consumerMetrics } from '../../consumer/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

describe('consumerMetrics', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL)');
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  /** The value of the sample `name{..., topic="<topic>", ...}` in the text exposition format. */
  function sample(text: string, name: string, topic: string): number | undefined {
    const escaped = name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const m = new RegExp(`^${escaped}\\{[^}]*topic="${topic}"[^}]*\\} (\\S+)$`, 'm').exec(text);
    return m ? Number(m[1]) : undefined;
  }

  it('counts applied, duplicate, retried and dead-lettered messages and observes handler latency', async () => {
    const [topic, quiet] = await createTopicsWithDlq(['metrics', 'metrics-quiet']);
    const flaky = uuidv7();
    let flakyRuns = 0;
    const consumer = consumers.create({
      topics: [topic!, quiet!],
      database: db.pool,
      handler: async ({ tx, event }) => {
        if (event.id === flaky && ++flakyRuns === 1) throw new Error('transient');
        await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
      },
    });
    const registry = new client.Registry();
    const stopMetrics = consumerMetrics(consumer, registry);
    const seen = record(consumer);
    await consumer.start();

    const dup = uuidv7();
    await producer.send(topic!, [
      { partition: 0, value: { n: 1 } },
      { partition: 0, eventId: dup, value: { n: 2 } },
      { partition: 1, eventId: dup, value: { n: 2 } },
      { partition: 1, eventId: flaky, value: { n: 3 } },
      { partition: 2, eventId: null, value: { n: 4 } },
    ]);
    await waitFor(() => seen.applied.length === 3 && seen.duplicates.length === 1 && seen.deadLettered.length === 1);

    const text = await registry.metrics();
    expect(sample(text, 'outboxkit_consumer_applied_total', topic!)).toBe(3);
    expect(sample(text, 'outboxkit_consumer_duplicates_total', topic!)).toBe(1);
    expect(sample(text, 'outboxkit_consumer_retries_total', topic!)).toBe(1);
    expect(sample(text, 'outboxkit_consumer_dead_lettered_total', topic!)).toBe(1);
    expect(sample(text, 'outboxkit_consumer_errors_total', topic!)).toBe(0);
    expect(sample(text, 'outboxkit_consumer_handler_duration_seconds_count', topic!)).toBe(3);
    // Every consumed topic has its series from the start, at 0.
    expect(sample(text, 'outboxkit_consumer_applied_total', quiet!)).toBe(0);
    expect(text).toContain(`outboxkit_consumer_applied_total{group="${consumer.groupId}",topic="${topic}"} 3`);
    expect(text).toMatch(/outboxkit_consumer_handler_duration_seconds_bucket\{le="30",group="[^"]+",topic="[^"]+"\} 3/);
    // Never an event id in a label.
    for (const id of [flaky, dup]) expect(text).not.toContain(id);

    stopMetrics();
    await producer.send(topic!, [{ partition: 0, value: { n: 5 } }]);
    await waitFor(() => seen.applied.length === 4);
    expect(sample(await registry.metrics(), 'outboxkit_consumer_applied_total', topic!)).toBe(3);
  });

  it('lets two consumers share one registry (series per group)', async () => {
    const [topic] = await createTopicsWithDlq(['metrics-shared']);
    const registry = new client.Registry();
    const a = consumers.create({ topics: [topic!], database: db.pool, handler: async () => {} });
    const b = consumers.create({ topics: [topic!], database: db.pool, handler: async () => {} });
    consumerMetrics(a, registry);
    consumerMetrics(b, registry);
    const text = await registry.metrics();
    expect(text).toContain(`outboxkit_consumer_applied_total{group="${a.groupId}",topic="${topic}"} 0`);
    expect(text).toContain(`outboxkit_consumer_applied_total{group="${b.groupId}",topic="${topic}"} 0`);
  });
});
