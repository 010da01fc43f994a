/**
 * A load generator with the faults real clients produce: requests aborted before the response
 * and retried with the same key, concurrent duplicate sends, and keys reused with another body.
 * Every logical order is retried until it gets an answer, as a careful client would.
 */
import { randomUUID } from 'node:crypto';

/** Counters of one load run. */
export interface LoadStats {
  requests: number;
  created: number;
  replays: number;
  conflicts409: number;
  mismatches422: number;
  aborted: number;
  otherErrors: number;
  /** Keys that got a 201 (the orders that must exist), with their order ids. */
  accepted: Map<string, string>;
  /** What the client saw that breaks the contract (a replay that differs, a reuse not refused). */
  violations: string[];
}

export interface LoadOptions {
  baseUrl: string;
  orders: number;
  concurrency: number;
  tenants: string[];
  /** Share of orders whose first attempt is aborted early (0-1). */
  abortRate: number;
  /** Share of orders sent as 2-3 concurrent duplicates (0-1). */
  duplicateRate: number;
  /** Share of orders whose key is then reused with a different body (0-1). */
  reuseRate: number;
  /** Stop retrying a logical order after this long, in ms. */
  deadlineMs: number;
}

interface Attempt {
  status: number | 'aborted' | 'error';
  replayed: boolean;
  body: string;
}

function newStats(): LoadStats {
  return {
    requests: 0,
    created: 0,
    replays: 0,
    conflicts409: 0,
    mismatches422: 0,
    aborted: 0,
    otherErrors: 0,
    accepted: new Map(),
    violations: [],
  };
}

async function post(
  stats: LoadStats,
  o: LoadOptions,
  tenant: string,
  key: string,
  body: unknown,
  timeoutMs?: number,
): Promise<Attempt> {
  stats.requests++;
  try {
    const res = await fetch(`${o.baseUrl}/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-tenant-id': tenant },
      body: JSON.stringify(body),
      signal: timeoutMs === undefined ? AbortSignal.timeout(10_000) : AbortSignal.timeout(timeoutMs),
    });
    const text = await res.text();
    const replayed = res.headers.get('idempotent-replayed') === 'true';
    if (res.status === 201 && replayed) stats.replays++;
    else if (res.status === 201) stats.created++;
    else if (res.status === 409) stats.conflicts409++;
    else if (res.status === 422) stats.mismatches422++;
    else stats.otherErrors++;
    return { status: res.status, replayed, body: text };
  } catch (err) {
    const aborted = (err as Error).name === 'TimeoutError' || (err as Error).name === 'AbortError';
    if (aborted) stats.aborted++;
    else stats.otherErrors++;
    return { status: aborted ? 'aborted' : 'error', replayed: false, body: '' };
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Sends one logical order until it is answered with 201 (fresh or replayed). */
async function oneOrder(stats: LoadStats, o: LoadOptions, i: number, firstBodies: Map<string, string>): Promise<void> {
  const tenant = o.tenants[i % o.tenants.length]!;
  const key = randomUUID();
  const body = { cartId: `cart-${i}`, currency: 'EUR', amount: 100 + (i % 900) };
  const deadline = Date.now() + o.deadlineMs;
  const r = Math.random();
  let attempts: Attempt[];
  if (r < o.abortRate) {
    // The client gives up before the answer: the server may or may not have committed.
    attempts = [await post(stats, o, tenant, key, body, 1 + Math.floor(Math.random() * 5))];
  } else if (r < o.abortRate + o.duplicateRate) {
    const n = 2 + Math.floor(Math.random() * 2);
    attempts = await Promise.all(Array.from({ length: n }, () => post(stats, o, tenant, key, body)));
  } else {
    attempts = [await post(stats, o, tenant, key, body)];
  }
  let backoff = 20;
  while (!attempts.some((a) => a.status === 201)) {
    if (Date.now() > deadline) return;
    await sleep(Math.floor(Math.random() * backoff));
    backoff = Math.min(backoff * 2, 1_000);
    attempts = [await post(stats, o, tenant, key, body)];
  }
  const fresh = attempts.filter((a) => a.status === 201);
  const first = fresh[0]!;
  const orderId = (JSON.parse(first.body) as { orderId: string }).orderId;
  stats.accepted.set(`${tenant}/${key}`, orderId);
  const known = firstBodies.get(`${tenant}/${key}`);
  for (const a of fresh) {
    if (a.body !== (known ?? first.body)) stats.violations.push(`${key}: two different 201 bodies`);
  }
  firstBodies.set(`${tenant}/${key}`, known ?? first.body);
  // A retry after success must replay the same bytes.
  const again = await post(stats, o, tenant, key, body);
  if (again.status !== 201 || !again.replayed || again.body !== firstBodies.get(`${tenant}/${key}`)) {
    stats.violations.push(`${key}: a retry after success was not a byte-identical replay (${again.status})`);
  }
  if (Math.random() < o.reuseRate) {
    // The same key with another body must be refused (422), never answered with the first result.
    const reused = await post(stats, o, tenant, key, { ...body, amount: body.amount + 1 });
    if (reused.status !== 422)
      stats.violations.push(`${key}: reuse with another body answered ${reused.status}, not 422`);
  }
}

/** Runs the load and returns its counters. */
export async function runLoad(options: LoadOptions): Promise<LoadStats> {
  const stats = newStats();
  const firstBodies = new Map<string, string>();
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < options.orders; i = next++) await oneOrder(stats, options, i, firstBodies);
  };
  await Promise.all(Array.from({ length: options.concurrency }, worker));
  return stats;
}
