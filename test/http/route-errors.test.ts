/**
 * What an idempotent route answers for an error that is neither an outboxkit problem nor the
 * handler's own (docs/http-contract.md, row 26): an error thrown by `resolveTenant`, `deadline` or
 * `operationLocation`, or an unexpected PostgreSQL error of outboxkit's own statements (here a
 * deferred foreign key failing at COMMIT). Both adapters answer the generic 500 problem
 * `internal` (no message, no SQL, no parameters) and log the error through the route's logger;
 * the handler's own errors still go to the framework (test/http/express.test.ts). Over real HTTP
 * against the real PostgreSQL.
 */
import { randomUUID } from 'node:crypto';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import express from 'express';
import Fastify from 'fastify';
import type pg from 'pg';
import { beforeAll, describe, expect, it } from 'vitest';
import * as expressAdapter from '../../src/http/express.js';
import * as fastifyAdapter from '../../src/http/fastify.js';
import type { Logger } from '../../src/logger.js';
import { operationIdOf } from '../../src/idempotency/lease-store.js';
import { waitFor } from '../helpers/wait-for.js';
import { post, useOrdersDatabase, type HttpResult } from '../idempotency/harness.js';
import { gate, get } from '../idempotency/lease-harness.js';

const db = useOrdersDatabase('app_orders, outboxkit.idempotency_keys, rt_children, rt_parents');

beforeAll(async () => {
  // A deferred foreign key: checked at COMMIT, one of outboxkit's own statements.
  await db.pool.query(`CREATE TABLE rt_parents (id text PRIMARY KEY);
    CREATE TABLE rt_children (parent text REFERENCES rt_parents (id) DEFERRABLE INITIALLY DEFERRED)`);
});

/** A secret-looking message that must reach the logs, never a client. */
const SECRET = 'jwt signature invalid for key s3cr3t-signing-key';

interface Logged {
  obj: Record<string, unknown>;
  msg: string;
}

function capturingLogger(logged: Logged[]): Logger {
  return { debug() {}, info() {}, warn() {}, error: (obj, msg) => void logged.push({ obj, msg }) };
}

interface App {
  url: string;
  logged: Logged[];
  /** The async route's handler runs until this opens. */
  release: ReturnType<typeof gate>;
  started: { count: number };
  close(): Promise<void>;
}

const failing = (): never => {
  throw new Error(SECRET);
};

/**
 * The same routes on either framework:
 * - `POST /tenant-throws`, `POST /lease-tenant-throws`, `GET /operations/:operationId`: resolveTenant throws;
 * - `POST /deadline-throws`: a lease-mode route whose deadline(req) throws;
 * - `POST /location-throws`: policy async whose operationLocation throws (a duplicate gets 202);
 * - `POST /commit-fails`: the handler's insert breaks a deferred foreign key: COMMIT fails.
 */
