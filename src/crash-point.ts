/**
 * Test-only crash points. When the environment variable `OUTBOXKIT_CRASH_POINT` names a point
 * (for example `relay:after-send`: the broker acknowledged a batch, the rows are not marked yet),
 * the process kills itself with SIGKILL when it gets there, like a power cut. Crash tests and the
 * chaos harness use it; never set it in production. `OUTBOXKIT_CRASH_AFTER=N` crashes at the Nth
 * arrival (default 1).
 *
 * Points: `relay:before-send`, `relay:after-send` (the broker acknowledged, rows not marked),
 * `consumer:after-commit` (the handler's transaction committed, the offset not yet resolved).
 */
let arrivals = 0;

export async function crashPoint(name: string): Promise<void> {
  if (process.env.OUTBOXKIT_CRASH_POINT !== name) return;
  arrivals++;
  if (arrivals < Number(process.env.OUTBOXKIT_CRASH_AFTER ?? '1')) return;
  process.kill(process.pid, 'SIGKILL');
  // SIGKILL is delivered asynchronously; never run past the crash point meanwhile.
  await new Promise(() => {});
}
