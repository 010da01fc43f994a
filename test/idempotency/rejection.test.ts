/**
 * Final business rejections (DESIGN "States", case C22): a stored rejection undoes the handler's
 * writes to the savepoint taken after the claim and is replayed; an unstored one releases the key.
 * Over real HTTP against the real PostgreSQL.
 */
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { joinTransaction, type TransactionHandle } from '../../src/database.js';
import { enqueue } from '../../src/outbox/enqueue.js';
import {
  countOrders,
  countRecords,
  createOrder,
  post,
  readRecords,
  startApp,
  useOrdersDatabase,
  type HandlerContext,
} from './harness.js';

const db = useOrdersDatabase('app_orders, outboxkit.idempotency_keys, outboxkit.outbox_events');

async function countEvents(): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_events');
  return rows[0]!.n;
}

/** Writes a business row and an outbox event, as a real handler would before deciding. */
async function writeEffects(ctx: HandlerContext): Promise<void> {
  await ctx.insertOrder();
  await enqueue(ctx.tx, { topic: 'orders', key: 'o-1', type: 'order.created', payload: { n: 1 } });
}

describe('C22 stored business rejection (reject(status, body, { store: true }))', () => {
  it('rolls the business row and the outbox event back to the claim savepoint, stores the 4xx and replays it', async () => {
    const app = await startApp({
      pool: db.pool,
      behaviour: async (ctx) => {
        await writeEffects(ctx);
        return ctx.exec.reject(
          422,
          { title: 'Out of stock', execution: randomUUID() },
          {
            headers: { 'content-type': 'application/problem+json' },
          },
        );
      },
    });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(422);
    expect(first.headers.get('idempotent-replayed')).toBeNull();
    // The business row and the event are gone; the record commits with the rejection.
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countEvents()).toBe(0);
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'failed', response_status: 422 });

    const replay = await post(app, '/orders', { key });
    expect(replay.status).toBe(422);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.headers.get('content-type')).toBe('application/problem+json');
    expect(replay.bytes.equals(first.bytes)).toBe(true);
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(0);
    await app.close();
  });

  it('a plain returned 4xx is a stored rejection too: no business write commits with it', async () => {
    const app = await startApp({
      pool: db.pool,
      behaviour: async (ctx) => {
        await writeEffects(ctx);
        return { status: 400, body: { title: 'Invalid order' } };
      },
    });
    const key = randomUUID();
    expect((await post(app, '/orders', { key })).status).toBe(400);
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countEvents()).toBe(0);
    const replay = await post(app, '/orders', { key });
    expect(replay.status).toBe(400);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('recovers a transaction that a caught statement error aborted: the rejection is still stored', async () => {
    const app = await startApp({
      pool: db.pool,
      behaviour: async (ctx) => {
        await ctx.insertOrder();
        const q = joinTransaction(ctx.tx as TransactionHandle, 'test');
        // A failing statement (the transaction is now aborted) that the handler turns into a rejection.
        const failed = await q.query('SELECT 1/0').then(
          () => false,
          () => true,
        );
        expect(failed).toBe(true);
        return ctx.exec.reject(422, { title: 'Duplicate order' });
      },
    });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(422);
    expect(await countOrders(db.pool)).toBe(0);
    const replay = await post(app, '/orders', { key });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.bytes.equals(first.bytes)).toBe(true);
    await app.close();
  });
});

describe('C22 unstored business rejection (reject(status, body, { store: false }))', () => {
  it('rolls the whole transaction back and releases the key; the retry executes', async () => {
    const app = await startApp({
      pool: db.pool,
      behaviour: async (ctx) => {
        if (ctx.call > 1) return createOrder(ctx);
        await writeEffects(ctx);
        return ctx.exec.reject(409, { title: 'Inventory locked, try again' }, { store: false });
      },
    });
    const key = randomUUID();
    const first = await post(app, '/orders', { key });
    expect(first.status).toBe(409);
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countEvents()).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);

    const retry = await post(app, '/orders', { key });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(app.calls.total).toBe(2);
    expect(await countOrders(db.pool)).toBe(1);
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'completed', response_status: 201 });
    await app.close();
  });
});

describe('without a key (required: false) a 4xx leaves no business write either', () => {
  it('a reject() or plain 4xx rolls the transaction back; nothing is stored', async () => {
    const app = await startApp({
      pool: db.pool,
      required: false,
      behaviour: async (ctx) => {
        await writeEffects(ctx);
        return ctx.call === 1 ? ctx.exec.reject(422, { title: 'no' }) : { status: 400, body: { title: 'no' } };
      },
    });
    expect((await post(app, '/orders', { key: null })).status).toBe(422);
    expect((await post(app, '/orders', { key: null })).status).toBe(400);
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countEvents()).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });
});
