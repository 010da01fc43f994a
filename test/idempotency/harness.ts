/**
 * A small orders service over real HTTP for the idempotency tests: Fastify on 127.0.0.1:0 with
 * the outboxkit adapter, a business table `app_orders`, and a fetch helper.
 * Every app a test starts is closed by {@link closeAll} (call it in afterEach/afterAll).
 */
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyRequest } from 'fastify';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll, expect } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { joinTransaction, type TransactionHandle } from '../../src/database.js';
import { idempotentHandler, registerRawJsonBody, type FastifyIdempotencyOptions } from '../../src/http/fastify.js';
import type { ExecutionContext } from '../../src/idempotency/execute.js';
import type { HandlerResponse } from '../../src/idempotency/state-machine.js';

export const ORDERS_TABLE_SQL = `CREATE TABLE IF NOT EXISTS app_orders (
  id bigserial PRIMARY KEY,
  tenant text NOT NULL,
  operation text NOT NULL,
  body text NOT NULL,
  token uuid NOT NULL
)`;

export interface HandlerContext {
  /** 1 for the first handler call of this app, 2 for the second, ... */
  call: number;
  req: FastifyRequest;
  tx: pg.PoolClient;
  /** Inserts the business row and returns its id. */
  insertOrder(): Promise<string>;
  /** outboxkit's execution context (`reject`). */
  exec: ExecutionContext;
}

export type Behaviour = (ctx: HandlerContext) => Promise<HandlerResponse>;

export interface TestApp {
  url: string;
  /** Number of times the handler ran, by operation. */
  calls: { total: number; byOperation: Record<string, number> };
  close(): Promise<void>;
}

export interface StartAppOptions extends Partial<
  Omit<FastifyIdempotencyOptions<pg.Pool>, 'db' | 'operation' | 'resolveTenant'>
> {
  pool: pg.Pool;
  /** What the handler does; default: insert an order, return 201 with it. */
  behaviour?: Behaviour;
  /** Destroys the socket of the first response after commit (the reply is lost). */
  dropFirstReply?: boolean;
}

const apps = new Set<TestApp>();

/** The default behaviour: one business row, a 201 whose body is unique to this execution. */
export async function createOrder(ctx: HandlerContext): Promise<HandlerResponse> {
  const id = await ctx.insertOrder();
  return {
    status: 201,
    headers: { location: `/orders/${id}`, 'set-cookie': 'session=abc', 'x-execution': String(ctx.call) },
    body: { id, body: ctx.req.body ?? null, execution: randomUUID() },
  };
}

