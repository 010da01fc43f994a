import { v4 as uuidv4, v7 as uuidv7 } from 'uuid';
import { describe, expect, it } from 'vitest';
import { EVENT_ID_MAX_AGE_MS, EVENT_ID_MAX_SKEW_MS } from '../../../src/constants.js';
import { laneOf, prepareEvent } from '../../../src/outbox/event.js';
import { OUTBOX_LANES } from '../../../src/schema.js';
import { isOutboxkitError } from '../../../src/errors.js';

describe('laneOf', () => {
  it('is stable (FNV-1a of the UTF-8 bytes) and within the lane range', () => {
    // Pinned values: changing the hash would move keys between lanes across a deploy.
    expect(laneOf('')).toBe(0x811c9dc5 % OUTBOX_LANES);
    expect(laneOf('order-1')).toBe(laneOf('order-1'));
    expect([laneOf('a'), laneOf('order-42'), laneOf('é')]).toEqual([
      0xe40c292c % 64,
      laneOf('order-42'),
      laneOf('\u00e9'),
    ]);
    for (let i = 0; i < 1000; i++) {
      const l = laneOf(`k${i}`);
      expect(l).toBeGreaterThanOrEqual(0);
      expect(l).toBeLessThan(OUTBOX_LANES);
    }
  });

  it('spreads keys over every lane', () => {
    const seen = new Set(Array.from({ length: 5000 }, (_, i) => laneOf(`order-${i}`)));
    expect(seen.size).toBe(OUTBOX_LANES);
  });
});

describe('prepareEvent', () => {
  const base = { topic: 't', key: 'k', type: 'x', payload: { a: 1 } };
  it('serialises JSON payloads and keeps Buffers as they are', () => {
    expect(prepareEvent(base, 100).payload.toString()).toBe('{"a":1}');
    const raw = Buffer.from([0, 255, 1]);
    expect(prepareEvent({ ...base, payload: raw }, 100).payload.equals(raw)).toBe(true);
    expect(prepareEvent({ ...base, payload: new Uint8Array([7, 8]) }, 100).payload).toEqual(Buffer.from([7, 8]));
    expect(prepareEvent({ ...base, payload: null }, 100).payload.toString()).toBe('null');
  });

  it('assigns a UUIDv7 event id, or keeps a given one (lower-cased)', () => {
    const e = prepareEvent(base, 100);
    expect(e.eventId).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    const id = uuidv7().toUpperCase();
    expect(prepareEvent({ ...base, eventId: id }, 100).eventId).toBe(id.toLowerCase());
  });

  it('takes an explicit event id only as a UUIDv7 made within the last hour (5 min ahead at most)', () => {
    const at = (ms: number) => uuidv7({ msecs: Date.now() + ms });
    const error = (eventId: string) => {
      try {
        prepareEvent({ ...base, eventId }, 100);
      } catch (err) {
        expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_EVENT')).toBe(true);
        return (err as Error).message;
      }
      return undefined;
    };
    expect(error(at(-EVENT_ID_MAX_AGE_MS + 60_000))).toBeUndefined();
    expect(error(at(EVENT_ID_MAX_SKEW_MS - 60_000))).toBeUndefined();
    // An id from a day ago: its event may have been published, cleaned up, and remembered by
    // every consumer's inbox, which would skip the new event as a duplicate.
    expect(error(at(-86_400_000))).toMatch(/made 1440 min ago: an explicit eventId must be a UUIDv7/);
    expect(error(at(-EVENT_ID_MAX_AGE_MS - 60_000))).toMatch(/made 61 min ago/);
    expect(error(at(EVENT_ID_MAX_SKEW_MS + 60_000))).toMatch(/dated 6 min ahead of this clock/);
    // No timestamp to bound: a UUIDv4, or a UUIDv7 of 2024.
    expect(error(uuidv4())).toMatch(/is not a UUIDv7/);
    expect(error('0190f1e2-0000-7000-8000-000000000001')).toMatch(/min ago/);
  });

  it('puts a null key in the lane of its event id', () => {
    const e = prepareEvent({ ...base, key: null }, 100);
    expect(e.lane).toBe(laneOf(e.eventId));
  });

  it.each([
    ['no topic', { ...base, topic: undefined }],
    ['topic too long', { ...base, topic: 'a'.repeat(250) }],
    ['bad topic char', { ...base, topic: 'a/b' }],
    ['no type', { ...base, type: undefined }],
    ['key not a string', { ...base, key: 5 }],
    ['bigint payload', { ...base, payload: { n: 1n } }],
    ['function payload', { ...base, payload: () => 1 }],
    ['payload over the limit', { ...base, payload: 'x'.repeat(100) }],
    ['header not a string', { ...base, headers: { a: 1 } }],
  ])('rejects %s with InvalidEventError', (_, event) => {
    let err: unknown;
    try {
      prepareEvent(event as never, 100);
    } catch (e) {
      err = e;
    }
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_EVENT')).toBe(true);
  });
});

