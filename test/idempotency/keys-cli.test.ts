/**
 * `outboxkit keys list|cleanup` run as a real process against the real PostgreSQL: keys are never
 * printed in full; cleanup deletes only expired completed/failed records, in bounded batches.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { operationIdOf } from '../../src/idempotency/lease-store.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { spawnCli } from '../helpers/processes.js';

let db: TestDatabase;
const keys = { uncertain: randomUUID(), processing: randomUUID(), otherTenant: randomUUID() };

beforeAll(async () => {
  db = await createTestDatabase();
  const insert = (tenant: string, op: string, key: string, state: string, expired: boolean) =>
    db.pool.query(
      // operation_id: the id a record claimed before ids were keyed holds (migration 0003).
      `INSERT INTO outboxkit.idempotency_keys (tenant, operation, key, fingerprint, fingerprint_version, state, expires_at, response_body, operation_id)
       VALUES ($1, $2, $3, '\\x00'::bytea, 1, $4, now() + CASE WHEN $5 THEN interval '-1 hour' ELSE interval '1 hour' END, 'payment provider timeout',
               encode(sha256(convert_to($3, 'UTF8')), 'hex'))`,
      [tenant, op, key, state, expired],
    );
  await insert('t1', 'create-payment', keys.uncertain, 'uncertain', true);
  await insert('t2', 'create-payment', keys.otherTenant, 'uncertain', false);
  await insert('t1', 'create-payment', keys.processing, 'processing', true);
  for (let i = 0; i < 5; i++) await insert('t1', 'create-order', `done-${i}-${randomUUID()}`, 'completed', true);
  await insert('t1', 'create-order', randomUUID(), 'failed', false);
});

afterAll(async () => {
  await db?.drop();
});

/** `out` is stdout (what a caller parses); `both` adds stderr (where a leak would also count). */
async function cli(args: string[]): Promise<{ code: number | null; out: string; both: string }> {
  const run = spawnCli([...args, '--database-url', db.url]);
  const { code } = await run.exited;
  return { code, out: run.stdout.join(''), both: run.output.join('') };
}

describe('outboxkit keys list', () => {
  it('lists one state with tenant/operation filters, as JSON, with redacted keys and the operation id', async () => {
    const { code, out, both } = await cli(['keys', 'list', '--state', 'uncertain', '--tenant', 't1', '--json']);
    expect(code).toBe(0);
    const rows = JSON.parse(out) as Record<string, unknown>[];
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({
      tenant: 't1',
      operation: 'create-payment',
      state: 'uncertain',
      operationId: operationIdOf(keys.uncertain),
    });
    expect(rows[0]!.key).toMatch(/…\(36\)$/);
    expect(both).not.toContain(keys.uncertain);
  });

  it('prints text lines without any full key; --limit bounds the rows', async () => {
    const all = await cli(['keys', 'list', '--state', 'uncertain']);
    expect(all.code).toBe(0);
    expect(all.out.trim().split('\n')).toHaveLength(2);
    for (const k of Object.values(keys)) expect(all.both).not.toContain(k);
    const one = await cli(['keys', 'list', '--state', 'completed', '--operation', 'create-order', '--limit', '2']);
    expect(one.out.trim().split('\n')).toHaveLength(2);
    const bad = await cli(['keys', 'list', '--state', 'stuck']);
    expect(bad.code).not.toBe(0);
  });
});

describe('outboxkit keys cleanup', () => {
  it('deletes expired completed/failed records only, in bounded batches', async () => {
    const first = await cli(['keys', 'cleanup', '--batch-size', '2', '--max-batches', '2']);
    expect(first.code).toBe(0);
    expect(first.out).toContain('deleted 4 ');
    const second = await cli(['keys', 'cleanup']);
    expect(second.out).toContain('deleted 1 ');
    const { rows } = await db.pool.query<{ state: string; n: number }>(
      'SELECT state, count(*)::int AS n FROM outboxkit.idempotency_keys GROUP BY state ORDER BY state',
    );
    expect(rows).toEqual([
      { state: 'failed', n: 1 },
      { state: 'processing', n: 1 },
      { state: 'uncertain', n: 2 },
    ]);
  });
});
