/**
 * Test-only crash points. When the environment variable `OUTBOXKIT_CRASH_POINT` names a point
 * (for example `relay:after-send`: the broker acknowledged a batch, the rows are not marked yet),
 * the process kills itself with SIGKILL when it gets there, like a power cut. Crash tests and the
 * chaos harness (chaos/, docs/chaos.md) use it; never set it in production.
 * `OUTBOXKIT_CRASH_AFTER=N` crashes at the Nth arrival (default 1).
 * `OUTBOXKIT_CRASH_SIGNAL=SIGSTOP` pauses the process there instead (a long GC pause, a stopped
 * VM): it goes on from that point, once, when the test sends SIGCONT. All three are read once,
 * when this module loads: set them in the environment of the process to crash.
 *
 * Points:
 * - `idempotency:after-claim`: the key is claimed (uncommitted), the handler has not run;
 * - `idempotency:before-commit`: the handler ran and the response is stored, COMMIT not sent;
 * - `idempotency:after-commit`: committed, the HTTP response not sent (Fastify adapter);
 * - `relay:before-send`: a batch is claimed, nothing sent to the broker;
 * - `relay:after-send`: the broker acknowledged the batch, the rows are not marked published;
 * - `consumer:after-commit`: the handler's transaction committed, the offset not yet resolved;
 * - `wal-relay:before-send`: the WAL relay holds a batch of transactions, nothing sent;
 * - `wal-relay:after-send`: Kafka acknowledged the WAL relay's batch, its rows are not deleted
 *   and the slot is not confirmed;
 * - `wal-relay:after-delete`: the batch's rows are deleted, the slot is not confirmed.
 * - `wal-relay:slot-created`: the WAL relay marked a resync pending and created (or found) its
 *   slot; no row of the resync is published yet. The resync's pages go through
 *   `wal-relay:before-send`, `wal-relay:after-send` and `wal-relay:after-delete` too.
 */
const armedPoint = process.env.OUTBOXKIT_CRASH_POINT;
const crashAfter = Number(process.env.OUTBOXKIT_CRASH_AFTER ?? '1');
const pause = process.env.OUTBOXKIT_CRASH_SIGNAL === 'SIGSTOP';
const passed: Promise<void> = Promise.resolve();
let arrivals = 0;

/**
 * Kills this process with SIGKILL if `name` is the armed point (at its Nth arrival), or stops it
 * there with SIGSTOP (at that arrival only). When no point is armed it costs one string comparison
 * (call sites run per request).
 */
export function crashPoint(name: string): Promise<void> {
  if (armedPoint !== name) return passed;
  arrivals++;
  if (arrivals < crashAfter) return passed;
  if (pause) {
    // A signal a process sends itself is delivered before kill() returns: nothing runs past
    // this point until SIGCONT.
    if (arrivals === crashAfter) process.kill(process.pid, 'SIGSTOP');
    return passed;
  }
  process.kill(process.pid, 'SIGKILL');
  // SIGKILL is delivered asynchronously; never run past the crash point meanwhile.
  return new Promise(() => {});
}
