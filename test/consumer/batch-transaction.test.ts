/**
 * `transactionScope: 'batch'`: consecutive messages of a fetched batch share one PostgreSQL
 * transaction, each inside its own savepoint. A failing message rolls back only itself, the
 * messages before it commit, and no offset is committed past a message that is neither applied
 * nor dead-lettered (C14, C15, C16 and C24 semantics kept).
 */
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { CRASH_POINT_AFTER_COMMIT } from '../../consumer/dedup-consumer.js';
import { InvalidMessageError, type DedupHandler } from '../../consumer/index.js';
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

describe("transactionScope: 'batch'", () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  const children = new Set<ChildConsumer>();

  beforeAll(async () => {
    db = await createTestDatabase();
    // xid: the top-level transaction that wrote the row (txid_current() inside a savepoint).
    await db.pool.query('CREATE TABLE business (event_id uuid NOT NULL, xid bigint NOT NULL, run int NOT NULL)');
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

  /** Committed rows of the event, read outside the consumer's transactions. */
  async function committedRows(eventId: string): Promise<{ inbox: number; business: number }> {
    const { rows } = await db.pool.query<{ inbox: number; business: number }>(
      `SELECT (SELECT count(*)::int FROM outboxkit.inbox WHERE event_id = $1) AS inbox,
              (SELECT count(*)::int FROM business WHERE event_id = $1) AS business`,
      [eventId],
    );
    return rows[0]!;
  }

  /** The transaction id that wrote each event's business row(s). */
  async function xids(ids: (string | null)[]): Promise<string[]> {
    const { rows } = await db.pool.query<{ event_id: string; xid: string }>(
      'SELECT event_id, xid::text AS xid FROM business WHERE event_id = ANY($1::uuid[])',
      [ids],
    );
    const byId = new Map(rows.map((r) => [r.event_id, r.xid]));
    return ids.map((id) => byId.get(id!) ?? 'none');
  }

  const insert = (tx: pg.PoolClient, eventId: string, run: number) =>
    tx.query('INSERT INTO business (event_id, xid, run) VALUES ($1, txid_current(), $2)', [eventId, run]);

  it('C14 · a failing message rolls back only itself: the messages before it commit while it is retried', async () => {
    const [topic] = await createTopicsWithDlq(['batch-c14']);
    // Sent before the consumer starts: one record batch, one fetch.
    const ids = await producer.send(
      topic!,
      ['a', 'b', 'c', 'd', 'e'].map((name) => ({ partition: 0, value: { name } })),
    );
    const c = ids[2]!;
    const seenDuringRetry: Record<string, { inbox: number; business: number }>[] = [];
    const handler: DedupHandler<pg.Pool> = async ({ tx, event, attempt }) => {
      if (event.id === c && attempt === 2) {
        seenDuringRetry.push({
          a: await committedRows(ids[0]!),
          b: await committedRows(ids[1]!),
          c: await committedRows(c),
        });
      }
      await insert(tx, event.id, attempt);
      if (event.id === c && attempt < 3) throw new Error(`c fails on run ${attempt}`);
    };
    const consumer = consumers.create({ topics: [topic!], database: db.pool, handler, transactionScope: 'batch' });
    const seen = record(consumer);
    await consumer.start();

    await waitFor(() => seen.applied.length === 5, { message: 'five applied' });
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    // a and b were committed before c's retry; c's failed runs left nothing.
    expect(seenDuringRetry).toEqual([
      { a: { inbox: 1, business: 1 }, b: { inbox: 1, business: 1 }, c: { inbox: 0, business: 0 } },
    ]);
    for (const id of ids) expect(await committedRows(id!)).toEqual({ inbox: 1, business: 1 });
    expect(seen.retries.map((r) => r.attempt)).toEqual([1, 2]);
    expect(seen.applied.find((a) => a.event.id === c)!.attempt).toBe(3);
    // One transaction for a and b; c's successful run opened the next, which took d and e.
    const [xa, xb, xc, xd, xe] = await xids(ids);
    expect(xa).toBe(xb);
    expect([xd, xe]).toEqual([xc, xc]);
    expect(xa).not.toBe(xc);
  });

  it('C15 · a duplicate inside one transaction is a plain skip', async () => {
    const [topic] = await createTopicsWithDlq(['batch-c15']);
    const [a, b] = await producer.send(topic!, [
      { partition: 1, value: { n: 'a' } },
      { partition: 1, value: { n: 'b' } },
    ]);
    const [, , c] = await producer.send(topic!, [
      { partition: 1, eventId: a, value: { n: 'a again' } },
      { partition: 1, eventId: b, value: { n: 'b again' } },
      { partition: 1, value: { n: 'c' } },
    ]);
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      transactionScope: 'batch',
      handler: async ({ tx, event, attempt }) => void (await insert(tx, event.id, attempt)),
    });
    const seen = record(consumer);
    await consumer.start();
    await waitFor(() => seen.applied.length + seen.duplicates.length === 5);
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    expect(seen.applied.map((e) => e.event.id)).toEqual([a, b, c]);
    expect(seen.duplicates.map((e) => e.event.id)).toEqual([a, b]);
    for (const id of [a, b, c]) expect(await committedRows(id!)).toEqual({ inbox: 1, business: 1 });
    expect(new Set(await xids([a!, b!, c!])).size).toBe(1);
    expect(seen.errors).toHaveLength(0);
  });

  it('C13/C16 · dead-letters a message without an event id and a poison message between applied ones', async () => {
    const [topic] = await createTopicsWithDlq(['batch-dlq']);
    const ids = await producer.send(topic!, [
      { partition: 2, value: { n: 'a' } },
      { partition: 2, eventId: null, value: { n: 'no id' } },
      { partition: 2, value: { n: 'b' } },
      { partition: 2, value: { n: 'poison' } },
      { partition: 2, value: { n: 'c' } },
    ]);
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      transactionScope: 'batch',
      handler: async ({ tx, event, attempt }) => {
        await insert(tx, event.id, attempt);
        if (event.json<{ n: string }>().n === 'poison') throw new InvalidMessageError('not an order');
      },
    });
    const seen = record(consumer);
    await consumer.start();
    await waitFor(() => seen.applied.length === 3 && seen.deadLettered.length === 2);
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    expect(seen.applied.map((e) => e.event.id)).toEqual([ids[0], ids[2], ids[4]]);
    expect(seen.deadLettered.map((d) => [d.offset, d.eventId])).toEqual([
      ['1', null],
      ['3', ids[3]],
    ]);
    expect(await committedRows(ids[3]!)).toEqual({ inbox: 0, business: 0 });
    for (const i of [0, 2, 4]) expect(await committedRows(ids[i]!)).toEqual({ inbox: 1, business: 1 });
  });

  it('C24 · a handler that swallowed a failed statement rolls back only its own message', async () => {
    const [topic] = await createTopicsWithDlq(['batch-c24']);
    const ids = await producer.send(
      topic!,
      ['a', 'swallow', 'c'].map((n) => ({ partition: 0, value: { n } })),
    );
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      transactionScope: 'batch',
      maxAttempts: 1,
      handler: async ({ tx, event, attempt }) => {
        await insert(tx, event.id, attempt);
        if (event.json<{ n: string }>().n === 'swallow') await tx.query('SELECT 1/0').catch(() => {});
      },
    });
    const seen = record(consumer);
    await consumer.start();
    await waitFor(() => seen.applied.length === 2 && seen.deadLettered.length === 1);
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    expect(seen.deadLettered[0]!.reason).toMatch(/its transaction had failed/);
    expect(await committedRows(ids[1]!)).toEqual({ inbox: 0, business: 0 });
    expect(await committedRows(ids[0]!)).toEqual({ inbox: 1, business: 1 });
    expect(await committedRows(ids[2]!)).toEqual({ inbox: 1, business: 1 });
    // The swallowed failure is the handler's (dead-lettered above), never a processing error. A
    // transient database error of a loaded machine may be retried meanwhile (it flaked once in CI,
    // on Node 24 beside a chaos run), so only errors caused by the swallowed statement count here.
    const swallowed = seen.errors.filter((e) => /division by zero|transaction is aborted/i.test(String(e.error)));
    expect(swallowed).toHaveLength(0);
  });

  it("C24 · swallowed failures are always the handler's: exactly maxAttempts runs each, never a database error", async () => {
    // pg learns that a transaction failed from ReadyForQuery, which can arrive after the failed
    // statement's answer: the consumer must not depend on that timing (a miss once made the
    // whole run roll back as a "database" failure that counted no attempt). Many swallowing
    // messages, inside runs and last in them, make a dependence show.
    const [topic] = await createTopicsWithDlq(['batch-c24-many']);
    const names = Array.from({ length: 12 }, (_, i) => [`good-${i}`, `swallow-${i}`]).flat();
    const ids = await producer.send(
      topic!,
      names.map((n) => ({ partition: 0, value: { n } })),
    );
    const calls = new Map<string, number>();
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      transactionScope: 'batch',
      maxAttempts: 2,
      handler: async ({ tx, event, attempt }) => {
        calls.set(event.id, (calls.get(event.id) ?? 0) + 1);
        await insert(tx, event.id, attempt);
        if (event.json<{ n: string }>().n.startsWith('swallow')) await tx.query('SELECT 1/0').catch(() => {});
      },
    });
    const seen = record(consumer);
    await consumer.start();
    await waitFor(() => seen.applied.length === 12 && seen.deadLettered.length === 12, {
      timeoutMs: 60_000,
      message: () => `${seen.applied.length} applied, ${seen.deadLettered.length} dead-lettered`,
    });
    for (const [i, id] of ids.entries()) {
      expect(calls.get(id!), names[i]).toBe(names[i]!.startsWith('swallow') ? 2 : 1);
      expect(await committedRows(id!)).toEqual(
        names[i]!.startsWith('swallow') ? { inbox: 0, business: 0 } : { inbox: 1, business: 1 },
      );
    }
    expect(seen.errors.map((e) => String(e.error))).toEqual([]);
  });

  it('never commits an offset past a message that keeps failing; the messages before it are committed', async () => {
    const [topic] = await createTopicsWithDlq(['batch-offset']);
    const groupId = randomName('group');
    const ids = await producer.send(
      topic!,
      ['a', 'b', 'failing', 'd'].map((n) => ({ partition: 1, value: { n } })),
    );
    const consumer = consumers.create({
      groupId,
      topics: [topic!],
      database: db.pool,
      transactionScope: 'batch',
      maxAttempts: 1_000,
      handler: async ({ tx, event, attempt }) => {
        await insert(tx, event.id, attempt);
        if (event.id === ids[2]) throw new Error('still failing');
      },
    });
    const seen = record(consumer);
    await consumer.start();
    await waitFor(() => seen.retries.length >= 3, { message: 'three failed runs' });
    await consumer.stop();
    expect((await committedOffsets(consumers.kafka, groupId, topic!)).get(1)).toBe(2);
    expect(await committedRows(ids[0]!)).toEqual({ inbox: 1, business: 1 });
    expect(await committedRows(ids[1]!)).toEqual({ inbox: 1, business: 1 });
    expect(await committedRows(ids[2]!)).toEqual({ inbox: 0, business: 0 });
    expect(await committedRows(ids[3]!)).toEqual({ inbox: 0, business: 0 });
  });

  it('puts at most batchMaxMessages messages in one transaction', async () => {
    const [topic] = await createTopicsWithDlq(['batch-max']);
    const ids = await producer.send(
      topic!,
      Array.from({ length: 5 }, (_, i) => ({ partition: 0, value: { i } })),
    );
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      transactionScope: 'batch',
      batchMaxMessages: 2,
      handler: async ({ tx, event, attempt }) => void (await insert(tx, event.id, attempt)),
    });
    const seen = record(consumer);
    await consumer.start();
    await waitFor(() => seen.applied.length === 5);
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    const [x0, x1, x2, x3, x4] = await xids(ids);
    expect(x0).toBe(x1);
    expect(x2).toBe(x3);
    expect(new Set([x0, x2, x4]).size).toBe(3);
  });

  it('with a drizzle database: a failing message rolls back only itself (drizzle savepoints)', async () => {
    const [topic] = await createTopicsWithDlq(['batch-drizzle']);
    const ids = await producer.send(
      topic!,
      ['a', 'b', 'c'].map((n) => ({ partition: 0, value: { n } })),
    );
    const consumer = consumers.create({
      topics: [topic!],
      database: drizzle(db.pool),
      transactionScope: 'batch',
      handler: async ({ tx, event, attempt }) => {
        await tx.execute(
          sql`INSERT INTO business (event_id, xid, run) VALUES (${event.id}, txid_current(), ${attempt})`,
        );
        if (event.id === ids[1] && attempt === 1) throw new Error('b fails once');
      },
    });
    const seen = record(consumer);
    await consumer.start();
    await waitFor(() => seen.applied.length === 3);
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!));
    for (const id of ids) expect(await committedRows(id!)).toEqual({ inbox: 1, business: 1 });
    expect(seen.applied.map((a) => [a.event.id, a.attempt])).toEqual([
      [ids[0], 1],
      [ids[1], 2],
      [ids[2], 1],
    ]);
    const [xa, xb] = await xids(ids);
    expect(xa).not.toBe(xb);
  });

  describe('crashes (SIGKILL of a child process)', () => {
    async function effectsPerEvent(): Promise<Map<string, number>> {
      const { rows } = await db.pool.query<{ event_id: string; n: number }>(
        'SELECT event_id, count(*)::int AS n FROM effects GROUP BY event_id',
      );
      return new Map(rows.map((r) => [r.event_id, r.n]));
    }

    async function restartAndDrain(groupId: string, topic: string, expectApplied: number) {
      const runs = { n: 0 };
      const restarted = consumers.create({
        groupId,
        topics: [topic],
        database: db.pool,
        transactionScope: 'batch',
        handler: async ({ tx, event }) => {
          runs.n += 1;
          await tx.query('INSERT INTO effects (event_id) VALUES ($1)', [event.id]);
        },
      });
      const seen = record(restarted);
      await restarted.start();
      await waitFor(() => seen.applied.length === expectApplied && seen.applied.length + seen.duplicates.length >= 6, {
        timeoutMs: 30_000,
      });
      await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic), { timeoutMs: 30_000 });
      return { runs: runs.n, seen };
    }

    it('a crash before the COMMIT leaves none of the group applied and no offset committed; the restart applies each once', async () => {
      await db.pool.query('TRUNCATE effects');
      const [topic] = await createTopicsWithDlq(['batch-crash-open']);
      const groupId = randomName('group');
      const ids = await producer.send(
        topic!,
        Array.from({ length: 6 }, (_, i) => ({ partition: 0, value: { i } })),
      );
      const child = await startChildConsumer({
        TEST_DATABASE_URL: db.url,
        KAFKA_BROKERS: inject('kafkaBrokers').join(','),
        TEST_TOPIC: topic!,
        TEST_GROUP_ID: groupId,
        TEST_TRANSACTION_SCOPE: 'batch',
        TEST_BLOCK_OFFSET: '3',
        TEST_COMMIT_INTERVAL_MS: '100',
      });
      children.add(child);
      await waitFor(() => child.stdout().includes('BLOCKED'), { message: 'the handler of offset 3 blocks' });
      // Offsets 0-2 ran in the transaction that the blocked handler keeps open: nothing committed.
      expect(child.committed()).toEqual([]);
      expect((await effectsPerEvent()).size).toBe(0);
      child.proc.kill('SIGKILL');
      await child.exited;
      expect((await committedOffsets(consumers.kafka, groupId, topic!)).get(0) ?? -1).toBeLessThanOrEqual(0);

      const { runs, seen } = await restartAndDrain(groupId, topic!, 6);
      expect(runs).toBe(6);
      expect(seen.duplicates).toHaveLength(0);
      const effects = await effectsPerEvent();
      for (const id of ids) expect(effects.get(id!)).toBe(1);
    });

    it('a crash after the COMMIT, before the offsets: the restart skips every message of the group', async () => {
      await db.pool.query('TRUNCATE effects');
      const [topic] = await createTopicsWithDlq(['batch-crash-commit']);
      const groupId = randomName('group');
      const child = await startChildConsumer({
        TEST_DATABASE_URL: db.url,
        KAFKA_BROKERS: inject('kafkaBrokers').join(','),
        TEST_TOPIC: topic!,
        TEST_GROUP_ID: groupId,
        TEST_TRANSACTION_SCOPE: 'batch',
        OUTBOXKIT_CRASH_POINT: CRASH_POINT_AFTER_COMMIT,
        OUTBOXKIT_CRASH_AFTER: '3',
      });
      children.add(child);
      const ids = await producer.send(
        topic!,
        Array.from({ length: 6 }, (_, i) => ({ partition: 0, value: { i } })),
      );
      expect((await child.exited).signal).toBe('SIGKILL');
      // One transaction held all six: all committed, although only three reached the hook.
      const effects = await effectsPerEvent();
      for (const id of ids) expect(effects.get(id!)).toBe(1);
      expect((await committedOffsets(consumers.kafka, groupId, topic!)).get(0) ?? -1).toBeLessThanOrEqual(2);

      const { runs, seen } = await restartAndDrain(groupId, topic!, 0);
      expect(runs).toBe(0);
      expect(seen.duplicates.length).toBeGreaterThanOrEqual(4);
      const after = await effectsPerEvent();
      for (const id of ids) expect(after.get(id!)).toBe(1);
    });
  });
});
