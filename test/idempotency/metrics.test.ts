/**
 * Metrics hooks: the outcome counter `outboxkit_idempotency_requests_total{operation,outcome}`
 * (prom-client registry and onOutcome callback) and the scrape-time gauges, against the real
 * PostgreSQL over real HTTP. Never a key nor a tenant in a label.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { executeIdempotent } from '../../src/idempotency/execute.js';
import { fingerprintRequest } from '../../src/idempotency/fingerprint.js';
import { idempotencyGauges, type IdempotencyOutcomeEvent } from '../../src/idempotency/metrics.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { closeAll, ORDERS_TABLE_SQL, post, startApp } from './harness.js';
import { closeLeaseApps, gate, pay, readLease, startLeaseApp } from './lease-harness.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  expect((await closeAll()) + (await closeLeaseApps()), 'a test left an app open').toBe(0);
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await db?.drop();
});

async function counts(registry: Registry): Promise<Record<string, number>> {
  const metric = await registry.getSingleMetric('outboxkit_idempotency_requests_total')!.get();
  const out: Record<string, number> = {};
  for (const v of metric.values) {
    expect(Object.keys(v.labels).sort()).toEqual(['operation', 'outcome']);
    out[`${v.labels.operation}:${v.labels.outcome}`] = v.value;
  }
  return out;
}

describe('outcome counter', () => {
  it('one-transaction mode counts new, replayed, mismatch, in_progress, expired and store_error by operation', async () => {
    const registry = new Registry();
    const events: IdempotencyOutcomeEvent[] = [];
    const hold = gate();
    const inHandler = gate();
    const app = await startApp({
      pool: db.pool,
      registry,
      onOutcome: (e) => events.push(e),
      retentionMs: 300,
      behaviour: async (ctx) => {
        if (ctx.req.headers['x-slow']) {
          inHandler.open();
          await hold.promise;
        }
        return { status: 201, body: { ok: true } };
      },
    });
    const key = randomUUID();
    expect((await post(app, '/orders', { key })).status).toBe(201); // new
    expect((await post(app, '/orders', { key })).status).toBe(201); // replayed
    expect((await post(app, '/orders', { key, body: '{"amount":99}' })).status).toBe(422); // mismatch
    expect((await post(app, '/refunds', { key: randomUUID() })).status).toBe(201); // new, other operation
    const slowKey = randomUUID();
    const slow = post(app, '/orders', { key: slowKey, headers: { 'x-slow': '1' } });
    await inHandler.promise;
    expect((await post(app, '/orders', { key: slowKey })).status).toBe(409); // in_progress
    hold.open();
    await slow;
    await new Promise((r) => setTimeout(r, 350));
    expect((await post(app, '/orders', { key })).status).toBe(201); // expired: a new execution
    await app.close();

    const dead = new pg.Pool({ host: '127.0.0.1', port: 1, user: 'x', connectionTimeoutMillis: 500 });
    const fp = fingerprintRequest({ tenant: 't', operation: 'create-order', body: '{}', maxBodyBytes: 100 });
    await expect(
      executeIdempotent(
        dead,
        { tenant: 't', operation: 'create-order', key: 'k-1', fingerprint: fp },
        async () => ({ status: 201, body: {} }),
        { registry },
      ),
    ).rejects.toMatchObject({ code: 'OUTBOXKIT_STORE_UNAVAILABLE' });
    await dead.end();

    expect(await counts(registry)).toEqual({
      'create-order:new': 2,
      'create-order:replayed': 1,
      'create-order:mismatch': 1,
      'create-order:in_progress': 1,
      'create-order:expired': 1,
      'create-order:store_error': 1,
      'create-refund:new': 1,
    });
    expect(events.filter((e) => e.outcome === 'new')).toHaveLength(3);
    const exposition = await registry.metrics();
    expect(exposition).not.toContain(key);
    expect(exposition).not.toContain('tenant-a');
  });

  it('lease mode counts takeover and uncertain', async () => {
    const registry = new Registry();
    const hold = gate();
    const inHandler = gate();
    const app = await startLeaseApp({
      pool: db.pool,
      registry,
      leaseMs: 200,
      behaviour: async (c) => {
        if (c.req.headers['x-uncertain']) return c.ctx.uncertain('timeout');
        if (c.call === 1) {
          inHandler.open();
          await hold.promise;
        }
        return pay(c);
      },
    });
    const key = randomUUID();
    const first = post(app, '/payments', { key, body: '{}' }).catch(() => undefined);
    await inHandler.promise;
    await waitFor(async () => !(await readLease(db.pool, key))!.lease_live, { timeoutMs: 5_000 });
    expect((await post(app, '/payments', { key, body: '{}' })).status).toBe(201); // takeover
    hold.open();
    await first;
    const uKey = randomUUID();
    await post(app, '/payments', { key: uKey, body: '{}', headers: { 'x-uncertain': '1' } }); // new + uncertain
    expect((await post(app, '/payments', { key: uKey, body: '{}', headers: { 'x-uncertain': '1' } })).status).toBe(409); // uncertain
    await app.close();
    expect(await counts(registry)).toEqual({
      'create-payment:new': 2,
      'create-payment:takeover': 1,
      'create-payment:uncertain': 2,
    });
  });
});

describe('idempotencyGauges (collected at scrape time)', () => {
  it('reports records by state, the oldest processing and uncertain ages, the oldest unexpired record and the cleanup lag', async () => {
    const registry = new Registry();
    idempotencyGauges(db.pool, registry);
    const insert = (state: string, createdAgo: string, expiresIn: string, completed: boolean) =>
      db.pool.query(
        `INSERT INTO outboxkit.idempotency_keys (tenant, operation, key, fingerprint, fingerprint_version, state, created_at, completed_at, expires_at)
         VALUES ('t', 'op', $1, '\\x00'::bytea, 1, $2, now() - $3::interval, CASE WHEN $5 THEN now() - $3::interval END, now() + $4::interval)`,
        [randomUUID(), state, createdAgo, expiresIn, completed],
      );
    await insert('processing', '600 seconds', '1 day', false);
    await insert('processing', '10 seconds', '1 day', false);
    await insert('uncertain', '120 seconds', '1 day', false);
    await insert('completed', '3600 seconds', '1 hour', true);
    await insert('completed', '7200 seconds', '-30 minutes', true);
    const text = await registry.metrics();
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(text)?.[1]);
    expect(text).toMatch(/outboxkit_idempotency_records\{state="processing"\} 2/);
    expect(text).toMatch(/outboxkit_idempotency_records\{state="completed"\} 2/);
    expect(text).toMatch(/outboxkit_idempotency_records\{state="uncertain"\} 1/);
    expect(value('outboxkit_idempotency_processing_age_seconds')).toBeGreaterThanOrEqual(600);
    expect(value('outboxkit_idempotency_processing_age_seconds')).toBeLessThan(700);
    expect(value('outboxkit_idempotency_uncertain_age_seconds')).toBeGreaterThanOrEqual(120);
    expect(value('outboxkit_idempotency_oldest_unexpired_seconds')).toBeGreaterThanOrEqual(3600);
    expect(value('outboxkit_idempotency_oldest_unexpired_seconds')).toBeLessThan(7000);
    expect(value('outboxkit_idempotency_cleanup_lag_seconds')).toBeGreaterThanOrEqual(1800);
    expect(value('outboxkit_idempotency_table_bytes')).toBeGreaterThan(8_000);
  });
});
