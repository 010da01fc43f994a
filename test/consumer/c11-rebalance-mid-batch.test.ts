import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { DedupHandler } from '../../consumer/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  committedAtLogEnd,
  ConsumerRegistry,
  createTopicsWithDlq,
  record,
  type TestMessage,
  TestProducer,
} from './support.js';

/** The case's 500 messages; the second member joins when the first is halfway through. */
const TOTAL = 500;
const HALFWAY = TOTAL / 2;
const PARTITIONS = 3;

describe('C11 · a rebalance in the middle of a batch (two members)', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    db = await createTestDatabase();
    // No unique constraint: a duplicate effect would show up as an extra row.
    await db.pool.query('CREATE TABLE counter (event_id uuid NOT NULL, member text NOT NULL)');
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  for (const recordProgress of [false, true]) {
    it(`applies each of ${TOTAL} events once while a second member joins mid-way; offsets end at the log end${recordProgress ? ' (recordProgress)' : ''}`, async () => {
      await db.pool.query('TRUNCATE counter');
      const [topic] = await createTopicsWithDlq(['c11'], PARTITIONS);
      const groupId = randomName('group');
      const messages: TestMessage[] = Array.from({ length: TOTAL }, (_, i) => ({
        partition: i % PARTITIONS,
        value: { i },
      }));
      await producer.send(topic!, messages);

      // From its 250th message on, member 1 waits inside its handlers (on every partition) until
      // the group rebalances: the heartbeats during the handlers see the rebalance and abort the
      // handlers' signal. So the second member really joins in the middle of member 1's batches.
      let member1Runs = 0;
      let interrupted = 0;
      let rebalanced = false;
      const member1Handler: DedupHandler<pg.Pool> = async ({ tx, event, signal }) => {
        member1Runs += 1;
        await tx.query('INSERT INTO counter (event_id, member) VALUES ($1, $2)', [event.id, 'one']);
        if (member1Runs >= HALFWAY && !rebalanced) {
          await new Promise<void>((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error('no rebalance within 20 s')), 20_000);
            signal.addEventListener('abort', () => {
              clearTimeout(timer);
              resolve();
            });
          });
          rebalanced = true;
          interrupted += 1;
          throw signal.reason;
        }
      };
      const member2Handler: DedupHandler<pg.Pool> = async ({ tx, event }) => {
        await tx.query('INSERT INTO counter (event_id, member) VALUES ($1, $2)', [event.id, 'two']);
      };

      const member1 = consumers.create({
        groupId,
        topics: [topic!],
        database: db.pool,
        handler: member1Handler,
        recordProgress,
      });
      const seen1 = record(member1);
      await member1.start();
      await waitFor(() => member1Runs >= HALFWAY, { message: `member 1 reached its ${HALFWAY}th message` });

      const member2 = consumers.create({
        groupId,
        topics: [topic!],
        database: db.pool,
        handler: member2Handler,
        recordProgress,
      });
      const seen2 = record(member2);
      await member2.start();

      await waitFor(() => seen1.applied.length + seen2.applied.length === TOTAL, {
        timeoutMs: 30_000,
        message: `${TOTAL} applied`,
      });
      await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!), {
        timeoutMs: 20_000,
        message: 'offsets at the log end',
      });

      const { rows } = await db.pool.query<{ total: number; distinct_ids: number; one: number; two: number }>(
        `SELECT count(*)::int AS total, count(DISTINCT event_id)::int AS distinct_ids,
              count(*) FILTER (WHERE member = 'one')::int AS one, count(*) FILTER (WHERE member = 'two')::int AS two
         FROM counter`,
      );
      const counts = rows[0]!;
      expect(interrupted).toBeGreaterThanOrEqual(1);
      expect(counts.total).toBe(TOTAL);
      expect(counts.distinct_ids).toBe(TOTAL);
      expect(counts.one).toBe(seen1.applied.length);
      expect(counts.two).toBe(seen2.applied.length);
      // The rebalance really split the work.
      expect(counts.one).toBeGreaterThanOrEqual(HALFWAY - 1);
      expect(counts.two).toBeGreaterThan(0);
      const inbox = await db.pool.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM outboxkit.inbox WHERE consumer_group = $1',
        [groupId],
      );
      expect(inbox.rows[0]!.n).toBe(TOTAL);
      for (const seen of [seen1, seen2]) {
        expect(seen.deadLettered).toHaveLength(0);
        expect(seen.retries).toHaveLength(0);
        expect(seen.errors).toHaveLength(0);
        expect(seen.crashes).toHaveLength(0);
      }
    });
  }
});
