/**
 * Wake-ups for duplicates waiting on a leased key (policy `wait`): one LISTEN connection per
 * (pool, channel), shared by every waiter of the process, opened on the first waiter and closed
 * after the last. The connection is a `pg.Client` of its own, outside the pool, so that waiting
 * duplicates never take pooled connections from the requests they wait for.
 *
 * Notifications are only a shortcut: waiters also poll on a bounded interval, so a lost
 * notification (the listener reconnecting, a drizzle database without a pg pool) costs latency,
 * never correctness.
 */
import pg from 'pg';
import type { Logger } from '../logger.js';

interface Listener {
  client: pg.Client;
  waiters: Map<string, Set<() => void>>;
  refs: number;
}

const listeners = new WeakMap<object, Map<string, Promise<Listener | undefined>>>();

/** The `pg.Pool` behind `db` (a pool, or a drizzle node-postgres database), if there is one. */
function poolOf(db: unknown): pg.Pool | undefined {
  const candidate = (db as { $client?: unknown }).$client ?? db;
  if (candidate instanceof pg.Pool) return candidate;
  const c = candidate as { options?: unknown; totalCount?: unknown; connect?: unknown };
  return typeof c.options === 'object' && typeof c.totalCount === 'number' && typeof c.connect === 'function'
    ? (candidate as pg.Pool)
    : undefined;
}

async function open(pool: pg.Pool, channel: string, logger: Logger): Promise<Listener | undefined> {
  const client = new pg.Client((pool as unknown as { options: pg.ClientConfig }).options);
  const listener: Listener = { client, waiters: new Map(), refs: 0 };
  client.on('error', (err) => logger.warn({ err, channel }, 'idempotency listener connection failed'));
  client.on('notification', (msg) => {
    if (msg.channel !== channel || msg.payload === undefined) return;
    const set = listener.waiters.get(msg.payload);
    if (set) for (const wake of set) wake();
  });
  try {
    await client.connect();
    // The channel is `<schema>_idempotency`, built from a validated schema name: safe to quote.
    await client.query(`LISTEN "${channel}"`);
    return listener;
  } catch (err) {
    logger.warn({ err, channel }, 'idempotency listener unavailable; waiting by polling only');
    client.end().catch(() => {});
    return undefined;
  }
}

/** A subscription to the notifications of one record. */
export interface Subscription {
  /**
   * Resolves at the next notification of the record, after `timeoutMs`, or when `signal` aborts,
   * whichever first (at once when it is already aborted).
   */
  next(timeoutMs: number, signal?: AbortSignal): Promise<void>;
  /** Ends the subscription (closes the shared connection after the last one). */
  close(): Promise<void>;
}

/**
 * Subscribes to the notifications of the record `operationId` on `channel`. Without a pg pool
 * behind `db`, or when LISTEN fails, `next()` is a plain bounded sleep (polling only).
 */
export async function subscribe(
  db: unknown,
  channel: string,
  operationId: string,
  logger: Logger,
): Promise<Subscription> {
  const pool = poolOf(db);
  let listener: Listener | undefined;
  let byChannel: Map<string, Promise<Listener | undefined>> | undefined;
  if (pool) {
    byChannel = listeners.get(pool);
    if (!byChannel) listeners.set(pool, (byChannel = new Map()));
    let pending = byChannel.get(channel);
    if (!pending) byChannel.set(channel, (pending = open(pool, channel, logger)));
    listener = await pending;
    // Closed by its last user while this one was waiting for it: poll only.
    if (byChannel.get(channel) !== pending) listener = undefined;
    else if (!listener) byChannel.delete(channel);
  }
  let wake: (() => void) | undefined;
  let notified = false;
  // A notification that arrives between two next() calls is kept, not lost.
  const onNotify = () => {
    if (wake) wake();
    else notified = true;
  };
  if (listener) {
    listener.refs++;
    let set = listener.waiters.get(operationId);
    if (!set) listener.waiters.set(operationId, (set = new Set()));
    set.add(onNotify);
  }
  return {
    next(timeoutMs: number, signal?: AbortSignal): Promise<void> {
      if (notified) {
        notified = false;
        return Promise.resolve();
      }
      if (signal?.aborted) return Promise.resolve();
      return new Promise<void>((resolve) => {
        const timer = setTimeout(done, Math.max(0, timeoutMs));
        signal?.addEventListener('abort', done, { once: true });
        function done() {
          clearTimeout(timer);
          signal?.removeEventListener('abort', done);
          wake = undefined;
          resolve();
        }
        wake = done;
      });
    },
    async close(): Promise<void> {
      if (!listener || !byChannel) return;
      const set = listener.waiters.get(operationId);
      set?.delete(onNotify);
      if (set?.size === 0) listener.waiters.delete(operationId);
      if (--listener.refs === 0) {
        byChannel.delete(channel);
        await listener.client.end().catch(() => {});
      }
    },
  };
}
