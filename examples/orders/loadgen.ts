/**
 * A load generator with the faults real clients produce: requests aborted before the response
 * and retried with the same key, concurrent duplicate sends, and keys reused with another body.
 * Every logical order goes through outboxkit's idempotent client (src/client/), which retries it
 * with one key, full-jitter backoff and Retry-After until it gets an answer, within bounds.
 */
import { randomUUID } from 'node:crypto';
import {
  createIdempotentClient,
  isClientError,
  type ClientResponse,
  type IdempotentClient,
  type RequestRejectedError,
} from '../../src/client/index.js';

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
  /** Stop retrying a logical order after this long, in ms (the client's `deadlineMs`). */
  deadlineMs: number;
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

/** Counts one HTTP attempt (the client reports every attempt, retries included). */
function count(stats: LoadStats, status: number | undefined, replayed: boolean, timedOut: boolean): void {
  stats.requests++;
  if (status === 201 && replayed) stats.replays++;
  else if (status === 201) stats.created++;
  else if (status === 409) stats.conflicts409++;
  else if (status === 422) stats.mismatches422++;
  else if (status === undefined && timedOut) stats.aborted++;
  else stats.otherErrors++;
}

/**
 * The fault: a first attempt that the client abandons after 1-5 ms, before the answer (the server
 * may or may not commit it). Sent by hand, outside the client, which would wait for the answer.
 */
async function abandonedAttempt(stats: LoadStats, o: LoadOptions, tenant: string, key: string, body: unknown) {
  try {
    const res = await fetch(`${o.baseUrl}/orders`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key, 'x-tenant-id': tenant },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(1 + Math.floor(Math.random() * 5)),
    });
    await res.arrayBuffer();
    count(stats, res.status, res.headers.get('idempotent-replayed') === 'true', false);
  } catch (err) {
    const name = (err as Error).name;
    count(stats, undefined, false, name === 'TimeoutError' || name === 'AbortError');
  }
}

const utf8 = new TextDecoder();

/** Sends one logical order through the idempotent client until it is answered with 201 (fresh or replayed). */
async function oneOrder(stats: LoadStats, o: LoadOptions, client: IdempotentClient, i: number): Promise<void> {
  const tenant = o.tenants[i % o.tenants.length]!;
  const key = randomUUID();
  const body = { cartId: `cart-${i}`, currency: 'EUR', amount: 100 + (i % 900) };
  const request = { idempotencyKey: key, headers: { 'x-tenant-id': tenant } };
  const r = Math.random();
  let answers: ClientResponse[];
  try {
    if (r < o.abortRate) {
      // The client gives up before the answer, then retries with the same key.
      await abandonedAttempt(stats, o, tenant, key, body);
      answers = [await client.post('/orders', body, request)];
    } else if (r < o.abortRate + o.duplicateRate) {
      // 2-3 concurrent sends of the same operation: one executes, the others get 409 then the replay.
      const n = 2 + Math.floor(Math.random() * 2);
      answers = await Promise.all(Array.from({ length: n }, () => client.post('/orders', body, request)));
    } else {
      answers = [await client.post('/orders', body, request)];
    }
  } catch (err) {
    // Gave up (attempts or deadline): the order is not counted as accepted.
    if (isClientError(err, 'OUTBOXKIT_CLIENT_GAVE_UP')) return;
    if (isClientError(err, 'OUTBOXKIT_CLIENT_REJECTED')) {
      stats.violations.push(`${key}: a valid order was rejected (${err.message})`);
      return;
    }
    throw err;
  }
  const texts = answers.map((a) => utf8.decode(a.body));
  const first = texts[0]!;
  if (answers.some((a) => a.status !== 201) || texts.some((t) => t !== first)) {
    stats.violations.push(`${key}: concurrent sends got different answers`);
  }
  const orderId = (JSON.parse(first) as { orderId: string }).orderId;
  stats.accepted.set(`${tenant}/${key}`, orderId);
  // A retry after success must replay the same bytes.
  try {
    const again = await client.post('/orders', body, request);
    if (again.status !== 201 || !again.replayed || utf8.decode(again.body) !== first) {
      stats.violations.push(`${key}: a retry after success was not a byte-identical replay (${again.status})`);
    }
  } catch (err) {
    stats.violations.push(`${key}: a retry after success failed (${(err as Error).message})`);
  }
  if (Math.random() < o.reuseRate) {
    // The same key with another body must be refused (422) at once, never answered with the first result.
    const reused = await client.post('/orders', { ...body, amount: body.amount + 1 }, request).catch((e: unknown) => e);
    const status = isClientError(reused, 'OUTBOXKIT_CLIENT_REJECTED')
      ? (reused as RequestRejectedError).status
      : ((reused as Partial<ClientResponse>).status ?? String(reused));
    if (status !== 422) stats.violations.push(`${key}: reuse with another body answered ${status}, not 422`);
  }
}

/** Runs the load and returns its counters. */
export async function runLoad(options: LoadOptions): Promise<LoadStats> {
  const stats = newStats();
  const client = createIdempotentClient({
    baseUrl: options.baseUrl,
    // Bounded, but generous enough for the demo's faults: 409s while a duplicate runs, slow commits.
    maxAttempts: 20,
    deadlineMs: options.deadlineMs,
    initialDelayMs: 20,
    maxDelayMs: 1_000,
    timeoutMs: 10_000,
    onAttempt: (e) => count(stats, e.status, e.replayed, e.timedOut),
  });
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < options.orders; i = next++) await oneOrder(stats, options, client, i);
  };
  await Promise.all(Array.from({ length: options.concurrency }, worker));
  return stats;
}
