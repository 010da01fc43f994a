/**
 * The public id of a lease-mode record (`operationId`) against the real PostgreSQL: stored by the
 * claim as an HMAC of (tenant, operation, key) under `operationIdSecret`, found again through an
 * index among 200,000 records of one tenant and operation, and kept across an upgrade from a
 * version that derived it from the key alone (migration 0003) and across a rotation of the secret.
 */
import { createHmac, randomBytes, randomUUID } from 'node:crypto';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Queryable } from '../../src/database.js';
import { isOutboxkitError } from '../../src/errors.js';
import { fingerprintRequest } from '../../src/idempotency/fingerprint.js';
import { executeLeased, type LeaseContext } from '../../src/idempotency/lease.js';
import { operationIdOf, readRecordByOperationId } from '../../src/idempotency/lease-store.js';
import { reconcileUncertain, serveOperation } from '../../src/idempotency/reconcile.js';
import { idempotencyTable } from '../../src/idempotency/store.js';
import { defaultMigrationsFolder, migrate } from '../../src/migrate.js';
import { quoteSchema } from '../../src/schema-name.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { gate } from './lease-harness.js';

const OPERATION = 'create-payment';
const SECRET_A = randomBytes(32);
const SECRET_B = randomBytes(32);

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
});

afterAll(async () => {
  await db?.drop();
});

function request(tenant: string, key: string) {
  const body = '{"amount":10}';
  const fingerprint = fingerprintRequest({ tenant, operation: OPERATION, method: 'POST', body, maxBodyBytes: 1_000 });
  return { tenant, operation: OPERATION, key, fingerprint };
}

/**
 * The documented id of a new record (docs/configuration.md, `operationIdSecret`), computed here
 * independently: hex HMAC-SHA256 under the secret of `outboxkit:operation-id:v1` then tenant,
 * operation and key, each as a 4-byte big-endian UTF-8 length and its bytes.
 */
function keyedId(scope: { tenant: string; operation: string; key: string }, secret: Buffer): string {
  const hmac = createHmac('sha256', secret).update('outboxkit:operation-id:v1');
  for (const field of [scope.tenant, scope.operation, scope.key]) {
    const bytes = Buffer.from(field, 'utf8');
    const length = Buffer.alloc(4);
    length.writeUInt32BE(bytes.length);
    hmac.update(length).update(bytes);
  }
  return hmac.digest('hex');
}

function bodyOf(result: { response: { body: Buffer } }): Record<string, unknown> {
  return JSON.parse(result.response.body.toString('utf8')) as Record<string, unknown>;
}

/** A copy of the shipped migrations/ that ends at `tag`: the tables as an earlier version made them. */
function migrationsUpTo(tag: string): string {
  const folder = mkdtempSync(path.join(tmpdir(), 'outboxkit-mig-'));
  cpSync(defaultMigrationsFolder(), folder, { recursive: true });
  const file = path.join(folder, 'meta', '_journal.json');
  const journal = JSON.parse(readFileSync(file, 'utf8')) as { entries: { tag: string }[] };
  journal.entries = journal.entries.slice(0, journal.entries.findIndex((e) => e.tag === tag) + 1);
  writeFileSync(file, JSON.stringify(journal));
  return folder;
}

/** Every node of an `EXPLAIN (FORMAT JSON)` plan, depth first. */
function planNodes(node: Record<string, unknown>): Record<string, unknown>[] {
  const children = (node.Plans as Record<string, unknown>[] | undefined) ?? [];
  return [node, ...children.flatMap(planNodes)];
}

