/**
 * Replays keep their representation (docs/http-contract.md, "Replayed representation"): a stored
 * response whose body the handler content-coded (gzip, br, deflate) is replayed with the headers
 * needed to read it (Content-Encoding, Content-Type, Content-Language, Content-Disposition,
 * Content-Location) and the Vary the original carried, through both adapters, with the
 * compression middleware of each framework in front (@fastify/compress, compression), for stored
 * successes and stored rejections; a retry whose Accept-Encoding refuses the stored coding gets
 * the decoded body, or 406 when it refuses identity too. Over real HTTP (node:http, which never
 * decodes, so the test sees the bytes on the wire) against the real PostgreSQL.
 */
import { randomUUID } from 'node:crypto';
import http, { type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import zlib from 'node:zlib';
import fastifyCompress from '@fastify/compress';
import compression from 'compression';
import express, { type NextFunction, type Request, type Response } from 'express';
import Fastify from 'fastify';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { joinTransaction, type TransactionHandle } from '../../src/database.js';
import {
  idempotentHandler as expressHandler,
  leasedHandler as expressLeasedHandler,
  operationHandler as expressOperationHandler,
} from '../../src/http/express.js';
import { idempotentHandler as fastifyHandler, registerRawJsonBody } from '../../src/http/fastify.js';
import type { ExecutionContext } from '../../src/idempotency/execute.js';
import type { HandlerResponse } from '../../src/idempotency/state-machine.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { ORDERS_TABLE_SQL, readRecords } from '../idempotency/harness.js';

let db: TestDatabase;
const open = new Set<{ close(): Promise<void> }>();

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  const left = [...open];
  await Promise.all(left.map((a) => a.close()));
  expect(left.length, 'a test left an app open').toBe(0);
  await db.pool.query('TRUNCATE app_orders, outboxkit.idempotency_keys');
});

afterAll(async () => {
  await Promise.all([...open].map((a) => a.close()));
  await db?.drop();
});

type Coding = 'gzip' | 'br' | 'deflate';

function encode(coding: Coding, bytes: Buffer): Buffer {
  if (coding === 'gzip') return zlib.gzipSync(bytes);
  if (coding === 'br') return zlib.brotliCompressSync(bytes);
  return zlib.deflateSync(bytes); // HTTP "deflate" is the zlib format (RFC 9110 §8.4.1.2)
}

/** What a client does with a response: undo each coding of Content-Encoding, last applied first. */
function decodeAsClient(res: RawResponse): Buffer {
  const codings = (res.headers['content-encoding'] ?? '')
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity')
    .reverse();
  let bytes = res.bytes;
  for (const coding of codings) {
    if (coding === 'gzip' || coding === 'x-gzip') bytes = zlib.gunzipSync(bytes);
    else if (coding === 'br') bytes = zlib.brotliDecompressSync(bytes);
    else if (coding === 'deflate') bytes = zlib.inflateSync(bytes);
    else throw new Error(`the test client cannot decode ${coding}`);
  }
  return bytes;
}

/** A JSON document over the middlewares' 1 KiB threshold, with non-ASCII text and a unique id. */
function orderDocument(id: string): Buffer {
  const lines = Array.from({ length: 30 }, (_, i) => ({ sku: `sku-${i}`, note: 'Größe M, Farbe Blau' }));
  return Buffer.from(JSON.stringify({ id, execution: randomUUID(), lines }), 'utf8');
}

/** The representation a handler chose, as headers (one strong ETag, validator of the coded bytes). */
function representationHeaders(coding: Coding, id: string): Record<string, string> {
  return {
    'content-type': 'application/json',
    'content-encoding': coding,
    'content-language': 'de',
    'content-disposition': `attachment; filename="bestellung-${id}.json"`,
    'content-location': `/orders/${id}`,
    vary: 'accept-encoding, accept-language',
    etag: `"${id}-${coding}"`,
  };
}

/** The headers a replay must carry exactly as the first response did. */
const KEPT = [
  'content-type',
  'content-encoding',
  'content-language',
  'content-disposition',
  'content-location',
  'vary',
  'etag',
] as const;

interface RawResponse {
  status: number;
  headers: IncomingHttpHeaders;
  bytes: Buffer;
}

/** POSTs on a connection of its own with node:http: the bytes as sent, never decoded. */
function rawPost(
  url: string,
  path: string,
  options: { key: string; acceptEncoding?: string; body?: string },
): Promise<RawResponse> {
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'idempotency-key': options.key,
    'x-tenant': 'tenant-a',
    ...(options.acceptEncoding === undefined ? {} : { 'accept-encoding': options.acceptEncoding }),
  };
  return rawRequest(url, path, 'POST', headers, options.body ?? '{"sku":"a-1","qty":2}');
}

