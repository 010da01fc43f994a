/**
 * Idempotency layer over real HTTP: one Fastify app on 127.0.0.1:0, driven by a fetch load loop
 * (undici's keep-alive pool) in the same process, against a fresh migrated database.
 *
 * Routes, all doing the same business write (one INSERT in a transaction) and answering the same
 * 201 JSON body:
 * - `/layer`: outboxkit's Fastify adapter (`idempotentHandler`), policy `reject`. Since the
 *   read-first path, a new key costs the layer 6 round trips (read-first SELECT, BEGIN + claim
 *   lock_timeout, claim + SAVEPOINT, business INSERT, completion, COMMIT) and a replay 1; the
 *   read-first SELECT and the completion are named prepared statements (parsed once per
 *   connection), the by-hand routes' statements are unnamed;
 * - `/layer-no-read-first`: the same with `readFirst: false` (5 round trips for a new key, one fewer than
 *   `/by-hand`; replays are answered from the claim's conflict);
 * - `/by-hand`: the claim and completion SQL written by hand with pg as the layer ran it before
 *   (BEGIN, set lock_timeout, INSERT ... ON CONFLICT claim, business INSERT, UPDATE completion,
 *   COMMIT: also 6 round trips, no savepoint, no read-first), with a SHA-256 of the raw body
 *   instead of the RFC 8785 fingerprint: the floor the layer can reach; `/by-hand-savepoint` adds
 *   a SAVEPOINT after the claim as its own statement (the layer's cost before it rode with the claim);
 * - `/bare`: no idempotency at all (BEGIN, business INSERT, COMMIT).
 *
 * Measures (ratios of requests/s, interleaved rounds, see lib.ts):
 * (a) layer / by-hand, new keys; (b) layer / bare, new keys; (c) layer replays / bare;
 * (d) 32 concurrent requests with one key: executions and statuses. Info rows compare the layer's
 * replays with the one-SELECT replay by hand directly (the cost of the layer's own JavaScript),
 * since both sides of (c) and of the by-hand row are measured against a bare route whose
 * throughput (an fsync per commit) drifts between rows more than the replays do.
 */