describe('the operation resource at 200,000 records of one tenant and operation', () => {
  const SCHEMA = 'before_ids';
  const ROWS = 200_000;
  const table = idempotencyTable(quoteSchema(SCHEMA));

  beforeAll(async () => {
    // The tables as the version before stored ids made them, filled with 200,000 records of one
    // tenant and operation in one statement, then upgraded.
    const folder = migrationsUpTo('0001_consumer_progress');
    try {
      await migrate({ connectionString: db.url, schema: SCHEMA, migrationsFolder: folder });
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }
    await db.pool.query(
      `INSERT INTO ${table} (tenant, operation, key, fingerprint, fingerprint_version, state, response_status,
                             response_headers, response_body, completed_at, expires_at)
       SELECT 'tenant-a', $1, 'seed-' || i, '\\x00'::bytea, 1, 'completed', 201, '{}'::jsonb,
              convert_to('{"seed":' || i || '}', 'UTF8'), now(), now() + interval '1 day'
         FROM generate_series(1, $2::int) AS i`,
      [OPERATION, ROWS],
    );
    await migrate({ connectionString: db.url, schema: SCHEMA });
    // As autovacuum would after such a load: the plan below is the one production gets.
    await db.pool.query(`ANALYZE ${table}`);
  }, 120_000);

  it('looks one record up through the (tenant, operation, operation_id) index, not by hashing every key', async () => {
    const id = operationIdOf('seed-123456');
    const statements: { text: string; values: readonly unknown[] }[] = [];
    const recording: Queryable = {
      async query<R>(text: string, values: readonly unknown[] = []) {
        statements.push({ text, values });
        const r = await db.pool.query(text, values as unknown[]);
        return { rows: r.rows as R[], rowCount: r.rowCount ?? r.rows.length };
      },
    };
    const record = await readRecordByOperationId(recording, table, {
      tenant: 'tenant-a',
      operation: OPERATION,
      operationId: id,
    });
    expect(record?.state).toBe('completed');
    expect(statements).toHaveLength(1);
    const { text, values } = statements[0]!;
    const { rows } = await db.pool.query<{ 'QUERY PLAN': [{ Plan: Record<string, unknown> }] }>(
      `EXPLAIN (FORMAT JSON) ${text}`,
      values as unknown[],
    );
    const nodes = planNodes(rows[0]!['QUERY PLAN'][0].Plan);
    expect(nodes.map((n) => n['Node Type'])).not.toContain('Seq Scan');
    expect(nodes.map((n) => n['Index Name'])).toContain('idempotency_keys_operation_id_idx');
    expect(JSON.stringify(nodes)).not.toContain('sha256');
    expect(record?.operationId).toBe(id);

    // A loose bound (a loaded 2-core machine): hashing 200,000 keys took 240-460 ms per lookup.
    const started = performance.now();
    for (let i = 1; i <= 20; i++) {
      const got = await serveOperation(
        db.pool,
        { tenant: 'tenant-a', operation: OPERATION, operationId: operationIdOf(`seed-${i * 9_973}`) },
        { schema: SCHEMA },
      );
      expect(got.status).toBe(201);
    }
    expect(performance.now() - started).toBeLessThan(3_000);
  });

  it('records claimed before the upgrade keep their Location URL (the SHA-256 of the key); another tenant gets 404', async () => {
    const id = operationIdOf('seed-42');
    const got = await serveOperation(
      db.pool,
      { tenant: 'tenant-a', operation: OPERATION, operationId: id },
      { schema: SCHEMA },
    );
    expect(got.status).toBe(201);
    expect(got.headers['idempotent-replayed']).toBe('true');
    expect(got.body.toString('utf8')).toBe('{"seed":42}');
    const other = await serveOperation(
      db.pool,
      { tenant: 'tenant-b', operation: OPERATION, operationId: id },
      { schema: SCHEMA },
    );
    expect(other.status).toBe(404);
    // Every record got its id; a second run of the backfill changes nothing.
    const { rows } = await db.pool.query<{ missing: number }>(
      `SELECT count(*) FILTER (WHERE operation_id IS NULL)::int AS missing FROM ${table}`,
    );
    expect(rows[0]!.missing).toBe(0);
  });

  it('a record claimed after the upgrade gets a keyed id, found through the index as well', async () => {
    const key = randomUUID();
    const result = await executeLeased(db.pool, request('tenant-a', key), async (ctx) => ctx.uncertain('timeout'), {
      schema: SCHEMA,
      operationIdSecret: SECRET_A,
    });
    const id = bodyOf(result).operationId as string;
    expect(id).toBe(keyedId({ tenant: 'tenant-a', operation: OPERATION, key }, SECRET_A));
    const got = await serveOperation(
      db.pool,
      { tenant: 'tenant-a', operation: OPERATION, operationId: id },
      { schema: SCHEMA },
    );
    expect(got.status).toBe(202);
    expect(JSON.parse(got.body.toString('utf8'))).toEqual({ operationId: id, state: 'uncertain' });
  });
});