async function startApp(framework: 'fastify' | 'express', pool: pg.Pool): Promise<App> {
  const logged: Logged[] = [];
  const logger = capturingLogger(logged);
  const release = gate();
  const started = { count: 0 };
  const tenant = () => 'tenant-a';
  // The adapters take the same options; only their request types differ (hence `as never` below).
  const adapter = framework === 'fastify' ? fastifyAdapter : expressAdapter;
  const created = { status: 201, body: { ok: true } };
  const routes = {
    tenantThrows: adapter.idempotentHandler(
      { db: pool, operation: 'a', resolveTenant: failing, logger },
      async () => created,
    ),
    leaseTenantThrows: adapter.leasedHandler(
      { db: pool, operation: 'b', resolveTenant: failing, logger },
      async () => created,
    ),
    deadlineThrows: adapter.leasedHandler(
      { db: pool, operation: 'c', resolveTenant: tenant, deadline: failing, logger },
      async () => created,
    ),
    locationThrows: adapter.leasedHandler(
      { db: pool, operation: 'd', resolveTenant: tenant, policy: 'async', operationLocation: failing, logger },
      async () => {
        started.count++;
        await release.promise;
        return created;
      },
    ),
    commitFails: adapter.idempotentHandler(
      { db: pool, operation: 'e', resolveTenant: tenant, logger },
      async (_req: unknown, tx: pg.PoolClient) => {
        await tx.query('INSERT INTO rt_children (parent) VALUES ($1)', ['tenant-a-secret-parent']);
        return created;
      },
    ),
    operation: adapter.operationHandler({ db: pool, operation: 'b', resolveTenant: failing, logger }),
  };

  if (framework === 'fastify') {
    const app = Fastify({ logger: false });
    await app.register(async (scope) => {
      fastifyAdapter.registerRawJsonBody(scope);
      scope.post('/tenant-throws', routes.tenantThrows as never);
      scope.post('/lease-tenant-throws', routes.leaseTenantThrows as never);
      scope.post('/deadline-throws', routes.deadlineThrows as never);
      scope.post('/location-throws', routes.locationThrows as never);
      scope.post('/commit-fails', routes.commitFails as never);
      scope.get('/operations/:operationId', routes.operation as never);
    });
    await app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = app.server.address() as AddressInfo;
    return { url: `http://127.0.0.1:${port}`, logged, release, started, close: () => app.close() };
  }
  const app = express();
  const raw = express.raw({ type: 'application/json' });
  app.post('/tenant-throws', raw, routes.tenantThrows as never);
  app.post('/lease-tenant-throws', raw, routes.leaseTenantThrows as never);
  app.post('/deadline-throws', raw, routes.deadlineThrows as never);
  app.post('/location-throws', raw, routes.locationThrows as never);
  app.post('/commit-fails', raw, routes.commitFails as never);
  app.get('/operations/:operationId', routes.operation as never);
  // No error middleware: Express's default one would print the error's stack to the client.
  const server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    logged,
    release,
    started,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

function expectGenericInternal(res: { status: number; headers: Headers; bytes: Buffer }, what: string): void {
  expect(res.status, what).toBe(500);
  expect(res.headers.get('content-type'), what).toBe('application/problem+json');
  expect(JSON.parse(res.bytes.toString('utf8'))).toEqual({
    type: 'https://outboxkit.dev/problems/internal',
    title: 'Internal error',
    status: 500,
    detail: 'The request failed because of an internal error.',
    code: 'OUTBOXKIT_INTERNAL',
  });
  const text = res.bytes.toString('utf8');
  for (const secret of ['s3cr3t', 'rt_children', 'tenant-a-secret-parent', 'INSERT', 'foreign key']) {
    expect(text, what).not.toContain(secret);
  }
}

describe.each(['fastify', 'express'] as const)(
  '%s: errors the layer catches get the generic 500 problem',
  (framework) => {
    it('resolveTenant, deadline or operationLocation throwing: 500 internal, message withheld, error logged', async () => {
      const app = await startApp(framework, db.pool);
      const asTestApp = { url: app.url, calls: { total: 0, byOperation: {} }, close: app.close };
      for (const path of ['/tenant-throws', '/lease-tenant-throws', '/deadline-throws']) {
        expectGenericInternal(await post(asTestApp, path), path);
      }
      expectGenericInternal(await get(asTestApp, `/operations/${operationIdOf(randomUUID())}`), 'operation resource');

      // operationLocation runs for the 202 of a duplicate while the first request holds the lease.
      const key = randomUUID();
      const first = post(asTestApp, '/location-throws', { key });
      await waitFor(() => app.started.count === 1);
      expectGenericInternal(await post(asTestApp, '/location-throws', { key }), 'operationLocation');
      app.release.open();
      expect((await first).status).toBe(201);

      expect(app.logged.map((l) => l.msg)).toEqual(Array(5).fill('idempotent route failed; answered 500 internal'));
      for (const { obj } of app.logged) {
        expect(obj.operation).toMatch(/^[abcd]$/);
        expect((obj.err as Error).message).toBe(SECRET);
      }
      await app.close();
    });

    it("an unexpected PostgreSQL error of outboxkit's own statements (COMMIT fails): 500 internal, no SQL or values, logged; nothing stored", async () => {
      const app = await startApp(framework, db.pool);
      const res: HttpResult = await post(
        { url: app.url, calls: { total: 0, byOperation: {} }, close: app.close },
        '/commit-fails',
      );
      expectGenericInternal(res, 'commit');
      expect(app.logged).toHaveLength(1);
      expect(app.logged[0]!.obj).toMatchObject({ operation: 'e', err: expect.objectContaining({ code: '23503' }) });
      const { rows } = await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM rt_children');
      expect(rows[0]!.n).toBe(0);
      await app.close();
    });
  },
);