export async function startApp(options: StartAppOptions): Promise<TestApp> {
  const { pool, behaviour = createOrder, dropFirstReply = false, ...idem } = options;
  const app = Fastify({ logger: false });
  const calls = { total: 0, byOperation: {} as Record<string, number> };
  let dropNext = dropFirstReply;

  if (dropFirstReply) {
    app.addHook('onSend', async (req, _reply, payload) => {
      if (dropNext) {
        dropNext = false;
        req.raw.socket.destroy();
      }
      return payload;
    });
  }

  await app.register(async (scope) => {
    registerRawJsonBody(scope);
    for (const [path, operation] of [
      ['/orders', 'create-order'],
      ['/refunds', 'create-refund'],
      ['/orders/:id/cancel', 'cancel-order'], // one operation, many resources
    ] as const) {
      scope.post(
        path,
        idempotentHandler(
          {
            ...idem,
            db: pool,
            operation,
            resolveTenant: (req) => {
              const t = req.headers['x-tenant'];
              return typeof t === 'string' ? t : undefined;
            },
          },
          async (req, tx, exec) => {
            calls.total++;
            calls.byOperation[operation] = (calls.byOperation[operation] ?? 0) + 1;
            const call = calls.total;
            const insertOrder = async (): Promise<string> => {
              const q = joinTransaction(tx as TransactionHandle, 'test');
              const { rows } = await q.query<{ id: string }>(
                'INSERT INTO app_orders (tenant, operation, body, token) VALUES ($1, $2, $3, $4) RETURNING id::text AS id',
                [String(req.headers['x-tenant'] ?? ''), operation, JSON.stringify(req.body ?? null), randomUUID()],
              );
              return rows[0]!.id;
            };
            return behaviour({ call, req, tx, insertOrder, exec });
          },
        ),
      );
    }
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

/** Closes every app still open; returns how many were left open. */
/**
 * Registers a test file's database: created with `app_orders` before all tests; after each test,
 * checks that every app was closed and empties `tables`; dropped at the end. The returned handle
 * reads the database created in beforeAll (`db.pool`, `db.url`).
 */
export function useOrdersDatabase(
  tables = 'app_orders, outboxkit.idempotency_keys',
): Pick<TestDatabase, 'pool' | 'url'> {
  let db: TestDatabase | undefined;
  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query(ORDERS_TABLE_SQL);
  });
  afterEach(async () => {
    expect(await closeAll(), 'a test left an app open').toBe(0);
    await db!.pool.query(`TRUNCATE ${tables}`);
  });
  afterAll(async () => {
    await closeAll();
    await db?.drop();
  });
  return {
    get pool() {
      return db!.pool;
    },
    get url() {
      return db!.url;
    },
  };
}

export async function closeAll(): Promise<number> {
  const open = [...apps];
  await Promise.all(open.map((a) => a.close()));
  return open.length;
}

export interface HttpResult {
  status: number;
  headers: Headers;
  bytes: Buffer;
  json(): Record<string, unknown>;
}

export interface PostOptions {
  key?: string | null;
  tenant?: string | null;
  body?: string | Buffer;
  headers?: Record<string, string>;
  /** Aborts the request (the client goes away). */
  signal?: AbortSignal;
}

/** POSTs over real HTTP. `key: null` / `tenant: null` leave the header out. */
export async function post(app: TestApp, path: string, options: PostOptions = {}): Promise<HttpResult> {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...options.headers };
  if (options.key !== null) headers['idempotency-key'] = options.key ?? randomUUID();
  if (options.tenant !== null) headers['x-tenant'] = options.tenant ?? 'tenant-a';
  const res = await fetch(`${app.url}${path}`, {
    method: 'POST',
    headers,
    body: options.body ?? '{"amount":10}',
    ...(options.signal ? { signal: options.signal } : {}),
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  return { status: res.status, headers: res.headers, bytes, json: () => JSON.parse(bytes.toString('utf8')) };
}

/**
 * Sends a POST on a connection of its own and closes that connection after `hangUpAfterMs`
 * without reading any answer: a client that goes away. Resolves once the connection is closed.
 * (node:http, not fetch: an aborted fetch leaves undici's socket to the server for seconds.)
 */
export async function postAndHangUp(
  url: string,
  path: string,
  options: { key: string; body: string; tenant?: string },
  hangUpAfterMs: number,
): Promise<void> {
  const req = http.request(`${url}${path}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'idempotency-key': options.key,
      'x-tenant': options.tenant ?? 'tenant-a',
    },
  });
  const closed = new Promise<void>((resolve) => req.on('close', () => resolve()));
  let answered = false;
  req.on('error', () => {}); // ECONNRESET: the hang-up itself
  req.on('response', (res) => {
    answered = true;
    res.resume();
  });
  req.end(options.body);
  await new Promise((r) => setTimeout(r, hangUpAfterMs));
  req.destroy();
  await closed;
  if (answered) throw new Error('postAndHangUp: the server answered before the client hung up.');
}

export async function countOrders(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM app_orders');
  return rows[0]!.n;
}

export async function countRecords(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.idempotency_keys');
  return rows[0]!.n;
}

export interface RecordRow {
  tenant: string;
  operation: string;
  key: string;
  state: string;
  generation: number;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: Buffer | null;
}

export async function readRecords(pool: pg.Pool, key?: string): Promise<RecordRow[]> {
  const { rows } = await pool.query<RecordRow>(
    `SELECT tenant, operation, key, state, generation, response_status, response_headers, response_body
       FROM outboxkit.idempotency_keys WHERE $1::text IS NULL OR key = $1 ORDER BY tenant, operation`,
    [key ?? null],
  );
  return rows;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