describe('operationId: an HMAC under operationIdSecret, stored by the claim', () => {
  it('differs per tenant for one key, is not the SHA-256 of the key, and is what Location, 202 bodies, reconciliation and NOTIFY carry', async () => {
    const key = 'order-42'; // short and guessable: its unkeyed hash could be reversed by trying candidates
    const opts = {
      policy: 'async' as const,
      operationLocation: (id: string) => `/ops/${id}`,
      operationIdSecret: SECRET_A,
    };
    const a = await executeLeased(db.pool, request('tenant-a', key), async (ctx) => ctx.uncertain('timeout'), opts);
    const b = await executeLeased(db.pool, request('tenant-b', key), async (ctx) => ctx.uncertain('timeout'), opts);
    const idA = bodyOf(a).operationId as string;
    const idB = bodyOf(b).operationId as string;
    expect(idA).toMatch(/^[0-9a-f]{64}$/);
    expect(idA).toBe(keyedId({ tenant: 'tenant-a', operation: OPERATION, key }, SECRET_A));
    expect(idA).not.toBe(idB);
    expect(idA).not.toBe(operationIdOf(key));
    expect(a.response.headers.location).toBe(`/ops/${idA}`);
    const { rows } = await db.pool.query<{ operation_id: string }>(
      `SELECT operation_id FROM outboxkit.idempotency_keys WHERE tenant = 'tenant-a' AND key = $1`,
      [key],
    );
    expect(rows[0]!.operation_id).toBe(idA);

    // The retry of a pending record gets the same Location; another tenant cannot read it.
    const retry = await executeLeased(db.pool, request('tenant-a', key), async () => ({ status: 201, body: {} }), opts);
    expect(retry.response.headers.location).toBe(`/ops/${idA}`);
    const scope = { tenant: 'tenant-b', operation: OPERATION, operationId: idA };
    expect((await serveOperation(db.pool, scope)).status).toBe(404);

    // Reconciliation sees the stored id and its answer wakes waiters on it.
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    try {
      const payloads: string[] = [];
      listener.on('notification', (m) => payloads.push(m.payload ?? ''));
      await listener.query('LISTEN outboxkit_idempotency');
      const seen: string[] = [];
      await reconcileUncertain(db.pool, OPERATION, async (r) => {
        seen.push(r.operationId);
        return { outcome: 'completed', response: { status: 201, body: { charged: true } } };
      });
      expect(seen.sort()).toEqual([idA, idB].sort());
      await waitFor(() => payloads.length === 2, { timeoutMs: 5_000 });
      expect(payloads.sort()).toEqual([idA, idB].sort());
      expect(payloads).not.toContain(operationIdOf(key));
    } finally {
      await listener.end();
    }
    const done = await serveOperation(db.pool, { tenant: 'tenant-a', operation: OPERATION, operationId: idA });
    expect(done.status).toBe(201);
  });

  it('after a rotation of the secret, records keep their id (also through a takeover); new records get one under the new secret', async () => {
    const key = randomUUID();
    const inHandler = gate();
    const hold = gate();
    const first = executeLeased(
      db.pool,
      request('tenant-a', key),
      async (ctx) => {
        inHandler.open();
        await hold.promise; // stalls past its lease
        return { status: 201, body: { first: ctx.operationId } };
      },
      { leaseMs: 200, operationIdSecret: SECRET_A },
    );
    await inHandler.promise;
    const idA = keyedId({ tenant: 'tenant-a', operation: OPERATION, key }, SECRET_A);

    // The application now runs with SECRET_B; the lease expires and a retry takes over.
    let takeover: LeaseContext<pg.Pool> | undefined;
    await waitFor(
      async () => {
        const r = await executeLeased(
          db.pool,
          request('tenant-a', key),
          async (ctx) => {
            takeover = ctx;
            return { status: 201, body: {} };
          },
          { leaseMs: 200, operationIdSecret: SECRET_B },
        ).catch((err: unknown) =>
          isOutboxkitError(err, 'OUTBOXKIT_KEY_IN_PROGRESS') ? undefined : Promise.reject(err),
        );
        return r?.outcome === 'executed';
      },
      { timeoutMs: 10_000 },
    );
    expect(takeover!.generation).toBe(2);
    expect(takeover!.operationId).toBe(idA);
    hold.open();
    expect(isOutboxkitError(await first.catch((e: unknown) => e), 'OUTBOXKIT_LEASE_LOST')).toBe(true);
    expect((await serveOperation(db.pool, { tenant: 'tenant-a', operation: OPERATION, operationId: idA })).status).toBe(
      201,
    );

    const fresh = randomUUID();
    let freshId: string | undefined;
    await executeLeased(
      db.pool,
      request('tenant-a', fresh),
      async (ctx) => {
        freshId = ctx.operationId;
        return { status: 201, body: {} };
      },
      { operationIdSecret: SECRET_B },
    );
    expect(freshId).toBe(keyedId({ tenant: 'tenant-a', operation: OPERATION, key: fresh }, SECRET_B));
  });
});
