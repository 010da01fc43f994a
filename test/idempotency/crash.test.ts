/**
 * G2 · the server process dies (SIGKILL) while the handler runs, before COMMIT: nothing of the
 * request survives (no business row, no idempotency record), and the retry executes.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  closeAll,
  countOrders,
  countRecords,
  ORDERS_TABLE_SQL,
  post,
  readRecords,
  startApp,
  type TestApp,
} from './harness.js';

const FIXTURE = fileURLToPath(new URL('./fixtures/crash-server.ts', import.meta.url));

let db: TestDatabase;
let child: ChildProcess | undefined;

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(ORDERS_TABLE_SQL);
});

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  await closeAll();
  await db?.drop();
});

describe('G2 crash before commit (SIGKILL of the server process)', () => {
  it('leaves no business row and no record; the retry with the same key executes once', async () => {
    const proc = spawn(process.execPath, ['--import', 'tsx', FIXTURE], {
      env: { ...process.env, TEST_DATABASE_URL: db.url },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child = proc;
    let stdout = '';
    let stderr = '';
    proc.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
    proc.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<NodeJS.Signals | null>((resolve) => proc.on('exit', (_code, signal) => resolve(signal)));

    const url = (await waitFor(() => /LISTENING (\S+)/.exec(stdout)?.[1], {
      timeoutMs: 30_000,
      message: `child did not start: ${stderr}`,
    })) as string;
    const remote: TestApp = { url, calls: { total: 0, byOperation: {} }, close: async () => {} };
    const key = randomUUID();
    const inFlight = post(remote, '/orders', { key, body: '{"amount":10}' }).then(
      () => 'answered',
      () => 'connection lost',
    );
    await waitFor(() => stdout.includes('IN_HANDLER'), { timeoutMs: 10_000 });
    // The claim and the row exist only inside the open transaction: invisible to others.
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);

    proc.kill('SIGKILL');
    expect(await exited).toBe('SIGKILL');
    expect(await inFlight).toBe('connection lost');

    // PostgreSQL rolls the dead session's transaction back once it sees the socket close.
    await waitFor(
      async () => {
        const { rows } = await db.pool.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`,
        );
        return rows[0]!.n === 0;
      },
      { timeoutMs: 10_000, message: 'the killed session is still in its transaction' },
    );
    expect(await countOrders(db.pool)).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);

    // The retry (a restarted server) claims the key and executes.
    const app = await startApp({ pool: db.pool });
    const retry = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(retry.status).toBe(201);
    expect(retry.headers.get('idempotent-replayed')).toBeNull();
    expect(app.calls.total).toBe(1);
    expect(await countOrders(db.pool)).toBe(1);
    expect((await readRecords(db.pool, key))[0]).toMatchObject({ state: 'completed', generation: 1 });
    const replay = await post(app, '/orders', { key, body: '{"amount":10}' });
    expect(replay.bytes.equals(retry.bytes)).toBe(true);
    await app.close();
  });
});
