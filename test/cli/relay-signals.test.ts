/**
 * The relay daemon's shutdown (cli/commands/relay.ts): the first SIGTERM/SIGINT drains and releases
 * the lanes; the same signal delivered twice at once (Ctrl-C under `npm run`: the terminal signals
 * the whole process group and npm forwards it) is still one request to drain, not the operator's
 * second signal that forces exit with the lanes held.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { spawnRelay } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

/** Lanes held by a live owner. */
async function heldLanes(): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    `SELECT count(*)::int AS n FROM outboxkit.relay_lanes WHERE owner_id IS NOT NULL AND lease_expires_at > now()`,
  );
  return rows[0]!.n;
}

describe('relay daemon signals', () => {
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    it(`${signal} twice within a few ms: one drain, exit 0, every lane released`, async () => {
      const relay = spawnRelay(db.url, {}, ['--log-level', 'debug']);
      await waitFor(async () => ((await heldLanes()) === 64 ? true : undefined), {
        message: () => `the relay holds every lane (${relay.output.join('').slice(-2000)})`,
      });
      // The drain's release of the lanes waits behind this lock, so that the second signal comes
      // while the relay is still draining, however fast this machine is (without it, a drain of a
      // few ms could end before the second signal is handled).
      const blocker = await db.pool.connect();
      try {
        await blocker.query('BEGIN');
        await blocker.query('LOCK TABLE outboxkit.relay_lanes IN ACCESS EXCLUSIVE MODE');
        relay.proc.kill(signal);
        await new Promise((r) => setTimeout(r, 5));
        relay.proc.kill(signal);
        await waitFor(() => (relay.output.join('').includes('still draining') ? true : undefined), {
          timeoutMs: 10_000,
          message: () => `the repeated signal is seen while draining (${relay.output.join('').slice(-2000)})`,
        });
      } finally {
        await blocker.query('ROLLBACK');
        blocker.release();
      }
      const exit = await relay.exited;
      const output = relay.output.join('');
      expect(exit, output.slice(-2000)).toEqual({ code: 0, signal: null });
      expect(output).toContain('"msg":"draining"');
      expect(output).toContain('still draining');
      expect(output).not.toContain('second signal');
      expect(await heldLanes()).toBe(0);
    });
  }
});
