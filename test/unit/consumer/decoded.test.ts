/** ConsumedEvent.decoded() and cloudEvent() (consumer/consumed-event.ts). */
import type { KafkaMessage } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { toConsumedEvent } from '../../../consumer/consumed-event.js';
import { isOutboxkitError } from '../../../src/errors.js';

const ID = '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b';
const message = (value: Buffer | null): KafkaMessage => ({
  key: null,
  value,
  timestamp: '0',
  attributes: 0,
  offset: '7',
  headers: {},
});

describe('decoded()', () => {
  it('parses JSON without a decoder', async () => {
    const event = toConsumedEvent('t', 0, message(Buffer.from('{"a":[1]}')), ID, {});
    expect(await event.decoded()).toEqual({ a: [1] });
  });

  it('calls an async decoder once with the bytes and the event, and memoises the result', async () => {
    let calls = 0;
    const event = toConsumedEvent('t', 0, message(Buffer.from([0, 0, 0, 0, 1, 42])), ID, {}, async (value, e) => {
      calls += 1;
      return { last: value[value.length - 1], id: e.id };
    });
    const first = await event.decoded();
    expect(first).toEqual({ last: 42, id: ID });
    expect(await event.decoded()).toBe(first);
    expect(calls).toBe(1);
  });

  it('rejects with InvalidMessageError for a tombstone or (without a decoder) bad JSON, and passes a decoder error through', async () => {
    const tombstone = toConsumedEvent('t', 0, message(null), ID, {}, () => 1);
    expect(isOutboxkitError(await tombstone.decoded().catch((e: unknown) => e), 'OUTBOXKIT_INVALID_MESSAGE')).toBe(
      true,
    );
    const bad = toConsumedEvent('t', 0, message(Buffer.from('{')), ID, {});
    expect(isOutboxkitError(await bad.decoded().catch((e: unknown) => e), 'OUTBOXKIT_INVALID_MESSAGE')).toBe(true);
    const boom = new Error('registry unreachable');
    const failing = toConsumedEvent('t', 0, message(Buffer.from('x')), ID, {}, () => Promise.reject(boom));
    expect(await failing.decoded().catch((e: unknown) => e)).toBe(boom);
  });
});

describe('cloudEvent()', () => {
  it('reads the binary-mode attributes, or null without them', () => {
    const headers = {
      ce_specversion: '1.0',
      ce_id: ID,
      ce_source: '/orders',
      ce_type: 'order.created',
      'content-type': 'application/json',
    };
    expect(toConsumedEvent('t', 0, message(null), ID, headers).cloudEvent()).toEqual({
      specversion: '1.0',
      id: ID,
      source: '/orders',
      type: 'order.created',
      datacontenttype: 'application/json',
    });
    expect(toConsumedEvent('t', 0, message(null), ID, {}).cloudEvent()).toBeNull();
  });
});
