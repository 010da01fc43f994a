/**
 * CloudEvents binary-mode headers against the spec's required attributes (CloudEvents 1.0.2
 * "Context Attributes"; Kafka Protocol Binding 1.0.2 §3.2).
 */
import { v7 as uuidv7 } from 'uuid';
import { describe, expect, it } from 'vitest';
import { CE_HEADERS, readCloudEventAttributes, resolveCloudEventsOptions } from '../../../src/outbox/cloud-events.js';
import { prepareEvent } from '../../../src/outbox/event.js';
import { isOutboxkitError } from '../../../src/errors.js';

// RFC 3339 date-time (§5.6), as JavaScript's toISOString writes it or with an offset.
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;
const ID = uuidv7();
const base = { topic: 'orders', key: 'order-1', type: 'order.created', payload: { a: 1 }, eventId: ID };
const cloudEvents = { source: '/orders' };

describe('CloudEvents headers', () => {
  it('carry every required attribute (id, source, specversion, type) with the envelope values', () => {
    const e = prepareEvent(base, 1000, { cloudEvents });
    expect(e.headers).toMatchObject({
      ce_specversion: '1.0',
      ce_id: ID,
      ce_source: '/orders',
      ce_type: 'order.created',
      ce_subject: 'order-1',
      'content-type': 'application/json',
    });
    expect(e.headers.ce_time).toMatch(RFC3339);
    expect(Date.parse(e.headers.ce_time!)).toBeGreaterThan(Date.now() - 60_000);
    const attributes = readCloudEventAttributes(e.headers);
    expect(attributes).toEqual({
      specversion: '1.0',
      id: ID,
      source: '/orders',
      type: 'order.created',
      time: e.headers.ce_time,
      subject: 'order-1',
      datacontenttype: 'application/json',
    });
    // Required attributes are non-empty strings (spec: "MUST be a non-empty string").
    for (const name of ['ce_specversion', 'ce_id', 'ce_source', 'ce_type']) expect(e.headers[name]).not.toBe('');
  });

  it('are absent unless asked for, and JSON goes without content-type then', () => {
    const e = prepareEvent(base, 1000);
    expect(Object.keys(e.headers).filter((h) => h.startsWith('ce_') || h === 'content-type')).toEqual([]);
  });

  it('use the given creation time, the aggregate id as subject when there is no key, and no subject without either', () => {
    const time = '2026-01-02T03:04:05.678Z';
    const byAggregate = prepareEvent({ ...base, key: null, aggregateId: 'agg-9' }, 1000, { cloudEvents, time });
    expect(byAggregate.headers).toMatchObject({ ce_subject: 'agg-9', ce_time: time });
    const none = prepareEvent({ ...base, key: null }, 1000, { cloudEvents });
    expect(none.headers).not.toHaveProperty(CE_HEADERS.subject);
  });

  it('leave out content-type for raw bytes, and keep the application header when it sets one', () => {
    const raw = prepareEvent({ ...base, payload: Buffer.from([1, 2]) }, 1000, { cloudEvents });
    expect(raw.headers).not.toHaveProperty('content-type');
    const typed = prepareEvent(
      { ...base, payload: Buffer.from([1, 2]), headers: { 'content-type': 'application/avro' } },
      1000,
      { cloudEvents },
    );
    expect(readCloudEventAttributes(typed.headers)?.datacontenttype).toBe('application/avro');
  });

  it('let the application set subject, time and extensions, but never id, type, specversion or source', () => {
    const e = prepareEvent(
      {
        ...base,
        headers: {
          ce_id: 'forged',
          ce_type: 'forged',
          ce_specversion: '0.3',
          ce_source: '/elsewhere',
          ce_subject: 'custom',
          ce_time: '2020-01-01T00:00:00Z',
          ce_tenant: 'acme',
        },
      },
      1000,
      { cloudEvents },
    );
    expect(e.headers).toMatchObject({
      ce_id: ID,
      ce_type: 'order.created',
      ce_specversion: '1.0',
      ce_source: '/orders',
      ce_subject: 'custom',
      ce_time: '2020-01-01T00:00:00Z',
      ce_tenant: 'acme',
    });
  });
});

describe('readCloudEventAttributes', () => {
  it('is null when a required attribute is missing or empty', () => {
    const full = { ce_specversion: '1.0', ce_id: 'a', ce_source: '/s', ce_type: 't' };
    expect(readCloudEventAttributes(full)).toEqual({ specversion: '1.0', id: 'a', source: '/s', type: 't' });
    for (const name of Object.keys(full)) {
      expect(readCloudEventAttributes({ ...full, [name]: '' })).toBeNull();
      const rest: Record<string, string> = { ...full };
      delete rest[name];
      expect(readCloudEventAttributes(rest)).toBeNull();
    }
  });
});

describe('resolveCloudEventsOptions', () => {
  it.each([
    ['absent', undefined, true],
    ['a path', { source: '/orders' }, true],
    ['an absolute URI', { source: 'https://shop.example.com/orders' }, true],
    ['a URN', { source: 'urn:uuid:6e8bc430-9c3a-11d9-9669-0800200c9a66' }, true],
    ['empty', { source: '' }, false],
    ['with a space', { source: '/my orders' }, false],
    ['with a control character', { source: '/a\u0007' }, false],
    ['not a string', { source: 42 }, false],
    ['not an object', 'orders', false],
  ])('%s', (_, value, ok) => {
    let caught: unknown;
    try {
      resolveCloudEventsOptions(value as never);
    } catch (err) {
      caught = err;
    }
    expect(caught === undefined).toBe(ok);
    if (!ok) expect(isOutboxkitError(caught, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
  });
});
