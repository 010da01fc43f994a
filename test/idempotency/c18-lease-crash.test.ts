/**
 * C18 · the server dies mid-request in lease mode: a REAL child process is killed (SIGKILL) while
 * its handler runs, after its claim committed. 409 while the lease is live; after the lease the
 * retry takes over under a new owner token and runs; the dead owner's token completes nothing.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { joinTransaction, runTransaction, type TransactionHandle } from '../../src/database.js';
import { finishLease, leaseChannel } from '../../src/idempotency/lease-store.js';
import { idempotencyTable } from '../../src/idempotency/store.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import { countOrders, post, ORDERS_TABLE_SQL, type TestApp } from './harness.js';
import { closeLeaseApps, OPERATION, readLease, startLeaseApp } from './lease-harness.js';

const FIXTURE = fileURLToPath(new URL('./fixtures/lease-crash-server.ts', import.meta.url));
const LEASE_MS = 1_500;

let db: TestDatabase;
let child: ChildProcess | undefined;

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterEach(async () => {
  expect(await closeLeaseApps(), 'a test left an app open').toBe(0);
});

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  await closeLeaseApps();
  await db?.drop();
});

describe('C18 server killed mid-request (lease mode, claim committed)', () => {
  it('409 while the lease is live; after it the retry takes over with a new token and runs; the dead owner cannot complete', async () => {
    const proc = spawn(process.execPath, ['--import', 'tsx', FIXTURE], {
      env: { ...process.env, TEST_DATABASE_URL: db.url, LEASE_MS: String(LEASE_MS) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child = proc;
    let stdout = '';
    let stderr = '';
    proc.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
    proc.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<NodeJS.Signals | null>((resolve) => proc.on('exit', (_c, signal) => resolve(signal)));
    const url = (await waitFor(() => /LISTENING (\S+)/.exec(stdout)?.[1], {
      timeoutMs: 30_000,
      message: `child did not start: ${stderr}`,
    })) as string;
    const remote: TestApp = { url, calls: { total: 0, byOperation: {} }, close: async () => {} };

    const key = randomUUID();
    const body = '{"amount":10}';
    const inFlight = post(remote, '/payments', { key, body }).then(
      () => 'answered',
      () => 'connection lost',
    );
    const deadToken = (await waitFor(() => /IN_HANDLER (\S+)/.exec(stdout)?.[1], { timeoutMs: 10_000 })) as string;
    proc.kill('SIGKILL');
    expect(await exited).toBe('SIGKILL');
    expect(await inFlight).toBe('connection lost');

    // The claim committed before the handler ran: the record survives the crash, with its lease.
    expect(await readLease(db.pool, key)).toMatchObject({
      state: 'processing',
      generation: 1,
      owner_token: deadToken,
      lease_live: true,
    });
    expect(await countOrders(db.pool)).toBe(1); // the fenced write the dead owner committed

    // A restarted server; the client retries at once: 409 with Retry-After while the lease is live.
    const app = await startLeaseApp({ pool: db.pool, leaseMs: LEASE_MS });
    const early = await post(app, '/payments', { key, body });
    expect(early.status).toBe(409);
    expect(early.json()).toMatchObject({ code: 'OUTBOXKIT_KEY_IN_PROGRESS' });
    expect(Number(early.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(app.calls.total).toBe(0);

    // After the lease: the retry takes over under a new token (generation 2) and runs.
    await waitFor(async () => !(await readLease(db.pool, key))!.lease_live, { timeoutMs: 10_000 });
    const late = await post(app, '/payments', { key, body });
    expect(late.status).toBe(201);
    expect(late.headers.get('idempotent-replayed')).toBeNull();
    expect(app.calls.total).toBe(1);
    const record = await readLease(db.pool, key);
    expect(record).toMatchObject({ state: 'completed', generation: 2, response_status: 201 });
    expect(record!.owner_token).not.toBe(deadToken);

    // The dead owner "wakes up" (its token replayed against the store): zero rows change.
    const scope = { tenant: 'tenant-a', operation: OPERATION, key };
    const changed = await runTransaction(db.pool, (tx) =>
      finishLease(
        joinTransaction(tx as TransactionHandle, 'test'),
        { table: idempotencyTable('"outboxkit"'), channel: leaseChannel('outboxkit'), scope, ownerToken: deadToken },
        { state: 'completed', status: 200, headers: {}, body: Buffer.from('{"stale":true}'), retentionMs: 60_000 },
      ),
    );
    expect(changed).toBe(false);
    expect(await readLease(db.pool, key)).toEqual(record);

    const replay = await post(app, '/payments', { key, body });
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
    expect(replay.bytes.equals(late.bytes)).toBe(true);
    await app.close();
  });
});
