/**
 * DESIGN G6 over real HTTP against the real PostgreSQL: input that PostgreSQL text cannot hold
 * (NUL, lone surrogates) gets a typed error before any SQL, and an invalid handler response leaves
 * no partial write and no stuck record; a database without outboxkit's tables (no `outboxkit
 * migrate`) gets `SchemaMissingError` / a 500 `schema-missing` problem, in both modes, and the
 * handler never runs.
 */
import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import Fastify, { type FastifyRequest } from 'fastify';
import type pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { isOutboxkitError } from '../../src/errors.js';
import { idempotentHandler as expressHandler } from '../../src/http/express.js';
import { idempotentHandler, leasedHandler, operationHandler, registerRawJsonBody } from '../../src/http/fastify.js';
import { cleanupExpiredKeys } from '../../src/idempotency/cleanup.js';
import { executeIdempotent } from '../../src/idempotency/execute.js';
import { fingerprintRequest } from '../../src/idempotency/fingerprint.js';
import { executeLeased, type LeaseContext } from '../../src/idempotency/lease.js';
import { operationIdOf } from '../../src/idempotency/lease-store.js';
import { idempotencyGauges } from '../../src/idempotency/metrics.js';
import { reconcileUncertain, serveOperation } from '../../src/idempotency/reconcile.js';
import type { HandlerResponse } from '../../src/idempotency/state-machine.js';
import { idempotencyTable, listKeys } from '../../src/idempotency/store.js';
import { createDatabaseOn, createTestDatabase, type TestDatabase } from '../helpers/db.js';

let db: TestDatabase;
/** A real database created without migrations: outboxkit's schema and tables do not exist. */
let bare: { url: string; pool: pg.Pool; drop(): Promise<void> };
const servers: { close(): Promise<void> }[] = [];

function createBareDatabase(): Promise<typeof bare> {
  return createDatabaseOn(inject('databaseUrl'), { prefix: 'outboxkit_bare', poolSize: 4 });
}

beforeAll(async () => {
  db = await createTestDatabase();
  bare = await createBareDatabase();
  await db.pool.query('CREATE TABLE app_rows (id bigserial PRIMARY KEY, note text NOT NULL)');
});

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
  await db.pool.query('TRUNCATE app_rows, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
  await db?.drop();
  await bare?.drop();
});

const counts = async (): Promise<{ records: number; rows: number }> => {
  const { rows } = await db.pool.query<{ records: number; rows: number }>(
    'SELECT (SELECT count(*)::int FROM outboxkit.idempotency_keys) AS records, (SELECT count(*)::int FROM app_rows) AS rows',
  );
  return rows[0]!;
};

/** The tenant comes from the query string (`?tenant=a%00b` decodes to a NUL): headers cannot carry one. */
const tenantOf = (req: FastifyRequest): string | undefined => (req.query as { tenant?: string }).tenant;

type Behaviour = (insert: () => Promise<void>) => Promise<HandlerResponse>;
type LeaseBehaviour = (ctx: LeaseContext<pg.Pool>, insert: () => Promise<void>) => Promise<HandlerResponse>;

