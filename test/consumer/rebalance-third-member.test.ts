/**
 * Issue 6 · a kafkajs rebalance with slow handlers: two members consume, a third joins mid-way.
 * Right: each effect exactly once (counter rows = distinct events = inbox rows = N), the committed
 * offsets end at the log end, and no member commits an offset for a partition it no longer owns.
 *
 * The last point is observed directly, through kafkajs's instrumentation events of each member's
 * consumer (GROUP_JOIN with the member's assignment, COMMIT_OFFSETS with the member id, generation
 * and partitions, emitted once the broker accepted a commit):
 * - every commit a member makes after a join names only partitions of that join's assignment
 *   (with kafkajs's eager protocol a member gives up all of its partitions when it rejoins, so a
 *   commit of a partition outside its latest assignment is a commit for a revoked partition);
 * - over all members, the accepted commits of each partition never go backwards: a late commit by
 *   a former owner would rewind the new owner's progress.
 * A commit the broker refuses (ILLEGAL_GENERATION from a former generation) emits no event and
 * changes nothing, so it is not counted. The effect side is covered by the inbox: whatever a
 * former owner applied is skipped by the new owner as a duplicate, which the counts below check.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Kafka } from 'kafkajs';
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
  type Recorded,
  type TestMessage,
  TestProducer,
} from './support.js';

const TOTAL = 240;
const PARTITIONS = 4;
/** The third member starts once this many events are applied. */
const THIRD_JOINS_AT = 40;

type GroupEvent =
  | { kind: 'join'; member: string; memberId: string; partitions: number[] }
  | {
      kind: 'commit';
      member: string;
      memberId: string;
      generation: number;
      offsets: { partition: number; offset: number }[];
    };

/** A Kafka client whose consumers report their joins and accepted commits of `topic` to `log`. */
function observedKafka(kafka: Kafka, member: string, topic: string, log: GroupEvent[]): Kafka {
  const observed = Object.create(kafka) as Kafka;
  observed.consumer = (config) => {
    const consumer = kafka.consumer(config);
    consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
      log.push({
        kind: 'join',
        member,
        memberId: payload.memberId,
        partitions: [...(payload.memberAssignment[topic] ?? [])].sort((a, b) => a - b),
      });
    });
    consumer.on(consumer.events.COMMIT_OFFSETS, ({ payload }) => {
      log.push({
        kind: 'commit',
        member,
        memberId: payload.memberId,
        generation: payload.groupGenerationId,
        offsets: payload.topics
          .filter((t) => t.topic === topic)
          .flatMap((t) => t.partitions.map((p) => ({ partition: Number(p.partition), offset: Number(p.offset) }))),
      });
    });
    return consumer;
  };
  return observed;
}

