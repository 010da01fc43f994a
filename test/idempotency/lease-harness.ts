/**
 * A payments service in lease mode over real HTTP for the lease tests: Fastify on 127.0.0.1:0 with
 * `leasedHandler` on `POST /payments` and `operationHandler` on
 * `GET /operations/payments/:operationId`. Apps are closed by `closeAll()` of ./harness.ts's
 * sibling {@link closeLeaseApps}.
 */
import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyRequest } from 'fastify';
import type pg from 'pg';
import { joinTransaction, type TransactionHandle } from '../../src/database.js';
import {
  leasedHandler,
  operationHandler,
  registerRawJsonBody,
  type FastifyLeaseOptions,
} from '../../src/http/fastify.js';
import type { LeaseContext } from '../../src/idempotency/lease.js';
import type { HandlerResponse } from '../../src/idempotency/state-machine.js';
import type { TestApp } from './harness.js';

export interface LeaseHandlerContext {
  call: number;
  req: FastifyRequest;
  ctx: LeaseContext<pg.Pool>;
  /** Inserts the business row in a fenced transaction and returns its id. */
  insertOrder(): Promise<string>;
}

export type LeaseBehaviour = (c: LeaseHandlerContext) => Promise<HandlerResponse>;

export interface StartLeaseAppOptions extends Partial<
  Omit<FastifyLeaseOptions<pg.Pool>, 'db' | 'operation' | 'resolveTenant'>
> {
  pool: pg.Pool;
  behaviour?: LeaseBehaviour;
}

const apps = new Set<TestApp>();

/** The default: one fenced business row, 201. */
export async function pay(c: LeaseHandlerContext): Promise<HandlerResponse> {
  const id = await c.insertOrder();
  return { status: 201, headers: { location: `/payments/${id}` }, body: { id, execution: randomUUID() } };
}

export const OPERATION = 'create-payment';

export async function startLeaseApp(options: StartLeaseAppOptions): Promise<TestApp> {
  const { pool, behaviour = pay, ...lease } = options;
  const app = Fastify({ logger: false });
  const calls = { total: 0, byOperation: {} as Record<string, number> };
  const resolveTenant = (req: FastifyRequest) => {
    const t = req.headers['x-tenant'];
    return typeof t === 'string' ? t : undefined;
  };
  await app.register(async (scope) => {
    registerRawJsonBody(scope);
    scope.post(
      '/payments',
      leasedHandler(
        {
          operationLocation: (id) => `/operations/payments/${id}`,
          operationIdSecret: 'a test secret of 32 bytes or more, never a real one',
          ...lease,
          db: pool,
          operation: OPERATION,
          resolveTenant,
        },
        async (req, ctx) => {
          calls.total++;
          calls.byOperation[OPERATION] = (calls.byOperation[OPERATION] ?? 0) + 1;
          const call = calls.total;
          const insertOrder = () =>
            ctx.transaction(async (tx) => {
              const q = joinTransaction(tx as TransactionHandle, 'test');
              const { rows } = await q.query<{ id: string }>(
                'INSERT INTO app_orders (tenant, operation, body, token) VALUES ($1, $2, $3, $4) RETURNING id::text AS id',
                [String(req.headers['x-tenant'] ?? ''), OPERATION, JSON.stringify(req.body ?? null), ctx.ownerToken],
              );
              return rows[0]!.id;
            });
          return behaviour({ call, req, ctx, insertOrder });
        },
      ),
    );
    scope.get('/operations/payments/:operationId', operationHandler({ db: pool, operation: OPERATION, resolveTenant }));
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  const testApp: TestApp = {
    url: `http://127.0.0.1:${port}`,
    calls,
    async close() {
      apps.delete(testApp);
      await app.close();
    },
  };
  apps.add(testApp);
  return testApp;
}

/** Closes every lease app still open; returns how many were left open. */
export async function closeLeaseApps(): Promise<number> {
  const open = [...apps];
  await Promise.all(open.map((a) => a.close()));
  return open.length;
}

/** GETs over real HTTP with the tenant header. */
export async function get(app: TestApp, path: string, tenant = 'tenant-a') {
  const res = await fetch(`${app.url}${path}`, { headers: { 'x-tenant': tenant } });
  const bytes = Buffer.from(await res.arrayBuffer());
  return { status: res.status, headers: res.headers, bytes, json: () => JSON.parse(bytes.toString('utf8')) };
}

export interface LeaseRow {
  state: string;
  generation: number;
  owner_token: string | null;
  lease_live: boolean;
  response_status: number | null;
  response_body: Buffer | null;
}

export async function readLease(pool: pg.Pool, key: string): Promise<LeaseRow | undefined> {
  const { rows } = await pool.query<LeaseRow>(
    `SELECT state, generation, owner_token::text AS owner_token,
            COALESCE(lease_expires_at > clock_timestamp(), false) AS lease_live, response_status, response_body
       FROM outboxkit.idempotency_keys WHERE key = $1`,
    [key],
  );
  return rows[0];
}

/** A promise with its resolver, to hold a handler until the test lets it go. */
export function gate(): { promise: Promise<void>; open(): void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}
