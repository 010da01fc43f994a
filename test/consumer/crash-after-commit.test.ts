/**
 * G4 · the consumer process is killed (SIGKILL) after its handler transaction commits and before
 * the offset is committed: Kafka redelivers the event to the next member of the group, which
 * skips it as a duplicate (no second effect) and commits the offsets to the log end.
 */
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { CRASH_POINT_AFTER_COMMIT } from '../../consumer/dedup-consumer.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  type ChildConsumer,
  committedAtLogEnd,
  committedOffsets,
  ConsumerRegistry,
  createTopicsWithDlq,
  record,
  startChildConsumer,
  TestProducer,
} from './support.js';

describe('G4 · SIGKILL after the transaction commits, before the offset commit', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  const children = new Set<ChildConsumer>();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL)');
  });
  afterEach(async () => {
    for (const child of children) {
      if (child.alive()) {
        child.proc.kill('SIGKILL');
        await child.exited;
      }
    }
    children.clear();
    await consumers.stopAll();
  });
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  async function effectsPerEvent(): Promise<Map<string, number>> {
    const { rows } = await db.pool.query<{ event_id: string; n: number }>(
      'SELECT event_id, count(*)::int AS n FROM effects GROUP BY event_id',
    );
    return new Map(rows.map((r) => [r.event_id, r.n]));
  }

  it('redelivers the committed event to a restarted member, which skips it; offsets end at the log end', async () => {
    const [topic] = await createTopicsWithDlq(['crash-after-commit']);
    const groupId = randomName('group');
    const child = await startChildConsumer({
      TEST_DATABASE_URL: db.url,
      KAFKA_BROKERS: inject('kafkaBrokers').join(','),
      TEST_TOPIC: topic!,
      TEST_GROUP_ID: groupId,
      OUTBOXKIT_CRASH_POINT: CRASH_POINT_AFTER_COMMIT,
      OUTBOXKIT_CRASH_AFTER: '3',
    });
    children.add(child);

    // Six events on partition 0, sent in one request: one record batch, one fetch.
    const ids = await producer.send(
      topic!,
      Array.from({ length: 6 }, (_, i) => ({ partition: 0, value: { i } })),
    );
    expect((await child.exited).signal).toBe('SIGKILL');
    const committed = child.committed();
    expect(committed.map((c) => c.outcome)).toEqual(['applied', 'applied', 'applied']);
    const crashed = committed[2]!;
    expect(crashed.id).toBe(ids[2]);

    // The killed member's transaction committed: its effect exists. Its offset was not committed.
    expect((await effectsPerEvent()).get(crashed.id)).toBe(1);
    const before = await committedOffsets(consumers.kafka, groupId, topic!);
    expect(before.get(0) ?? -1).toBeLessThanOrEqual(crashed.offset);

    // Restart: a member of the same group (it joins once the dead member's session expires).
    const handlerRuns = { n: 0 };
    const restarted = consumers.create({
      groupId,
      topics: [topic!],
      database: db.pool,
      handler: async ({ tx, event }) => {
        handlerRuns.n += 1;
        await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
      },
    });
    const seen = record(restarted);
    await restarted.start();
    await waitFor(() => seen.applied.length === 3, { timeoutMs: 30_000, message: 'the three unprocessed events' });
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!), { timeoutMs: 30_000 });

    // The crashed event came back and was skipped: no second effect, no second handler run.
    expect(seen.duplicates.map((d) => d.event.id)).toContain(crashed.id);
    expect(seen.applied.map((a) => a.event.id).sort()).toEqual([ids[3], ids[4], ids[5]].sort());
    expect(handlerRuns.n).toBe(3);
    const effects = await effectsPerEvent();
    for (const id of ids) expect(effects.get(id!)).toBe(1);
    expect(seen.errors).toHaveLength(0);
  });
});
