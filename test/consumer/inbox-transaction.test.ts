/**
 * consumer/inbox-transaction.ts against the real PostgreSQL, the same cases for both drivers (a
 * `pg.Pool` and a drizzle database), without Kafka: a transaction of one message (no savepoints)
 * commits or rolls back as a whole; with savepoints a failed message rolls back only itself, the
 * messages before it commit, and a handler that swallowed a failed statement fails as the
 * handler's, wherever it stands in the transaction.
 */
import { randomUUID } from 'node:crypto';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConnectionLostError, HandlerFailure } from '../../consumer/classify-error.js';
import {
  runInboxTransaction,
  type InboxClaim,
  type InboxTransaction,
  type InboxTransactionOptions,
} from '../../consumer/inbox-transaction.js';
import { drizzleInboxTransaction } from '../../consumer/inbox-transaction-drizzle.js';
import { pgPoolInboxTransaction } from '../../consumer/inbox-transaction-pg.js';
import type { DrizzleTransaction } from '../../src/database.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';

const GROUP = 'inbox-transaction-test';
const TOPIC = 'orders';

/** A message of a test run: its claim, and what its handler does. */
interface TestMessage {
  claim: InboxClaim;
  name: string;
  /**
   * `ok`: writes its effect; `throw`: writes, then throws; `swallow`: writes, then a failed
   * statement it catches; `end-own`: writes, then its statement on `tx` ends the consumer's own
   * session (SQLSTATE 57P01); `end-other`: writes, then throws the 57P01 of another connection
   * that ended itself.
   */
  does: 'ok' | 'throw' | 'swallow' | 'end-own' | 'end-other';
}

let offset = 0;
function message(name: string, does: TestMessage['does'] = 'ok', eventId: string = randomUUID()): TestMessage {
  const row = { groupId: GROUP, eventId, topic: TOPIC, partition: 0, offset: String(offset++) };
  return { claim: { row }, name, does };
}

