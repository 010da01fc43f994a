import type { KafkaMessage } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { decodeHeaders, readEventId, toConsumedEvent } from '../../../consumer/consumed-event.js';
import { isOutboxkitError } from '../../../src/errors.js';

const message = (value: Buffer | null, key: Buffer | null = null): KafkaMessage => ({
  key,
  value,
  timestamp: '0',
  attributes: 0,
  offset: '41',
  headers: {},
});

describe('decodeHeaders', () => {
  it('decodes Buffers and strings as UTF-8; the last of repeated values wins', () => {
    expect(decodeHeaders({ a: Buffer.from('é'), b: 'plain', c: [Buffer.from('first'), 'last'], d: undefined })).toEqual(
      { a: 'é', b: 'plain', c: 'last' },
    );
    expect(decodeHeaders(undefined)).toEqual({});
  });
});

describe('readEventId', () => {
  it.each([
    ['0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b', '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b'],
    ['0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B', '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b'],
    ['6ba7b810-9dad-11d1-80b4-00c04fd430c8', '6ba7b810-9dad-11d1-80b4-00c04fd430c8'],
  ])('accepts %s', (raw, id) => {
    expect(readEventId({ 'event-id': raw }, 'event-id')).toBe(id);
  });

  it.each([
    ['missing', undefined],
    ['empty', ''],
    ['not a uuid', 'order-42'],
    ['padded', ' 0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b'],
    ['nil', '00000000-0000-0000-0000-000000000000'],
    ['max', 'ffffffff-ffff-ffff-ffff-ffffffffffff'],
  ])('refuses %s', (_, raw) => {
    expect(readEventId(raw === undefined ? {} : { 'event-id': raw }, 'event-id')).toBeNull();
  });
});

describe('toConsumedEvent', () => {
  const id = '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b';

  it('exposes the message and parses JSON once, lazily', () => {
    const value = Buffer.from('{"total":12345678901234567890}');
    const event = toConsumedEvent('orders', 2, message(value, Buffer.from('order-1')), id, {
      'event-type': 'order.created',
    });
    expect(event).toMatchObject({
      id,
      type: 'order.created',
      key: 'order-1',
      value,
      topic: 'orders',
      partition: 2,
      offset: '41',
    });
    const parsed = event.json();
    expect(event.json()).toBe(parsed);
  });

  it('has a null type without the event-type header, and a null key without a key', () => {
    expect(toConsumedEvent('t', 0, message(Buffer.from('1')), id, {})).toMatchObject({ type: null, key: null });
  });

  it('throws InvalidMessageError from json() for a null or non-JSON value', () => {
    for (const value of [null, Buffer.from('{oops')]) {
      const event = toConsumedEvent('t', 0, message(value), id, {});
      let caught: unknown;
      try {
        event.json();
      } catch (err) {
        caught = err;
      }
      expect(isOutboxkitError(caught, 'OUTBOXKIT_INVALID_MESSAGE')).toBe(true);
    }
  });

  it("never quotes the value in json()'s error (it becomes the dead letter's reason)", () => {
    const secret = 'card-4111111111111111';
    const event = toConsumedEvent('t', 0, message(Buffer.from(`{"a": "${secret}", oops}`)), id, {});
    let caught: Error | undefined;
    try {
      event.json();
    } catch (err) {
      caught = err as Error;
    }
    expect(caught?.message).toMatch(/is not valid JSON at character \d+; its bytes are not shown\.$/);
    expect(caught?.message).not.toContain(secret);
    expect(caught?.cause).toBeUndefined();
  });
});
