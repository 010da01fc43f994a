/**
 * C12 · loss · a slow message inside a partition, then a crash.
 *
 * Twenty events on one partition (offsets 0-19). In a real child process, the handler of offset 12
 * blocks (it waits on a flag that never comes, its transaction open). The dedup consumer processes
 * the messages of one partition one at a time, in offset order, and resolves an offset only after
 * its transaction committed: so 13-19 cannot finish before 12 (their handlers are not even called),
 * and the group's committed offset stays at 12 (the next message to read). The child is then
 * SIGKILLed while 12's handler still runs, and a member restarted in the same group processes 12
 * and the rest: each of the 20 effects exists exactly once, and the offsets end at the log end.
 *
 * How it can fail: each handler takes longer than the child's commit interval, so kafkajs commits
 * after every resolved message. A consumer that resolved offsets before processing them, or that
 * processed 13-19 while 12 was pending (per-key parallelism done wrong), would show a committed
 * offset past 12 or effects of 13-19 while 12 blocks, and after the kill the restarted member would
 * start past 12: its effect would be missing.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
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

const TOTAL = 20;
const SLOW_OFFSET = 12;
/** Each handler of the child takes longer than its commit interval: kafkajs commits after each message. */
const HANDLER_DELAY_MS = 150;
const COMMIT_INTERVAL_MS = 100;
/** How long the test watches the blocked partition before the kill. */
const OBSERVE_MS = 3_000;

describe('C12 · a slow message in a partition, then SIGKILL: the committed offset never passes it', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  let child: ChildConsumer | undefined;

  beforeAll(async () => {
    db = await createTestDatabase();
    // No unique constraint: a second effect would show up as an extra row.
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL)');
  });
  afterEach(async () => {
    if (child?.alive()) {
      child.proc.kill('SIGKILL');
      await child.exited;
    }
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

  it(`blocks at offset ${SLOW_OFFSET} without committing past it; after the kill a restarted member applies it and the rest once`, async () => {
    const [topic] = await createTopicsWithDlq(['c12'], 1);
    const groupId = randomName('group');
    child = await startChildConsumer({
      TEST_DATABASE_URL: db.url,
      KAFKA_BROKERS: inject('kafkaBrokers').join(','),
      TEST_TOPIC: topic!,
      TEST_GROUP_ID: groupId,
      TEST_BLOCK_OFFSET: String(SLOW_OFFSET),
      TEST_HANDLER_DELAY_MS: String(HANDLER_DELAY_MS),
      TEST_COMMIT_INTERVAL_MS: String(COMMIT_INTERVAL_MS),
    });
    const running = child;

    // One request: the 20 events land at offsets 0-19 of partition 0, in one record batch.
    const ids = (await producer.send(
      topic!,
      Array.from({ length: TOTAL }, (_, i) => ({ partition: 0, value: { i } })),
    )) as string[];
    const before = ids.slice(0, SLOW_OFFSET);
    const slowId = ids[SLOW_OFFSET]!;

    await waitFor(() => running.stdout().includes(`BLOCKED ${slowId} 0 ${SLOW_OFFSET}`) || !running.alive(), {
      timeoutMs: 30_000,
      message: `the handler of offset ${SLOW_OFFSET} blocks`,
    });
    expect(running.alive(), running.stderr()).toBe(true);

    // While 12's handler runs: the offset commits reached 12 (commits do happen) and never pass
    // it; the effects are exactly those of 0-11 (12's row is uncommitted, 13-19 never ran).
    const deadline = Date.now() + OBSERVE_MS;
    let samples = 0;
    do {
      const committed = (await committedOffsets(consumers.kafka, groupId, topic!)).get(0) ?? -1;
      expect(committed).toBe(SLOW_OFFSET);
      const effects = await effectsPerEvent();
      expect([...effects.keys()].sort()).toEqual([...before].sort());
      expect([...effects.values()].every((n) => n === 1)).toBe(true);
      samples += 1;
      await sleep(250);
    } while (Date.now() < deadline);
    expect(samples).toBeGreaterThanOrEqual(5);
    expect(running.committed().map((c) => c.offset)).toEqual(before.map((_, i) => i));
    expect(running.alive(), 'the heartbeats keep the blocked child in its group').toBe(true);

    // SIGKILL while 12's handler still runs: its open transaction dies with the connection.
    running.proc.kill('SIGKILL');
    expect((await running.exited).signal).toBe('SIGKILL');
    expect((await committedOffsets(consumers.kafka, groupId, topic!)).get(0)).toBe(SLOW_OFFSET);
    expect((await effectsPerEvent()).has(slowId)).toBe(false);

    // Restart: a normal member of the same group (it gets the partition once the dead member's
    // session expires) starts at the committed offset, 12.
    const restarted = consumers.create({
      groupId,
      topics: [topic!],
      database: db.pool,
      handler: async ({ tx, event }) => {
        await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
      },
    });
    const seen = record(restarted);
    await restarted.start();
    await waitFor(() => seen.applied.length === TOTAL - SLOW_OFFSET, {
      timeoutMs: 30_000,
      message: `offsets ${SLOW_OFFSET}-${TOTAL - 1} applied after the restart`,
    });
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!), {
      timeoutMs: 20_000,
      message: 'offsets at the log end',
    });

    expect(seen.applied.map((a) => Number(a.event.offset))).toEqual(
      Array.from({ length: TOTAL - SLOW_OFFSET }, (_, i) => SLOW_OFFSET + i),
    );
    expect(seen.duplicates).toHaveLength(0);
    const effects = await effectsPerEvent();
    expect(effects.size).toBe(TOTAL);
    for (const id of ids) expect(effects.get(id), id).toBe(1);
    const inbox = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM outboxkit.inbox WHERE consumer_group = $1',
      [groupId],
    );
    expect(inbox.rows[0]!.n).toBe(TOTAL);
    expect((await committedOffsets(consumers.kafka, groupId, topic!)).get(0)).toBe(TOTAL);
    expect(seen.errors).toHaveLength(0);
    expect(seen.deadLettered).toHaveLength(0);
  });
});
