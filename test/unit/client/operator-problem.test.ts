/**
 * outboxkit's 500 `schema-missing` (its tables are missing: an operator error) is never retried,
 * even by a client whose `retryStatuses` include 500; another 500 still is.
 */
import { describe, expect, it } from 'vitest';
import { createIdempotentClient } from '../../../src/client/client.js';

function fakeFetch(code: string): { fetch: typeof fetch; calls: () => number } {
  let calls = 0;
  const fetchImpl = (async () => {
    calls++;
    return new Response(JSON.stringify({ type: `https://outboxkit.dev/problems/x`, status: 500, code }), {
      status: 500,
      headers: { 'content-type': 'application/problem+json' },
    });
  }) as typeof fetch;
  return { fetch: fetchImpl, calls: () => calls };
}

describe('operator problems', () => {
  it('a 500 schema-missing is not retried even when 500 is in retryStatuses', async () => {
    const f = fakeFetch('OUTBOXKIT_SCHEMA_MISSING');
    const client = createIdempotentClient({
      baseUrl: 'http://127.0.0.1:1',
      fetch: f.fetch,
      retryStatuses: [500, 503],
      maxAttempts: 3,
      initialDelayMs: 1,
    });
    await expect(client.post('/orders', { a: 1 })).rejects.toMatchObject({
      status: 500,
      problem: { code: 'OUTBOXKIT_SCHEMA_MISSING' },
    });
    expect(f.calls()).toBe(1);
  });

  it('another 500 problem is retried when 500 is in retryStatuses', async () => {
    const f = fakeFetch('OUTBOXKIT_INTERNAL');
    const client = createIdempotentClient({
      baseUrl: 'http://127.0.0.1:1',
      fetch: f.fetch,
      retryStatuses: [500],
      maxAttempts: 3,
      initialDelayMs: 1,
      random: () => 0,
    });
    await expect(client.post('/orders', { a: 1 })).rejects.toBeDefined();
    expect(f.calls()).toBe(3);
  });
});