describe.each([
  ['pg.Pool', 'pool'],
  ['drizzle', 'drizzle'],
] as const)('runInboxTransaction with a %s', (_, driver) => {
  let db: TestDatabase;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL, name text NOT NULL)');
  });
  afterAll(async () => {
    await db?.drop();
  });

  function inbox(savepoints: boolean): InboxTransaction<unknown> {
    const options: InboxTransactionOptions = { schemaSql: '"outboxkit"', lockTimeoutMs: 1_000, savepoints };
    return (
      driver === 'pool' ? pgPoolInboxTransaction(db.pool, options) : drizzleInboxTransaction(drizzle(db.pool), options)
    ) as InboxTransaction<unknown>;
  }

  /** Runs `statement` in the driver's transaction object. */
  async function exec(tx: unknown, statement: string): Promise<void> {
    if (driver === 'pool') await (tx as pg.PoolClient).query(statement);
    else await (tx as DrizzleTransaction).execute(sql.raw(statement));
  }

  /** Runs `messages` in one transaction (as many as it takes), recording whose handler ran. */
  async function run(savepoints: boolean, messages: TestMessage[]) {
    const ran: string[] = [];
    let nexts = 0;
    let i = 0;
    const result = await runInboxTransaction(
      inbox(savepoints),
      messages[0]!,
      () => {
        nexts += 1;
        return messages[++i] ?? null;
      },
      async (m, tx) => {
        ran.push(m.name);
        await exec(tx, `INSERT INTO effects VALUES ('${m.claim.row.eventId}', '${m.name}')`);
        if (m.does === 'throw') throw new HandlerFailure(new Error(`${m.name} fails`));
        if (m.does === 'swallow') await exec(tx, 'SELECT 1/0').catch(() => {});
        // As the consumer runs a handler: what it throws comes out wrapped in a HandlerFailure.
        if (m.does === 'end-own') {
          await exec(tx, 'SELECT pg_terminate_backend(pg_backend_pid())').catch((err: unknown) => {
            throw new HandlerFailure(err);
          });
        }
        if (m.does === 'end-other') throw new HandlerFailure(await otherSessionEnded());
      },
    );
    return {
      ran,
      nexts,
      done: result.done.map((d) => `${d.message.name} ${d.outcome}`),
      durations: result.done.map((d) => d.durationMs),
      firstApplied: result.done.map((d) => d.firstApplied),
      failure: result.failure && { name: result.failure.message.name, error: result.failure.error },
    };
  }

  /** The error of a statement of another connection (not the transaction's) that ended its own session. */
  async function otherSessionEnded(): Promise<unknown> {
    const other = new pg.Client({ connectionString: db.url });
    other.on('error', () => {});
    await other.connect();
    try {
      await other.query('SELECT pg_terminate_backend(pg_backend_pid())');
    } catch (err) {
      return err;
    } finally {
      await other.end().catch(() => {});
    }
    throw new Error('the other session did not end');
  }

  /** Committed inbox rows and effects of the messages, by name. */
  async function committed(messages: TestMessage[]): Promise<string[]> {
    const { rows } = await db.pool.query<{ event_id: string; inbox: number; effects: number }>(
      `SELECT m.event_id::text,
              (SELECT count(*)::int FROM outboxkit.inbox i WHERE i.consumer_group = $2 AND i.event_id = m.event_id) AS inbox,
              (SELECT count(*)::int FROM effects e WHERE e.event_id = m.event_id) AS effects
         FROM unnest($1::uuid[]) AS m(event_id)`,
      [messages.map((m) => m.claim.row.eventId), GROUP],
    );
    return messages.map((m, i) => `${m.name} ${rows[i]!.inbox}/${rows[i]!.effects}`);
  }

  it('without savepoints: one message, applied then a duplicate of it; next() is never asked', async () => {
    const a = message('a');
    const first = await run(false, [a, message('b')]);
    expect(first).toMatchObject({ ran: ['a'], nexts: 0, done: ['a applied'], failure: undefined });
    expect(first.durations[0]).toBeGreaterThan(0);
    expect(await committed([a])).toEqual(['a 1/1']);

    const again = await run(false, [a]);
    expect(again).toMatchObject({ ran: [], done: ['a duplicate'], failure: undefined });
    expect(again.firstApplied).toEqual([
      { topic: TOPIC, partition: 0, offset: a.claim.row.offset, processedAt: expect.any(Date) },
    ]);
  });

  it('without savepoints: a failing or swallowing handler rolls the whole transaction back', async () => {
    for (const does of ['throw', 'swallow'] as const) {
      const m = message(does, does);
      const result = await run(false, [m]);
      expect(result.done).toEqual([]);
      expect(result.failure?.name).toBe(does);
      expect(result.failure?.error).toBeInstanceOf(HandlerFailure);
      if (does === 'swallow') {
        expect(String((result.failure?.error as HandlerFailure).error)).toMatch(/its transaction had failed/);
      }
      expect(await committed([m])).toEqual([`${does} 0/0`]);
    }
    // The pool's connections are all usable.
    expect((await db.pool.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
  });

  it('with savepoints: a failing message rolls back only itself and ends the transaction; the messages before it commit', async () => {
    const ms = [message('a'), message('b', 'throw'), message('c')];
    const result = await run(true, ms);
    expect(result).toMatchObject({ ran: ['a', 'b'], done: ['a applied'], failure: { name: 'b' } });
    expect(await committed(ms)).toEqual(['a 1/1', 'b 0/0', 'c 0/0']);
  });

  it('with savepoints: a duplicate inside the transaction is a plain skip', async () => {
    const a = message('a');
    const twice = message('a again', 'ok', a.claim.row.eventId);
    const result = await run(true, [a, twice, message('b')]);
    expect(result).toMatchObject({ ran: ['a', 'b'], done: ['a applied', 'a again duplicate', 'b applied'] });
    expect(result.firstApplied[1]).toMatchObject({ offset: a.claim.row.offset });
  });

  it.each([
    ['first', 0],
    ['in the middle', 1],
    ['last', 2],
  ])(
    'with savepoints: a handler that swallowed a failed statement (%s) fails as the handler’s, alone',
    async (_, at) => {
      const ms = ['a', 'b', 'c'].map((name, i) => message(name, i === at ? 'swallow' : 'ok'));
      const result = await run(true, ms);
      expect(result.failure?.name).toBe(ms[at]!.name);
      expect(result.failure?.error).toBeInstanceOf(HandlerFailure);
      expect(result.done).toEqual(ms.slice(0, at).map((m) => `${m.name} applied`));
      expect(await committed(ms)).toEqual(ms.map((m, i) => `${m.name} ${i < at ? '1/1' : '0/0'}`));
    },
  );

  it.each([false, true])(
    'C31 (savepoints: %s): a handler failure whose rollback fails is the consumer’s lost connection (ConnectionLostError), whatever its error; one of another connection stays the handler’s',
    async (savepoints) => {
      const own = [message('a'), message('own', 'end-own'), message('c')].slice(savepoints ? 0 : 1);
      const lost = await run(savepoints, own);
      expect(lost.failure?.name).toBe(savepoints ? 'a' : 'own'); // the transaction as a whole failed
      expect(lost.failure?.error).toBeInstanceOf(ConnectionLostError);
      expect(lost.failure?.error).not.toBeInstanceOf(HandlerFailure);
      expect(JSON.stringify(codes((lost.failure?.error as ConnectionLostError).handlerError))).toContain('57P01');
      expect(lost.done).toEqual([]);
      expect(await committed(own)).toEqual(own.map((m) => `${m.name} 0/0`));

      const other = [message('a'), message('other', 'end-other'), message('c')].slice(savepoints ? 0 : 1);
      const failed = await run(savepoints, other);
      expect(failed.failure?.name).toBe('other');
      expect(failed.failure?.error).toBeInstanceOf(HandlerFailure);
      expect(codes((failed.failure?.error as HandlerFailure).error)).toContain('57P01');
      expect(await committed(other)).toEqual(other.map((m) => `${m.name} ${m.name === 'a' ? '1/1' : '0/0'}`));
      // The pool gave up the dead connection: its connections are all usable.
      for (let i = 0; i < 3; i++) expect((await db.pool.query('SELECT 1 AS ok')).rows).toEqual([{ ok: 1 }]);
    },
  );

  it('with savepoints: the durations of the messages add up to the transaction', async () => {
    const startedAt = performance.now();
    const result = await run(true, [message('a'), message('b'), message('c')]);
    const elapsed = performance.now() - startedAt;
    expect(result.done).toEqual(['a applied', 'b applied', 'c applied']);
    for (const d of result.durations) expect(d).toBeGreaterThan(0);
    const sum = result.durations.reduce((x, y) => x + y, 0);
    expect(sum).toBeLessThanOrEqual(elapsed);
    // The gaps between the parts (reading the next message) are the only time left out.
    expect(sum).toBeGreaterThan(elapsed * 0.5);
  });
});

/** The `code` of each error along a `cause` chain. */
function codes(err: unknown): unknown[] {
  const found: unknown[] = [];
  for (let e = err, depth = 0; typeof e === 'object' && e !== null && depth < 8; depth++) {
    found.push((e as { code?: unknown }).code);
    e = (e as { cause?: unknown }).cause;
  }
  return found;
}
