/**
 * The encode hook's contract (src/outbox/encoding.ts): bytes or { value, contentType }, typed
 * errors for anything else, and the content-type header it leads to.
 */
import { describe, expect, it } from 'vitest';
import { encodeWith } from '../../../src/outbox/encoding.js';
import { completeEvent, prepareEnvelope } from '../../../src/outbox/event.js';
import { InvalidEventError, isOutboxkitError } from '../../../src/errors.js';

const envelope = () => prepareEnvelope({ topic: 'orders', key: 'k', type: 'order.created', payload: null });

async function caught(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => undefined,
    (err: unknown) => err,
  );
}

describe('encodeWith', () => {
  it('accepts a Buffer, a Uint8Array (no copy) and { value, contentType }; sync or async', async () => {
    const env = envelope();
    expect(await encodeWith(() => Buffer.from('x'), 1, env)).toEqual({ value: Buffer.from('x'), contentType: null });
    const bytes = new Uint8Array([0, 1, 2, 3]).subarray(1, 3);
    const { value } = await encodeWith(async () => bytes, 1, env);
    expect([...value]).toEqual([1, 2]);
    expect(value.buffer).toBe(bytes.buffer);
    expect(
      await encodeWith(async () => ({ value: Buffer.from([0]), contentType: 'application/avro' }), 1, env),
    ).toEqual({ value: Buffer.from([0]), contentType: 'application/avro' });
  });

  it('passes the payload and the envelope (topic, type, key, event id) to the encoder', async () => {
    const env = envelope();
    let seen: unknown[] = [];
    await encodeWith((payload, ctx) => ((seen = [payload, ctx]), Buffer.alloc(0)), { a: 1 }, env);
    expect(seen).toEqual([{ a: 1 }, { topic: 'orders', type: 'order.created', key: 'k', eventId: env.eventId }]);
  });

  it('turns a throwing or rejecting encoder into EventEncodingError with the cause', async () => {
    const boom = new Error('schema mismatch');
    for (const encoder of [
      () => {
        throw boom;
      },
      () => Promise.reject(boom),
    ]) {
      const err = await caught(encodeWith(encoder, 1, envelope()));
      expect(isOutboxkitError(err, 'OUTBOXKIT_ENCODING_FAILED')).toBe(true);
      expect((err as Error).cause).toBe(boom);
      expect((err as Error).message).toContain('schema mismatch');
    }
  });

  it('passes an outboxkit error thrown by the encoder through unchanged', async () => {
    const own = new InvalidEventError('bad order');
    expect(await caught(encodeWith(() => Promise.reject(own), 1, envelope()))).toBe(own);
  });

  it.each([
    ['a string', 'text'],
    ['null', null],
    ['an array', [1, 2]],
    ['an object without bytes', { value: 'text' }],
    ['an empty content type', { value: Buffer.alloc(1), contentType: '' }],
    ['a numeric content type', { value: Buffer.alloc(1), contentType: 7 }],
  ])('refuses %s', async (_, result) => {
    const err = await caught(encodeWith(() => result as never, 1, envelope()));
    expect(isOutboxkitError(err, 'OUTBOXKIT_ENCODING_FAILED')).toBe(true);
  });
});

describe('completeEvent: content-type', () => {
  it('stores a non-JSON content type from the encoder, keeps the event’s own header, and says nothing for JSON', () => {
    const avro = completeEvent(envelope(), { value: Buffer.from([1]), contentType: 'application/avro' }, 100);
    expect(avro.headers['content-type']).toBe('application/avro');
    const json = completeEvent(envelope(), { value: Buffer.from('{}'), contentType: 'application/json' }, 100);
    expect(json.headers).not.toHaveProperty('content-type');
    const own = prepareEnvelope({
      topic: 'orders',
      key: 'k',
      type: 't',
      payload: null,
      headers: { 'content-type': 'application/x-protobuf' },
    });
    expect(completeEvent(own, { value: Buffer.from([1]), contentType: 'application/avro' }, 100).headers).toEqual({
      'content-type': 'application/x-protobuf',
    });
  });

  it('applies the payload limit to the encoded bytes', () => {
    let err: unknown;
    try {
      completeEvent(envelope(), { value: Buffer.alloc(101), contentType: null }, 100);
    } catch (e) {
      err = e;
    }
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_EVENT')).toBe(true);
  });
});