function rawRequest(
  url: string,
  path: string,
  method: string,
  headers: Record<string, string>,
  body?: string,
): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${url}${path}`, { method, headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, bytes: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

function expectSameRepresentation(first: RawResponse, replay: RawResponse): void {
  expect(replay.status).toBe(first.status);
  expect(first.headers['idempotent-replayed']).toBeUndefined();
  expect(replay.headers['idempotent-replayed']).toBe('true');
  for (const name of KEPT) expect(replay.headers[name], name).toBe(first.headers[name]);
  expect(replay.bytes.equals(first.bytes), 'the same bytes on the wire').toBe(true);
  expect(decodeAsClient(replay).equals(decodeAsClient(first)), 'decoded as the first answer').toBe(true);
}

/** What a route's handler answers for the order it inserted (`exec`: absent in lease mode). */
type Behaviour = (orderId: string, exec?: ExecutionContext) => HandlerResponse;

/** Inserts one business row in the request's transaction; returns its id. */
async function insertOrder(tx: unknown, body: unknown): Promise<string> {
  const q = joinTransaction(tx as TransactionHandle, 'test');
  const { rows } = await q.query<{ id: string }>(
    'INSERT INTO app_orders (tenant, operation, body, token) VALUES ($1, $2, $3, $4) RETURNING id::text AS id',
    ['tenant-a', 'create-order', JSON.stringify(body ?? null), randomUUID()],
  );
  return rows[0]!.id;
}

const resolveTenant = (req: { headers: Record<string, string | string[] | undefined> }) => {
  const t = req.headers['x-tenant'];
  return typeof t === 'string' ? t : undefined;
};

interface App {
  url: string;
  calls: { total: number };
  close(): Promise<void>;
}

/** Fastify with @fastify/compress registered for every route (its defaults: br, gzip, deflate; 1 KiB threshold). */
async function startFastify(behaviour: Behaviour): Promise<App> {
  const app = Fastify({ logger: false });
  await app.register(fastifyCompress);
  const calls = { total: 0 };
  await app.register(async (scope) => {
    registerRawJsonBody(scope);
    scope.post(
      '/orders',
      fastifyHandler({ db: db.pool, operation: 'create-order', resolveTenant }, async (req, tx, exec) => {
        calls.total++;
        return behaviour(await insertOrder(tx, req.body), exec);
      }),
    );
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const handle: App = {
    url: `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`,
    calls,
    async close() {
      open.delete(handle);
      await app.close();
    },
  };
  open.add(handle);
  return handle;
}

/** Express 5 with the `compression` middleware in front of every route (its defaults: 1 KiB threshold). */
async function startExpress(behaviour: Behaviour): Promise<App> {
  const app = express();
  app.use(compression());
  const calls = { total: 0 };
  app.post(
    '/orders',
    express.raw({ type: 'application/json', limit: '1mb' }),
    expressHandler({ db: db.pool, operation: 'create-order', resolveTenant }, async (req, tx, exec) => {
      calls.total++;
      return behaviour(await insertOrder(tx, req.body), exec);
    }),
  );
  app.post(
    '/payments',
    express.raw({ type: 'application/json', limit: '1mb' }),
    expressLeasedHandler(
      {
        db: db.pool,
        operation: 'create-payment',
        resolveTenant,
        policy: 'async',
        operationLocation: (id) => `/operations/payments/${id}`,
        operationIdSecret: 'a test secret of 32 bytes or more, never a real one',
      },
      async (req, ctx) => {
        calls.total++;
        const id = await ctx.transaction((tx) => insertOrder(tx, req.body));
        return behaviour(id);
      },
    ),
  );
  app.get(
    '/operations/payments/:operationId',
    expressOperationHandler({ db: db.pool, operation: 'create-payment', resolveTenant }),
  );
  app.use((err: Error, _req: Request, res: Response, _next: NextFunction) => {
    res.status(500).json({ error: err.message });
  });
  const server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  const handle: App = {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    calls,
    async close() {
      open.delete(handle);
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
  open.add(handle);
  return handle;
}

/** A 201 whose body the handler encoded itself with `coding`. */
function encodedSuccess(coding: Coding): Behaviour {
  return (id) => ({
    status: 201,
    headers: { ...representationHeaders(coding, id), location: `/orders/${id}` },
    body: encode(coding, orderDocument(id)),
  });
}

/** A stored rejection (422) whose problem body the handler encoded itself with `coding`. */
function encodedRejection(coding: Coding): Behaviour {
  return (id, exec) => {
    if (exec === undefined) throw new Error('a stored rejection needs a one-transaction route');
    const problem = Buffer.from(
      JSON.stringify({ title: 'Nicht vorrätig', detail: 'Artikel a-1 ist ausverkauft.', execution: randomUUID() }),
      'utf8',
    );
    return exec.reject(422, encode(coding, problem), {
      headers: { ...representationHeaders(coding, id), 'content-type': 'application/problem+json' },
    });
  };
}

const apps = { fastify: startFastify, express: startExpress } as const;

describe('C32 compressed and localised responses: each retry gets the representation of the first answer', () => {
  it.each([
    ['fastify', 'br'],
    ['fastify', 'gzip'],
    ['fastify', 'deflate'],
    ['express', 'br'],
    ['express', 'gzip'],
    ['express', 'deflate'],
  ] as const)('C32 %s: a stored 201 with a %s body the handler encoded', async (adapter, coding) => {
    const app = await apps[adapter](encodedSuccess(coding));
    const key = randomUUID();
    const first = await rawPost(app.url, '/orders', { key, acceptEncoding: 'gzip, deflate, br' });
    expect(first.status).toBe(201);
    expect(first.headers['content-encoding']).toBe(coding); // the middleware passed it through
    expect(JSON.parse(decodeAsClient(first).toString('utf8'))).toMatchObject({ lines: expect.any(Array) });
    for (let i = 0; i < 2; i++) {
      expectSameRepresentation(first, await rawPost(app.url, '/orders', { key, acceptEncoding: 'gzip, deflate, br' }));
    }
    // A retry without Accept-Encoding states no preference (RFC 9110 §12.5.3): the stored coding.
    expectSameRepresentation(first, await rawPost(app.url, '/orders', { key }));
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it.each([
    ['express', 'deflate'],
    ['express', 'gzip'],
    ['express', 'br'],
    ['fastify', 'deflate'],
    ['fastify', 'gzip'],
    ['fastify', 'br'],
  ] as const)('C32 %s: a stored rejection (422, Content-Language: de) with a %s body', async (adapter, coding) => {
    const app = await apps[adapter](encodedRejection(coding));
    const key = randomUUID();
    const first = await rawPost(app.url, '/orders', { key, acceptEncoding: coding });
    expect(first.status).toBe(422);
    expect(first.headers['content-language']).toBe('de');
    expect(first.headers['content-encoding']).toBe(coding);
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'failed', response_status: 422 });
    for (let i = 0; i < 2; i++) {
      expectSameRepresentation(first, await rawPost(app.url, '/orders', { key, acceptEncoding: coding }));
    }
    expect(JSON.parse(decodeAsClient(first).toString('utf8'))).toMatchObject({ title: 'Nicht vorrätig' });
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('C32 fastify: a JSON 201 that @fastify/compress encodes with br is stored unencoded and encoded the same way on every retry', async () => {
    // The middleware encodes after the handler returned, so after the commit: the record holds the
    // handler's bytes, and the middleware encodes the replay for its own request, as it did the first.
    const app = await startFastify((id) => ({
      status: 201,
      headers: { 'content-language': 'de', 'content-disposition': 'inline', vary: 'accept-language' },
      body: orderDocument(id),
    }));
    const key = randomUUID();
    const first = await rawPost(app.url, '/orders', { key, acceptEncoding: 'br' });
    expect(first.status).toBe(201);
    expect(first.headers['content-encoding']).toBe('br');
    expect(first.headers.vary).toBe('accept-language, accept-encoding');
    const [record] = await readRecords(db.pool, key);
    expect(record!.response_headers!['content-encoding']).toBeUndefined();
    expect(record!.response_body!.equals(decodeAsClient(first))).toBe(true);
    for (let i = 0; i < 2; i++) {
      expectSameRepresentation(first, await rawPost(app.url, '/orders', { key, acceptEncoding: 'br' }));
    }
    expect(app.calls.total).toBe(1);
    await app.close();
  });

  it('C32 express lease mode: a stored gzip 201 replays on a retry and on GET of the operation resource', async () => {
    const app = await startExpress(encodedSuccess('gzip'));
    const key = randomUUID();
    const first = await rawPost(app.url, '/payments', { key, acceptEncoding: 'gzip' });
    expect(first.status).toBe(201);
    expectSameRepresentation(first, await rawPost(app.url, '/payments', { key, acceptEncoding: 'gzip' }));
    const { rows } = await db.pool.query<{ operation_id: string }>(
      'SELECT operation_id FROM outboxkit.idempotency_keys WHERE key = $1',
      [key],
    );
    const path = `/operations/payments/${rows[0]!.operation_id}`;
    const resource = await rawRequest(app.url, path, 'GET', { 'x-tenant': 'tenant-a', 'accept-encoding': 'gzip' });
    expectSameRepresentation(first, resource);
    // The operation resource negotiates as a retry does.
    const plain = await rawRequest(app.url, path, 'GET', { 'x-tenant': 'tenant-a', 'accept-encoding': 'identity' });
    expect(plain.status).toBe(201);
    expect(plain.headers['content-encoding']).toBeUndefined();
    expect(plain.bytes.equals(decodeAsClient(first))).toBe(true);
    expect(app.calls.total).toBe(1);
    await app.close();
  });
});

describe('C32 a retry whose Accept-Encoding refuses the stored coding (RFC 9110 §12.5.3)', () => {
  it.each(['fastify', 'express'] as const)(
    'C32 %s: Accept-Encoding: identity gets the decoded bytes, the same content and language, Vary: accept-encoding, no strong ETag',
    async (adapter) => {
      const app = await apps[adapter](encodedSuccess('br'));
      const key = randomUUID();
      const first = await rawPost(app.url, '/orders', { key, acceptEncoding: 'br' });
      expect(first.headers['content-encoding']).toBe('br');
      const plain = await rawPost(app.url, '/orders', { key, acceptEncoding: 'identity' });
      expect(plain.status).toBe(201);
      expect(plain.headers['idempotent-replayed']).toBe('true');
      expect(plain.headers['content-encoding']).toBeUndefined();
      expect(plain.bytes.equals(decodeAsClient(first))).toBe(true);
      expect(Number(plain.headers['content-length'])).toBe(plain.bytes.length);
      for (const name of ['content-type', 'content-language', 'content-disposition', 'content-location', 'vary']) {
        expect(plain.headers[name], name).toBe(first.headers[name]); // vary already named accept-encoding
      }
      // The strong ETag validated the br-coded bytes (RFC 9110 §8.8.3): not these.
      expect(plain.headers.etag).toBeUndefined();
      expect(app.calls.total).toBe(1);
      await app.close();
    },
  );

  it.each(['fastify', 'express'] as const)(
    'C32 %s: a stored br body, a retry that accepts only gzip: decoded, then encoded by the middleware; same content',
    async (adapter) => {
      const app = await apps[adapter]((id) => ({
        status: 201,
        headers: { 'content-type': 'application/json', 'content-encoding': 'br', 'content-language': 'de' },
        body: encode('br', orderDocument(id)),
      }));
      const key = randomUUID();
      const first = await rawPost(app.url, '/orders', { key, acceptEncoding: 'br' });
      const gz = await rawPost(app.url, '/orders', { key, acceptEncoding: 'gzip' });
      expect(gz.status).toBe(201);
      expect(gz.headers['content-encoding']).toBe('gzip');
      expect(gz.headers['content-language']).toBe('de');
      expect(gz.headers.vary).toMatch(/accept-encoding/i);
      expect(decodeAsClient(gz).equals(decodeAsClient(first))).toBe(true);
      expect(app.calls.total).toBe(1);
      await app.close();
    },
  );

  it.each(['fastify', 'express'] as const)(
    'C32 %s: a retry that refuses the stored coding and identity gets 406 replay-not-acceptable; the record stays and replays later',
    async (adapter) => {
      const app = await apps[adapter](encodedRejection('deflate'));
      const key = randomUUID();
      const first = await rawPost(app.url, '/orders', { key, acceptEncoding: 'deflate' });
      expect(first.status).toBe(422);
      const refused = await rawPost(app.url, '/orders', { key, acceptEncoding: 'gzip;q=1, identity;q=0' });
      expect(refused.status).toBe(406);
      expect(refused.headers['content-type']).toBe('application/problem+json');
      expect(refused.headers['idempotent-replayed']).toBeUndefined();
      expect(JSON.parse(refused.bytes.toString('utf8'))).toMatchObject({
        type: 'https://outboxkit.dev/problems/replay-not-acceptable',
        status: 406,
        code: 'OUTBOXKIT_REPLAY_NOT_ACCEPTABLE',
      });
      expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'failed', response_status: 422 });
      expectSameRepresentation(first, await rawPost(app.url, '/orders', { key, acceptEncoding: 'deflate, gzip' }));
      expect(app.calls.total).toBe(1);
      await app.close();
    },
  );
});