import { createHash, randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import Fastify from 'fastify';
import pg from 'pg';
import { idempotentHandler, registerRawJsonBody } from '../src/http/fastify.js';
import { compare, formatComparisons, type Comparison } from './lib.js';
import { benchDatabase, machine } from './support.js';

const CONCURRENCY = 16;
const POOL_SIZE = 16;
const TENANT = 'bench-tenant';
const BODY = JSON.stringify({ cartId: 'cart-42', currency: 'EUR', amount: 1234, lines: [{ sku: 'A-1', qty: 2 }] });

export async function run(): Promise<string> {
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: POOL_SIZE });
  await pool.query('CREATE TABLE biz (id bigserial PRIMARY KEY, tenant text NOT NULL, data text NOT NULL)');
  let executions = 0;

  const insertBiz = async (c: pg.PoolClient, data: unknown): Promise<string> => {
    const { rows } = await c.query<{ id: string }>(
      'INSERT INTO biz (tenant, data) VALUES ($1, $2) RETURNING id::text AS id',
      [TENANT, JSON.stringify(data)],
    );
    return rows[0]!.id;
  };
  const created = (id: string) => ({ id, status: 'created' });

  const app = Fastify({ logger: false });
  app.post('/bare', async (req, reply) => {
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      const id = await insertBiz(c, req.body);
      await c.query('COMMIT');
      return reply.code(201).header('location', `/biz/${id}`).send(created(id));
    } catch (err) {
      await c.query('ROLLBACK');
      throw err;
    } finally {
      c.release();
    }
  });

  await app.register(async (scope) => {
    registerRawJsonBody(scope);
    scope.post(
      '/layer',
      idempotentHandler(
        { db: pool, operation: 'bench-layer', resolveTenant: (req) => req.headers['x-tenant'] as string | undefined },
        async (req, tx) => {
          executions++;
          const id = await insertBiz(tx, req.body);
          return { status: 201, headers: { location: `/biz/${id}` }, body: created(id) };
        },
      ),
    );
    scope.post(
      '/layer-no-read-first',
      idempotentHandler(
        {
          db: pool,
          operation: 'bench-layer-nrf',
          readFirst: false,
          resolveTenant: (req) => req.headers['x-tenant'] as string | undefined,
        },
        async (req, tx) => {
          executions++;
          const id = await insertBiz(tx, req.body);
          return { status: 201, headers: { location: `/biz/${id}` }, body: created(id) };
        },
      ),
    );
    scope.post('/by-hand', async (req, reply) =>
      byHand(pool, req.headers, req.body as Buffer, reply, insertBiz, false),
    );
    scope.post('/by-hand-savepoint', async (req, reply) =>
      byHand(pool, req.headers, req.body as Buffer, reply, insertBiz, true),
    );
    scope.post('/lookup-replay', async (req, reply) => lookupReplay(pool, req.headers, req.body as Buffer, reply));
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;

  const send = async (path: string, key: string | undefined, expected: number, replayed = false) => {
    const headers: Record<string, string> = { 'content-type': 'application/json', 'x-tenant': TENANT };
    if (key !== undefined) headers['idempotency-key'] = key;
    const res = await fetch(`${base}${path}`, { method: 'POST', headers, body: BODY });
    await res.arrayBuffer();
    if (res.status !== expected || (res.headers.get('idempotent-replayed') === 'true') !== replayed) {
      throw new Error(`${path}: unexpected ${res.status} (replayed: ${res.headers.get('idempotent-replayed')})`);
    }
  };
  // Keys that already have a completed record, for the replay measures (one per worker, cycled).
  const replayKeys = async (path: string) => {
    const keys = Array.from({ length: 64 }, () => randomUUID());
    for (const k of keys) await send(path, k, 201);
    let i = 0;
    return () => keys[i++ % keys.length]!;
  };
  const layerReplayKey = await replayKeys('/layer');
  const handReplayKey = await replayKeys('/by-hand');

  const layerNew = () => send('/layer', randomUUID(), 201);
  const layerNoReadFirstNew = () => send('/layer-no-read-first', randomUUID(), 201);
  const handNew = () => send('/by-hand', randomUUID(), 201);
  const handSavepointNew = () => send('/by-hand-savepoint', randomUUID(), 201);
  const bare = () => send('/bare', undefined, 201);
  const layerReplay = () => send('/layer', layerReplayKey(), 201, true);
  const handReplay = () => send('/by-hand', handReplayKey(), 201, true);
  const lookup = () => send('/lookup-replay', handReplayKey(), 201, true);
  const o = { concurrency: CONCURRENCY, rounds: 7, roundMs: 2_500 };
  const loadBefore = os.loadavg()[0]!;

  const rows: Comparison[] = [];
  try {
    rows.push(await compare('(a) layer, new keys', layerNew, 'same claim + completion SQL by hand', handNew, o));
    rows.push(
      await compare(
        '(a, readFirst: false) layer, new keys',
        layerNoReadFirstNew,
        'same claim + completion SQL by hand',
        handNew,
        o,
      ),
    );
    rows.push(
      await compare(
        '(info) layer, new keys',
        layerNew,
        'same SQL by hand + SAVEPOINT after the claim',
        handSavepointNew,
        o,
      ),
    );
    rows.push(await compare('(b) layer, new keys', layerNew, 'bare route (no idempotency)', bare, o));
    rows.push(await compare('(c) layer, replays', layerReplay, 'bare route (no idempotency)', bare, o));
    rows.push(await compare('(info) layer, replays', layerReplay, 'same replay SQL by hand', handReplay, o));
    rows.push(await compare('(info) replay SQL by hand', handReplay, 'bare route (no idempotency)', bare, o));
    rows.push(
      await compare('(info) replay by one plain SELECT, by hand', lookup, 'bare route (no idempotency)', bare, o),
    );
    rows.push(await compare('(info) layer, replays', layerReplay, 'replay by one plain SELECT, by hand', lookup, o));

    // (d) 32 concurrent requests with one key.
    const before = executions;
    const key = randomUUID();
    const statuses = await Promise.all(
      Array.from({ length: 32 }, async () => {
        const res = await fetch(`${base}/layer`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-tenant': TENANT, 'idempotency-key': key },
          body: BODY,
        });
        await res.arrayBuffer();
        return res.status === 201 && res.headers.get('idempotent-replayed') === 'true' ? '201 replayed' : res.status;
      }),
    );
    const ran = executions - before;
    const { rows: bizRows } = await pool.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM outboxkit.idempotency_keys WHERE key = $1`,
      [key],
    );
    const histogram = new Map<string, number>();
    for (const s of statuses) histogram.set(String(s), (histogram.get(String(s)) ?? 0) + 1);
    const summary = [...histogram].map(([s, n]) => `${n} × ${s}`).join(', ');
    const verdict = ran === 1 && bizRows[0]!.n === 1 ? 'exactly one execution' : `FAIL: ${ran} executions`;

    return [
      `Machine: ${await machine()}; ${CONCURRENCY} concurrent HTTP clients (fetch, keep-alive) and the Fastify server in one process, pool of ${POOL_SIZE}, PostgreSQL on the same host (fsync on); 1-minute load average ${loadBefore.toFixed(1)} before and ${os.loadavg()[0]!.toFixed(1)} after the run.`,
      '',
      formatComparisons(rows),
      '',
      `(d) 32 concurrent requests with one key: handler executions = ${ran} (${verdict}); responses: ${summary}.`,
    ].join('\n');
  } finally {
    await app.close();
    await pool.end();
    await db.drop();
  }
}

type Headers = Record<string, string | string[] | undefined>;
interface Reply {
  code(status: number): Reply;
  headers(h: Record<string, string>): Reply;
  send(body: unknown): Reply;
}

/** The claim and completion SQL of the layer, written by hand (the same statements and round trips). */
async function byHand(
  pool: pg.Pool,
  headers: Headers,
  raw: Buffer,
  reply: Reply,
  insertBiz: (c: pg.PoolClient, data: unknown) => Promise<string>,
  savepoint: boolean,
): Promise<Reply> {
  const key = String(headers['idempotency-key']);
  const tenant = String(headers['x-tenant']);
  const digest = createHash('sha256').update(tenant).update('\0').update(raw).digest();
  const body: unknown = JSON.parse(raw.toString('utf8'));
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    const { rows: prev } = await c.query<{ previous: string }>(
      `SELECT p.previous, set_config('lock_timeout', '100ms', true) AS applied
         FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) p`,
    );
    const claim = await c.query(
      `WITH claim AS (
         INSERT INTO outboxkit.idempotency_keys AS k
                (tenant, operation, key, fingerprint, fingerprint_version, state, owner_token, generation, expires_at)
         VALUES ($1, 'bench-hand', $2, $3, 1, 'processing', $4, 1, now() + interval '1 day')
         ON CONFLICT (tenant, operation, key) DO UPDATE
            SET state = 'processing', owner_token = EXCLUDED.owner_token, generation = k.generation + 1
          WHERE k.expires_at <= now() AND k.state IN ('completed', 'failed')
         RETURNING k.generation)
       SELECT claim.generation, set_config('lock_timeout', $5, true) FROM claim`,
      [tenant, key, digest, randomUUID(), prev[0]!.previous],
    );
    if (claim.rowCount === 0) {
      const { rows } = await c.query<{ fingerprint: Buffer; response_status: number; response_body: Buffer }>(
        `SELECT fingerprint, response_status, response_body FROM outboxkit.idempotency_keys
          WHERE tenant = $1 AND operation = 'bench-hand' AND key = $2`,
        [tenant, key],
      );
      await c.query('COMMIT');
      const r = rows[0]!;
      if (!r.fingerprint.equals(digest)) return reply.code(422).send({ error: 'mismatch' });
      return reply
        .code(r.response_status)
        .headers({ 'content-type': 'application/json', 'idempotent-replayed': 'true' })
        .send(r.response_body);
    }
    // The layer takes a SAVEPOINT here (for stored business rejections): measured with and without.
    if (savepoint) await c.query('SAVEPOINT claimed');
    const id = await insertBiz(c, body);
    const bytes = Buffer.from(JSON.stringify({ id, status: 'created' }));
    await c.query(
      `UPDATE outboxkit.idempotency_keys
          SET state = 'completed', response_status = 201, response_headers = $3::jsonb, response_body = $4,
              completed_at = clock_timestamp(), updated_at = clock_timestamp(),
              expires_at = clock_timestamp() + interval '1 day'
        WHERE tenant = $1 AND operation = 'bench-hand' AND key = $2 AND state = 'processing'`,
      [tenant, key, JSON.stringify({ 'content-type': 'application/json', location: `/biz/${id}` }), bytes],
    );
    await c.query('COMMIT');
    return reply
      .code(201)
      .headers({ 'content-type': 'application/json', location: `/biz/${id}` })
      .send(bytes);
  } catch (err) {
    await c.query('ROLLBACK');
    throw err;
  } finally {
    c.release();
  }
}

/**
 * Not the layer: a replay answered by one plain SELECT outside any transaction (no row lock, so
 * no WAL flush at commit). Shows what a read-first fast path for completed records could reach.
 */
async function lookupReplay(pool: pg.Pool, headers: Headers, raw: Buffer, reply: Reply): Promise<Reply> {
  const key = String(headers['idempotency-key']);
  const tenant = String(headers['x-tenant']);
  const digest = createHash('sha256').update(tenant).update('\0').update(raw).digest();
  const { rows } = await pool.query<{ fingerprint: Buffer; response_status: number; response_body: Buffer }>(
    `SELECT fingerprint, response_status, response_body FROM outboxkit.idempotency_keys
      WHERE tenant = $1 AND operation = 'bench-hand' AND key = $2
        AND state IN ('completed', 'failed') AND expires_at > now()`,
    [tenant, key],
  );
  const r = rows[0];
  if (r === undefined || !r.fingerprint.equals(digest)) return reply.code(500).send({ error: 'no record' });
  return reply
    .code(r.response_status)
    .headers({ 'content-type': 'application/json', 'idempotent-replayed': 'true' })
    .send(r.response_body);
}