describe('Issue 6 · rebalance with slow handlers: two members, a third joins', () => {
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

  it(`applies each of ${TOTAL} events once, and no member commits a partition it lost`, async () => {
    const [topic] = await createTopicsWithDlq(['rebalance-3'], PARTITIONS);
    const groupId = randomName('group');
    const log: GroupEvent[] = [];
    let interrupted = 0;

    // A slow handler (20-50 ms after its insert) that stops when its signal is aborted (rebalance):
    // the transaction then rolls back and the event runs again on the partition's next owner.
    const handlerOf =
      (member: string): DedupHandler<pg.Pool> =>
      async ({ tx, event, signal }) => {
        await tx.query('INSERT INTO counter (event_id, member) VALUES ($1, $2)', [event.id, member]);
        try {
          await sleep(20 + Math.floor(Math.random() * 31), undefined, { signal });
        } catch (err) {
          interrupted += 1;
          throw err;
        }
      };
    const start = async (member: string): Promise<Recorded> => {
      const consumer = consumers.create({
        kafka: observedKafka(consumers.kafka, member, topic!, log),
        groupId,
        topics: [topic!],
        database: db.pool,
        handler: handlerOf(member),
      });
      const seen = record(consumer);
      await consumer.start();
      return seen;
    };
    const joinsOf = (member: string) => log.filter((e) => e.kind === 'join' && e.member === member);

    // Two members share the partitions before any message exists.
    const seen1 = await start('one');
    const seen2 = await start('two');
    await waitFor(() => joinsOf('one').length >= 2, { message: 'member one rejoined with member two' });

    const messages: TestMessage[] = Array.from({ length: TOTAL }, (_, i) => ({
      partition: i % PARTITIONS,
      value: { i },
    }));
    const ids = await producer.send(topic!, messages);
    const third: { seen?: Recorded } = {};
    const applied = () => seen1.applied.length + seen2.applied.length + (third.seen?.applied.length ?? 0);
    await waitFor(() => applied() >= THIRD_JOINS_AT, { message: `${THIRD_JOINS_AT} applied by two members` });
    const appliedBeforeThird = applied();
    const seen3 = await start('three');
    third.seen = seen3;
    const appliedWhenThirdJoined = applied();

    await waitFor(() => applied() === TOTAL, { timeoutMs: 40_000, message: `${TOTAL} applied` });
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!), {
      timeoutMs: 20_000,
      message: 'offsets at the log end',
    });

    // The third member joined mid-way and took work over from the other two.
    expect(appliedBeforeThird).toBeLessThan(TOTAL / 2);
    expect(appliedWhenThirdJoined).toBeLessThan(TOTAL);
    const thirdJoin = joinsOf('three').at(-1);
    expect(thirdJoin?.kind === 'join' && thirdJoin.partitions.length).toBeGreaterThan(0);
    expect(seen3.applied.length).toBeGreaterThan(0);

    // Each effect exactly once.
    const { rows } = await db.pool.query<{ total: number; distinct_ids: number }>(
      'SELECT count(*)::int AS total, count(DISTINCT event_id)::int AS distinct_ids FROM counter',
    );
    expect(rows[0]).toEqual({ total: TOTAL, distinct_ids: TOTAL });
    const inbox = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM outboxkit.inbox WHERE consumer_group = $1',
      [groupId],
    );
    expect(inbox.rows[0]!.n).toBe(TOTAL);
    const appliedIds = [seen1, seen2, seen3].flatMap((s) => s.applied.map((a) => a.event.id));
    expect(appliedIds.length).toBe(TOTAL);
    expect(new Set(appliedIds)).toEqual(new Set(ids));
    for (const seen of [seen1, seen2, seen3]) {
      expect(seen.deadLettered).toHaveLength(0);
      expect(seen.errors).toHaveLength(0);
      expect(seen.crashes).toHaveLength(0);
    }

    // No commit for a revoked partition: each member commits only what its latest join assigned,
    // and the accepted commits of every partition only move forward.
    const assignment = new Map<string, number[]>();
    const lastCommitted = new Map<number, number>();
    let commits = 0;
    for (const event of log) {
      if (event.kind === 'join') {
        assignment.set(event.member, event.partitions);
        continue;
      }
      const owned = assignment.get(event.member);
      for (const { partition, offset } of event.offsets) {
        commits += 1;
        expect(owned, `${event.member} committed before joining`).toBeDefined();
        expect(
          owned,
          `${event.member} committed partition ${partition} at ${offset} (generation ${event.generation})`,
        ).toContain(partition);
        expect(offset, `partition ${partition}'s commits go backwards`).toBeGreaterThanOrEqual(
          lastCommitted.get(partition) ?? 0,
        );
        lastCommitted.set(partition, offset);
      }
    }
    expect(commits).toBeGreaterThan(0);
    // The log saw every partition committed to its end.
    expect([...lastCommitted.entries()].sort(([a], [b]) => a - b)).toEqual(
      Array.from({ length: PARTITIONS }, (_, p) => [p, TOTAL / PARTITIONS]),
    );
    // Members one and two lost partitions to three: at least one of them rejoined after three came.
    expect(joinsOf('one').length + joinsOf('two').length).toBeGreaterThanOrEqual(4);
    console.info(
      `rebalance-3: applied before the third member ${appliedBeforeThird}, when it had joined ${appliedWhenThirdJoined}; ` +
        `applied by one/two/three ${seen1.applied.length}/${seen2.applied.length}/${seen3.applied.length}; ` +
        `duplicates skipped ${seen1.duplicates.length + seen2.duplicates.length + seen3.duplicates.length}; ` +
        `handlers interrupted ${interrupted}; commits ${commits}`,
    );
  });
});
