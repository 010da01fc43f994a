/**
 * The idempotent client's request body: text and bytes as given, JSON values as JSON, and what
 * JSON.stringify would silently change refused before anything is sent (another logical operation
 * must never run under the key). A recording `fetch` stands in for the network: pure logic.
 */
import { describe, expect, it } from 'vitest';
import { createIdempotentClient } from '../../../src/client/index.js';
import { isOutboxkitError } from '../../../src/errors.js';

function recordingClient() {
  const sent: Uint8Array[] = [];
  const client = createIdempotentClient({
    baseUrl: 'http://127.0.0.1:1',
    fetch: async (_input, init) => {
      const body = init?.body;
      sent.push(typeof body === 'string' ? new TextEncoder().encode(body) : new Uint8Array(body as Uint8Array));
      return new Response('{"ok":true}', { status: 201, headers: { 'content-type': 'application/json' } });
    },
  });
  return { client, sent };
}

describe('idempotent client: request bodies', () => {
  it('sends text, bytes and the bytes of an ArrayBuffer, a typed array or a DataView as given', async () => {
    const { client, sent } = recordingClient();
    const floats = new Float32Array([1.5]);
    await client.post('/x', 'plain');
    await client.post('/x', Buffer.from([1, 2]));
    await client.post('/x', new Uint8Array([3]).buffer);
    await client.post('/x', floats);
    await client.post('/x', new DataView(new Uint8Array([9, 8, 7]).buffer, 1, 2));
    await client.post('/x', { a: [1, 'b', null], at: new Date('2026-11-30T00:00:00Z') });
    expect(sent.map((b) => [...b])).toEqual([
      [...new TextEncoder().encode('plain')],
      [1, 2],
      [3],
      [...new Uint8Array(floats.buffer)],
      [8, 7],
      [...new TextEncoder().encode('{"a":[1,"b",null],"at":"2026-11-30T00:00:00.000Z"}')],
    ]);
  });

  it.each([
    ['a Blob', () => new Blob(['{"a":1}'])],
    ['URLSearchParams', () => new URLSearchParams('a=1')],
    ['FormData', () => new FormData()],
    ['a Map', () => new Map([['a', 1]])],
    ['NaN inside an object', () => ({ amount: Number.NaN })],
    ['a Set inside an array', () => [new Set([1])]],
    ['an invalid Date', () => ({ at: new Date('nope') })],
    ['a BigInt', () => ({ n: 1n })],
  ])('refuses %s with InvalidOptionsError before sending anything', async (_, body) => {
    const { client, sent } = recordingClient();
    const err = await client.post('/x', body()).catch((e: unknown) => e);
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS'), String(err)).toBe(true);
    expect(sent).toHaveLength(0);
  });
});