describe('prepareEvent: inputs PostgreSQL or Kafka would refuse later', () => {
  const base = { topic: 't', key: 'k', type: 'x', payload: 1 };
  it.each([
    ['a NUL in the key', { ...base, key: 'a\u0000b' }],
    ['a NUL in the type', { ...base, type: 'a\u0000' }],
    ['a NUL in an aggregate id', { ...base, aggregateId: '\u0000' }],
    ['a NUL in a header value', { ...base, headers: { h: 'x\u0000' } }],
    ['a NUL in a header name', { ...base, headers: { 'h\u0000': 'x' } }],
    ['headers as a string', { ...base, headers: 'abc' }],
    ['headers as an array', { ...base, headers: ['x'] }],
    ['the topic "."', { ...base, topic: '.' }],
    ['the topic ".."', { ...base, topic: '..' }],
    ['the nil UUID as event id', { ...base, eventId: '00000000-0000-0000-0000-000000000000' }],
    ['the max UUID as event id', { ...base, eventId: 'FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF' }],
    ['a number as event id', { ...base, eventId: 5 }],
    ['an event-id header (the relay sets it from eventId)', { ...base, headers: { 'event-id': 'x' } }],
    ['an Event-Type header, in any case', { ...base, headers: { 'Event-Type': 'x' } }],
    ['a NaN payload (JSON would write null)', { ...base, payload: NaN }],
    ['an Infinity nested in the payload', { ...base, payload: { a: [1, { b: -Infinity }] } }],
    ['a Map payload (JSON would write {})', { ...base, payload: new Map([['a', 1]]) }],
    ['a Set nested in the payload', { ...base, payload: { s: new Set([1]) } }],
    ['an ArrayBuffer payload', { ...base, payload: new ArrayBuffer(2) }],
    ['a Uint16Array payload', { ...base, payload: new Uint16Array([1, 2]) }],
    ['an invalid Date payload (JSON would write null)', { ...base, payload: new Date(Number.NaN) }],
    ['an invalid Date nested in the payload', { ...base, payload: { at: [new Date('nope')] } }],
    [
      'a Float64Array nested in the payload (JSON would write an object)',
      { ...base, payload: { a: new Float64Array([1.5]) } },
    ],
    ['a Uint8Array nested in the payload', { ...base, payload: { a: new Uint8Array([1]) } }],
    ['an ArrayBuffer nested in the payload', { ...base, payload: [new ArrayBuffer(1)] }],
    ['an unpaired surrogate in a header value', { ...base, headers: { a: '\ud800' } }],
    ['an unpaired surrogate in a header name', { ...base, headers: { ['\udc00x']: 'v' } }],
    ['an unpaired surrogate in the key', { ...base, key: 'k\ud800' }],
    ['an unpaired surrogate in the type', { ...base, type: '\ude00' }],
    ['a header named __proto__', { ...base, headers: JSON.parse('{"__proto__":"x"}') as Record<string, string> }],
    ['headers as a Map', { ...base, headers: new Map([['a', 'b']]) }],
  ])('rejects %s with InvalidEventError', (_, event) => {
    let err: unknown;
    try {
      prepareEvent(event as never, 100);
    } catch (e) {
      err = e;
    }
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_EVENT')).toBe(true);
  });

  it('keeps paired surrogates (emoji), empty objects and Uint8Array/Buffer payloads', () => {
    expect(
      prepareEvent(
        { ...base, key: 'k😀', headers: { h: '😀' }, payload: { e: {}, s: '😀' } },
        1_000,
      ).payload.toString(),
    ).toBe('{"e":{},"s":"😀"}');
    expect(prepareEvent({ ...base, payload: new Uint8Array([1, 2]) }, 1_000).payload).toEqual(Buffer.from([1, 2]));
  });

  it('keeps valid Dates and nested Buffers as JSON writes them (toJSON)', () => {
    const at = new Date('2026-11-30T00:00:00.000Z');
    expect(prepareEvent({ ...base, payload: { at, b: Buffer.from([1]) } }, 1_000).payload.toString()).toBe(
      '{"at":"2026-11-30T00:00:00.000Z","b":{"type":"Buffer","data":[1]}}',
    );
  });

  it('keeps nulls and finite numbers of a payload as JSON writes them', () => {
    const event = prepareEvent({ ...base, payload: { a: null, b: [null, 1.5e300, -0] } }, 1_000);
    expect(event.payload.toString()).toBe('{"a":null,"b":[null,1.5e+300,0]}');
  });

  it('accepts the topic "..a" and a key with other control characters', () => {
    expect(prepareEvent({ ...base, topic: '..a', key: 'a\tb' }, 100).topic).toBe('..a');
  });
});
