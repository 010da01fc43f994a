/**
 * The chaos harness's load: new logical requests at a steady rate (open loop, so that a dead
 * orders service piles requests up as real traffic would), each sent through outboxkit's
 * idempotent client, with the faults real clients add: a first attempt abandoned after 1-5 ms and
 * retried with the same key, 2-3 concurrent duplicates, a retry after the answer (must replay),
 * and the key reused with another body (must be 422).
 */
import { randomUUID } from 'node:crypto';
import { setMaxListeners } from 'node:events';
import { createIdempotentClient, type IdempotentClient } from '../src/client/index.js';
import { FINAL_STATUSES, type Operation } from './check.js';
import type { Ledger } from './ledger.js';
import type { Random } from './random.js';

/** Cart id prefixes the orders example treats specially (examples/orders/server.ts, shipping.ts). */
const DECLINED = 'declined-';
const UNDELIVERABLE = 'undeliverable-';

export interface LoadOptions {
  baseUrl: string;
  ledger: Ledger;
  random: Random;
  /** New logical requests per second. */
  rate: number;
  /** The load stops starting new requests when this is aborted (the end of the fault phase). */
  signal: AbortSignal;
  /**
   * Once the load stopped, how long the operations in flight may go on, in ms; then they are
   * abandoned (their clients give up) and the final retries take them over. @defaultValue 10_000
   */
  stopGraceMs?: number;
  /** Customers (Kafka keys with several events, whose order is checked). */
  customers: number;
  /** Most logical requests in flight; beyond it a new one waits (counted as throttled). */
  maxInFlight: number;
}

/** Counters of the client-side faults (they come on top of the scheduled ones). */
export interface LoadStats {
  operations: number;
  declined: number;
  undeliverable: number;
  abandonedFirstAttempts: number;
  concurrentDuplicates: number;
  replayChecks: number;
  reusedKeys: number;
  /** Operations the client gave up on during the load (retried at the end). */
  gaveUp: number;
  throttled: number;
}

const TENANTS = ['tenant-a', 'tenant-b', 'tenant-c'];

/** The client of the harness: patient (the service may be down for seconds), recording every attempt. */
export function chaosClient(baseUrl: string, ledger: Ledger): IdempotentClient {
  return createIdempotentClient({
    baseUrl,
    fetch: ledger.fetch(),
    maxAttempts: 100,
    deadlineMs: 60_000,
    initialDelayMs: 50,
    maxDelayMs: 2_000,
    // Clients time out and retry with the same key: a slow answer is abandoned after 5 s.
    timeoutMs: 5_000,
    // outboxkit releases the key on 500, so a retry is safe (see IdempotentClientOptions).
    retryStatuses: [408, 409, 425, 429, 500, 502, 503, 504],
  });
}

function isFinal(op: Operation): boolean {
  return op.attempts.some((a) => a.status !== undefined && FINAL_STATUSES.has(a.status));
}

/** Sends `op` through `client` once (all its attempts); the ledger records what came back. */
async function send(
  client: IdempotentClient,
  op: Operation,
  body = op.body,
  extra: { timeoutMs?: number; maxAttempts?: number; signal?: AbortSignal } = {},
): Promise<void> {
  await client
    .post('/orders', body, { idempotencyKey: op.key, headers: { 'x-tenant-id': op.tenant }, ...extra })
    .catch(() => undefined);
}

async function oneOperation(
  client: IdempotentClient,
  o: LoadOptions,
  stats: LoadStats,
  i: number,
  abandon: AbortSignal,
): Promise<void> {
  const r = o.random;
  const x = r.next();
  const prefix = x < 0.04 ? DECLINED : x < 0.05 ? UNDELIVERABLE : '';
  if (prefix === DECLINED) stats.declined++;
  if (prefix === UNDELIVERABLE) stats.undeliverable++;
  const cartId = `${prefix}cart-${i}`;
  const customerId = `customer-${r.int(1, o.customers)}`;
  const body = JSON.stringify({ cartId, currency: 'EUR', amount: 100 + (i % 900), customerId });
  const op = o.ledger.register({ tenant: r.pick(TENANTS), key: randomUUID(), cartId, customerId, body });
  stats.operations++;

  const how = r.next();
  if (how < 0.1) {
    // The client gives up on its first attempt before the answer, then retries with the same key.
    stats.abandonedFirstAttempts++;
    await send(client, op, op.body, { timeoutMs: r.int(1, 5), maxAttempts: 1 });
    await send(client, op, op.body, { signal: abandon });
  } else if (how < 0.15) {
    stats.concurrentDuplicates++;
    await Promise.all(Array.from({ length: r.int(2, 3) }, () => send(client, op, op.body, { signal: abandon })));
  } else {
    await send(client, op, op.body, { signal: abandon });
  }
  if (!isFinal(op)) {
    stats.gaveUp++;
    return;
  }
  if (r.chance(0.25)) {
    stats.replayChecks++;
    await send(client, op, op.body, { signal: abandon });
  }
  if (r.chance(0.03)) {
    stats.reusedKeys++;
    const other = JSON.stringify({ cartId, currency: 'EUR', amount: 1 + (i % 900), customerId });
    await send(client, op, other, { signal: abandon });
  }
}

/** Runs the load until `signal` is aborted and resolves when every operation it started has ended. */
export async function runLoad(o: LoadOptions): Promise<LoadStats> {
  const stats: LoadStats = {
    operations: 0,
    declined: 0,
    undeliverable: 0,
    abandonedFirstAttempts: 0,
    concurrentDuplicates: 0,
    replayChecks: 0,
    reusedKeys: 0,
    gaveUp: 0,
    throttled: 0,
  };
  const client = chaosClient(o.baseUrl, o.ledger);
  const inFlight = new Set<Promise<void>>();
  const abandon = new AbortController();
  // Every operation in flight listens to it (up to maxInFlight): not a leak.
  setMaxListeners(0, abandon.signal);
  const intervalMs = 1_000 / o.rate;
  const started = Date.now();
  for (let i = 0; !o.signal.aborted; i++) {
    while (inFlight.size >= o.maxInFlight) {
      stats.throttled++;
      await Promise.race(inFlight);
    }
    const p = oneOperation(client, o, stats, i, abandon.signal).finally(() => inFlight.delete(p));
    inFlight.add(p);
    const wait = started + (i + 1) * intervalMs - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  }
  const timer = setTimeout(() => abandon.abort(new Error('the load is over')), o.stopGraceMs ?? 10_000);
  await Promise.all(inFlight);
  clearTimeout(timer);
  return stats;
}

/**
 * Retries every logical request that never got a final answer, as a real client would (same key,
 * same body), until each is answered or `timeoutMs` (ms) has passed. Returns how many were retried.
 */
export async function retryUnanswered(baseUrl: string, ledger: Ledger, timeoutMs: number): Promise<number> {
  const client = chaosClient(baseUrl, ledger);
  const pending = () => ledger.all().filter((op) => !isFinal(op));
  const retried = pending().length;
  const deadline = Date.now() + timeoutMs;
  for (let left = pending(); left.length > 0 && Date.now() < deadline; left = pending()) {
    // A few at a time: the service has just been through the faults.
    for (let i = 0; i < left.length; i += 16) await Promise.all(left.slice(i, i + 16).map((op) => send(client, op)));
  }
  return retried;
}