async function startFastify(pool: pg.Pool, behaviour: Behaviour, leaseBehaviour: LeaseBehaviour) {
  const calls = { tx: 0, lease: 0 };
  const app = Fastify({ logger: false });
  await app.register(async (scope) => {
    registerRawJsonBody(scope);
    scope.post(
      '/orders',
      idempotentHandler({ db: pool, operation: 'create-order', resolveTenant: tenantOf }, async (_req, tx) => {
        calls.tx++;
        return behaviour(async () => {
          await tx.query("INSERT INTO app_rows (note) VALUES ('order')");
        });
      }),
    );
    scope.post(
      '/payments',
      leasedHandler(
        {
          db: pool,
          operation: 'create-payment',
          resolveTenant: tenantOf,
          operationLocation: (id) => `/operations/${id}`,
        },
        async (_req, ctx) => {
          calls.lease++;
          return leaseBehaviour(ctx, () =>
            ctx.transaction(async (tx) => {
              await tx.query("INSERT INTO app_rows (note) VALUES ('payment')");
            }),
          );
        },
      ),
    );
    scope.get(
      '/operations/:operationId',
      operationHandler({ db: pool, operation: 'create-payment', resolveTenant: tenantOf }),
    );
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
  servers.push({ close: () => app.close() });
  return { url, calls };
}

async function send(url: string, key: string | undefined, tenant = 'tenant-a', method = 'POST') {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (key !== undefined) headers['idempotency-key'] = key;
  const res = await fetch(`${url}?tenant=${encodeURIComponent(tenant)}`, {
    method,
    headers,
    ...(method === 'POST' ? { body: '{"amount":1}' } : {}),
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  const text = bytes.toString('utf8');
  return { status: res.status, headers: res.headers, text, json: () => JSON.parse(text) as Record<string, unknown> };
}

const created: Behaviour = async (insert) => {
  await insert();
  return { status: 201, body: { ok: true } };
};
const paid: LeaseBehaviour = async (_ctx, insert) => {
  await insert();
  return { status: 201, body: { ok: true } };
};

describe('NUL and lone surrogates never reach PostgreSQL', () => {
  it('a tenant with a NUL character gets 400 tenant-unresolved in both modes: nothing recorded, handler not run', async () => {
    const app = await startFastify(db.pool, created, paid);
    for (const path of ['/orders', '/payments']) {
      const res = await send(`${app.url}${path}`, randomUUID(), 'acme\0evil');
      expect(res.status).toBe(400);
      expect(res.headers.get('content-type')).toBe('application/problem+json');
      expect(res.json()).toMatchObject({
        type: 'https://outboxkit.dev/problems/tenant-unresolved',
        code: 'OUTBOXKIT_TENANT_UNRESOLVED',
      });
      expect(res.json().detail).toMatch(/NUL/);
    }
    // The GET of an operation resource too.
    const got = await send(`${app.url}/operations/${operationIdOf('k')}`, undefined, 'acme\0evil', 'GET');
    expect(got.status).toBe(400);
    expect(got.json()).toMatchObject({ code: 'OUTBOXKIT_TENANT_UNRESOLVED' });
    expect(app.calls).toEqual({ tx: 0, lease: 0 });
    expect(await counts()).toEqual({ records: 0, rows: 0 });
  });

  it('called directly: a NUL or lone-surrogate tenant, or a NUL operation, is a typed error before any SQL', async () => {
    const request = (tenant: string, operation = 'op') => {
      const key = randomUUID();
      // The fingerprint of a valid request: the store must refuse the scope on its own.
      return {
        tenant,
        operation,
        key,
        fingerprint: fingerprintRequest({ tenant: 't', operation: 'op', body: '{}', maxBodyBytes: 1_000 }),
      };
    };
    let ran = 0;
    const handler = async () => {
      ran++;
      return { status: 201, body: {} };
    };
    for (const [req, code] of [
      [request('a\0b'), 'OUTBOXKIT_TENANT_UNRESOLVED'],
      [request('a\uD800b'), 'OUTBOXKIT_TENANT_UNRESOLVED'],
      [request('x'.repeat(1_025)), 'OUTBOXKIT_TENANT_UNRESOLVED'],
      [request('t', 'op\0'), 'OUTBOXKIT_INVALID_OPTIONS'],
    ] as const) {
      await expect(executeIdempotent(db.pool, req, handler)).rejects.toMatchObject({ code });
      await expect(executeLeased(db.pool, req, handler)).rejects.toMatchObject({ code });
    }
    await expect(
      serveOperation(db.pool, { tenant: 'a\0b', operation: 'op', operationId: operationIdOf('k') }),
    ).rejects.toMatchObject({ code: 'OUTBOXKIT_TENANT_UNRESOLVED' });
    await expect(reconcileUncertain(db.pool, 'op\0', async () => ({ outcome: 'unknown' }))).rejects.toMatchObject({
      code: 'OUTBOXKIT_INVALID_OPTIONS',
    });
    await expect(
      listKeys(db.pool, idempotencyTable('"outboxkit"'), { state: 'uncertain', tenant: 'a\0', limit: 10 }),
    ).rejects.toMatchObject({ code: 'OUTBOXKIT_INVALID_OPTIONS' });
    expect(ran).toBe(0);
    expect(await counts()).toEqual({ records: 0, rows: 0 });
  });

  it('an operation name with a NUL is refused when the handler is built', () => {
    const opts = { db: db.pool, operation: 'create\0order', resolveTenant: () => 't' };
    for (const build of [
      () => idempotentHandler(opts, async () => ({ status: 200, body: {} })),
      () => leasedHandler(opts, async () => ({ status: 200, body: {} })),
      () => operationHandler(opts),
      () => expressHandler(opts, async () => ({ status: 200, body: {} })),
    ]) {
      let caught: unknown;
      try {
        build();
      } catch (err) {
        caught = err;
      }
      expect(isOutboxkitError(caught, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    }
  });

  it('one-transaction mode: a response header with a NUL or a non-string value is a typed error; rolled back, key released', async () => {
    let bad: HandlerResponse['headers'] = { 'x-note': 'a\0b' };
    const app = await startFastify(
      db.pool,
      async (insert) => {
        await insert();
        return { status: 201, headers: bad, body: { ok: true } };
      },
      paid,
    );
    const key = randomUUID();
    for (const headers of [{ 'x-note': 'a\0b' }, { 'x-note': 42 as unknown as string }, { 'x-note': 'snow ☃' }]) {
      bad = headers;
      const res = await send(`${app.url}/orders`, key);
      expect(res.status).toBe(500); // a server bug: Fastify's error handler
      expect(await counts()).toEqual({ records: 0, rows: 0 }); // no partial write, no record
    }
    bad = { 'x-note': 'fine' };
    const ok = await send(`${app.url}/orders`, key); // the same key executes: it was released
    expect(ok.status).toBe(201);
    expect(ok.headers.get('x-note')).toBe('fine');
    expect(app.calls.tx).toBe(4);
    expect(await counts()).toEqual({ records: 1, rows: 1 });
  });

  it('lease mode: an invalid response before any effect releases the key (no stuck processing record)', async () => {
    let headers: Record<string, string> = { 'x-note': 'a\0b' };
    const app = await startFastify(db.pool, created, async () => ({ status: 201, headers, body: { ok: true } }));
    const key = randomUUID();
    const res = await send(`${app.url}/payments`, key);
    expect(res.status).toBe(500);
    expect(await counts()).toEqual({ records: 0, rows: 0 }); // released, not processing
    headers = { 'x-note': 'fine' };
    const ok = await send(`${app.url}/payments`, key); // no 409: the key is free at once
    expect(ok.status).toBe(201);
    expect(app.calls.lease).toBe(2);
  });

  it('lease mode: an invalid response after an effect is stored as failed (500) and replayed, never left processing', async () => {
    const app = await startFastify(db.pool, created, async (_ctx, insert) => {
      await insert();
      return { status: 201, headers: { 'x-note': 'a\0b' }, body: { ok: true } };
    });
    const key = randomUUID();
    const first = await send(`${app.url}/payments`, key);
    expect(first.status).toBe(500);
    expect(first.json()).toMatchObject({ code: 'OUTBOXKIT_INTERNAL' });
    const { rows } = await db.pool.query<{ state: string }>('SELECT state FROM outboxkit.idempotency_keys');
    expect(rows).toEqual([{ state: 'failed' }]);
    const replay = await send(`${app.url}/payments`, key);
    expect(replay.status).toBe(500);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(app.calls.lease).toBe(1);
    expect(await counts()).toEqual({ records: 1, rows: 1 });
  });

  it('lease mode: an uncertain reason with a NUL is stored (as U+FFFD), the record becomes uncertain', async () => {
    const app = await startFastify(db.pool, created, async (ctx) => ctx.uncertain('timeout\0 after \uD800 call'));
    const res = await send(`${app.url}/payments`, randomUUID());
    expect(res.status).toBe(202);
    const { rows } = await db.pool.query<{ state: string; body: Buffer | null }>(
      'SELECT state, response_body AS body FROM outboxkit.idempotency_keys',
    );
    expect(rows).toHaveLength(1);
    expect(rows[0]!.state).toBe('uncertain');
    expect(rows[0]!.body?.toString('utf8')).toBe('timeout\uFFFD after \uFFFD call');
  });
});

describe('a database without outboxkit tables (no migrate)', () => {
  const fp = fingerprintRequest({ tenant: 't', operation: 'op', body: '{}', maxBodyBytes: 1_000 });
  const isMissing = (err: unknown) => isOutboxkitError(err, 'OUTBOXKIT_SCHEMA_MISSING') && !err.retriable;

  it('executeIdempotent and executeLeased raise SchemaMissingError and never run the handler', async () => {
    let ran = 0;
    const handler = async () => {
      ran++;
      return { status: 201, body: {} };
    };
    for (const run of [
      () => executeIdempotent(bare.pool, { tenant: 't', operation: 'op', key: randomUUID(), fingerprint: fp }, handler),
      () =>
        executeIdempotent(bare.pool, { tenant: 't', operation: 'op', key: randomUUID(), fingerprint: fp }, handler, {
          policy: 'wait',
        }),
      () => executeLeased(bare.pool, { tenant: 't', operation: 'op', key: randomUUID(), fingerprint: fp }, handler),
      // A migrated database, another schema name: the same error, naming that schema.
      () =>
        executeIdempotent(db.pool, { tenant: 't', operation: 'op', key: randomUUID(), fingerprint: fp }, handler, {
          schema: 'not_migrated',
        }),
    ]) {
      const err = await run().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isMissing(err), String(err)).toBe(true);
      expect((err as Error).message).toMatch(/outboxkit migrate/);
    }
    expect(ran).toBe(0);
  });

  it('cleanup, reconcile, serveOperation, listKeys and the gauges raise SchemaMissingError', async () => {
    const attempts: (() => Promise<unknown>)[] = [
      () => cleanupExpiredKeys(bare.pool),
      () => reconcileUncertain(bare.pool, 'op', async () => ({ outcome: 'unknown' })),
      () => serveOperation(bare.pool, { tenant: 't', operation: 'op', operationId: operationIdOf('k') }),
      () => listKeys(bare.pool, idempotencyTable('"outboxkit"'), { state: 'uncertain', limit: 10 }),
      async () => {
        const registry = new Registry();
        idempotencyGauges(bare.pool, registry);
        return registry.metrics();
      },
    ];
    for (const attempt of attempts) {
      const err = await attempt().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isMissing(err), String(err)).toBe(true);
    }
  });

  it('over HTTP (Fastify, both modes, and Express): 500 problem+json schema-missing, no Retry-After, handler not run', async () => {
    const app = await startFastify(bare.pool, created, paid);
    const expressApp = express();
    let expressCalls = 0;
    expressApp.post(
      '/orders',
      express.raw({ type: 'application/json' }),
      expressHandler({ db: bare.pool, operation: 'create-order', resolveTenant: () => 'tenant-a' }, async () => {
        expressCalls++;
        return { status: 201, body: {} };
      }),
    );
    const server: Server = await new Promise((resolve) => {
      const s = expressApp.listen(0, '127.0.0.1', () => resolve(s));
    });
    servers.push({ close: () => new Promise<void>((r) => server.close(() => r())) });
    const expressUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/orders`;

    for (const url of [`${app.url}/orders`, `${app.url}/payments`, expressUrl]) {
      const res = await send(url, randomUUID());
      expect(res.status, url).toBe(500);
      expect(res.headers.get('content-type')).toBe('application/problem+json');
      expect(res.headers.get('retry-after')).toBeNull();
      const body = res.json();
      expect(body).toMatchObject({
        type: 'https://outboxkit.dev/problems/schema-missing',
        status: 500,
        code: 'OUTBOXKIT_SCHEMA_MISSING',
      });
      // The operator's details (schema, table, SQL error) stay in the logs.
      expect(String(body.detail)).not.toMatch(/relation|outboxkit\./);
    }
    const got = await send(`${app.url}/operations/${operationIdOf('k')}`, undefined, 'tenant-a', 'GET');
    expect(got.status).toBe(500);
    expect(got.json()).toMatchObject({ code: 'OUTBOXKIT_SCHEMA_MISSING' });
    expect(app.calls).toEqual({ tx: 0, lease: 0 });
    expect(expressCalls).toBe(0);
  });
});
