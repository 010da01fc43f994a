/**
 * The orders example's error answers (examples/orders/server.ts): a failed query, whose message
 * names its SQL and values, is logged and answered with the generic problem+json 500, never with
 * the message. Over real HTTP against the real PostgreSQL.
 */
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildOrdersApp } from '../../examples/orders/server.js';
import { ensureDemoSchema } from '../../examples/orders/db.js';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';

let db: TestDatabase;
let app: FastifyInstance | undefined;
let url: string;
const logged: { obj: Record<string, unknown>; msg: string }[] = [];
const logger: Logger = { debug() {}, info() {}, warn() {}, error: (obj, msg) => void logged.push({ obj, msg }) };

beforeAll(async () => {
  db = await createTestDatabase();
  await ensureDemoSchema(db.pool);
  app = await buildOrdersApp(db.pool, `orders.${randomUUID()}`, { logger });
  await app.listen({ host: '127.0.0.1', port: 0 });
  url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await app?.close();
  await db?.drop();
});

async function order(body: unknown, key = randomUUID()) {
  const res = await fetch(`${url}/orders`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-tenant-id': 'tenant-secret-acme' },
    body: JSON.stringify(body),
  });
  return { status: res.status, contentType: res.headers.get('content-type'), text: await res.text() };
}

describe('orders example: a failed query', () => {
  it('is logged with its detail and answered with the generic problem+json 500 (no SQL, no values)', async () => {
    // An integer amount PostgreSQL's integer column cannot hold: the INSERT fails (22003).
    const key = randomUUID();
    const res = await order({ cartId: 'cart-secret-42', currency: 'EUR', amount: 3_000_000_000 }, key);
    expect(res.status).toBe(500);
    expect(res.contentType).toBe('application/problem+json');
    expect(JSON.parse(res.text)).toEqual({
      type: 'https://outboxkit.dev/problems/internal',
      title: 'Internal error',
      status: 500,
      detail: 'The request failed because of an internal error.',
      code: 'OUTBOXKIT_INTERNAL',
    });
    for (const secret of ['insert', 'orders_demo', 'tenant-secret-acme', 'cart-secret-42', '3000000000']) {
      expect(res.text.toLowerCase()).not.toContain(secret);
    }
    expect(logged).toHaveLength(1);
    expect(logged[0]!.msg).toBe('orders request failed');
    expect(String((logged[0]!.obj.err as Error).message)).toMatch(/insert into "orders_demo"\."orders"/);
    // Nothing was stored for the key: a corrected retry with it executes.
    expect((await order({ cartId: 'cart-secret-42', currency: 'EUR', amount: 3_000 }, key)).status).toBe(201);
  });

  it("keeps Fastify's own client errors (415) as problems without the framework's message", async () => {
    const res = await fetch(`${url}/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/xml', 'idempotency-key': randomUUID(), 'x-tenant-id': 't' },
      body: '<order/>',
    });
    expect(res.status).toBe(415);
    expect(res.headers.get('content-type')).toBe('application/problem+json');
    expect(await res.json()).toEqual({ type: 'about:blank', title: 'Unsupported Media Type', status: 415 });
  });
});
