import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import {
  decideOnExisting,
  headersToStore,
  normaliseResponse,
  outcomeOfResponse,
  outcomeOfStatus,
  reject,
  type StoredRecord,
} from '../../../src/idempotency/state-machine.js';
import { resolveIdempotencyOptions } from '../../../src/idempotency/options.js';

const digest = Buffer.alloc(32, 7);
const fingerprint = { version: 1 as const, digest };

function record(over: Partial<StoredRecord> = {}): StoredRecord {
  return {
    state: 'completed',
    fingerprint: Buffer.from(digest),
    fingerprintVersion: 1,
    responseStatus: 201,
    responseHeaders: { 'content-type': 'application/json', location: '/orders/1' },
    responseBody: Buffer.from('{"id":1}'),
    ...over,
  };
}

describe('outcomeOfStatus (C22: which outcomes are stored)', () => {
  it.each([200, 201, 202, 204, 299, 301, 303, 399])('%i is stored as completed', (s) =>
    expect(outcomeOfStatus(s)).toBe('completed'),
  );
  it.each([400, 401, 403, 404, 410, 422, 499])('%i is a final rejection, stored as failed', (s) =>
    expect(outcomeOfStatus(s)).toBe('failed'),
  );
  it.each([408, 409, 425, 429, 500, 502, 503, 504, 599])('%i releases the key (not stored)', (s) =>
    expect(outcomeOfStatus(s)).toBe('release'),
  );
});

describe('decideOnExisting', () => {
  it('replays a completed or failed record with idempotent-replayed: true', () => {
    const d = decideOnExisting(record(), fingerprint);
    expect(d).toEqual({
      kind: 'replay',
      response: {
        status: 201,
        headers: { 'content-type': 'application/json', location: '/orders/1', 'idempotent-replayed': 'true' },
        body: Buffer.from('{"id":1}'),
      },
    });
    expect(decideOnExisting(record({ state: 'failed', responseStatus: 422 }), fingerprint).kind).toBe('replay');
  });

  it('a different fingerprint is a mismatch in every state, and never returns the stored response', () => {
    const other = { version: 1 as const, digest: Buffer.alloc(32, 8) };
    for (const state of ['completed', 'failed', 'processing', 'uncertain'] as const) {
      expect(decideOnExisting(record({ state }), other)).toEqual({ kind: 'mismatch' });
    }
    expect(decideOnExisting(record({ fingerprintVersion: 2 }), fingerprint)).toEqual({ kind: 'mismatch' });
  });

  it('processing and uncertain records are in progress', () => {
    expect(
      decideOnExisting(record({ state: 'processing', responseStatus: null, responseBody: null }), fingerprint),
    ).toEqual({
      kind: 'in-progress',
    });
    expect(decideOnExisting(record({ state: 'uncertain' }), fingerprint)).toEqual({ kind: 'in-progress' });
  });
});

describe('normaliseResponse', () => {
  it('serialises a JSON value once, as application/json', () => {
    const r = normaliseResponse({ status: 201, body: { b: 1, a: [1, 2] } });
    expect(r.body.toString()).toBe('{"b":1,"a":[1,2]}');
    expect(r.headers).toEqual({ 'content-type': 'application/json' });
  });

  it('keeps bytes and strings as they are, with default content types', () => {
    const bytes = Buffer.from([0, 255, 1]);
    expect(normaliseResponse({ status: 200, body: bytes }).body.equals(bytes)).toBe(true);
    expect(normaliseResponse({ status: 200, body: bytes }).headers['content-type']).toBe('application/octet-stream');
    expect(normaliseResponse({ status: 200, body: new Uint8Array([1, 2]) }).body.equals(Buffer.from([1, 2]))).toBe(
      true,
    );
    const s = normaliseResponse({ status: 200, body: 'héllo' });
    expect(s.body.equals(Buffer.from('héllo', 'utf8'))).toBe(true);
    expect(s.headers['content-type']).toBe('text/plain; charset=utf-8');
  });

  it('lower-cases header names, keeps the handler content-type, drops framing headers', () => {
    const r = normaliseResponse({
      status: 201,
      headers: {
        'Content-Type': 'application/vnd.x+json',
        Location: '/o/1',
        'Content-Length': '3',
        'Idempotent-Replayed': 'true',
      },
      body: '{}',
    });
    expect(r.headers).toEqual({ 'content-type': 'application/vnd.x+json', location: '/o/1' });
  });

  it.each([
    ['a 1xx status', { status: 100, body: '' }],
    ['a status above 599', { status: 600, body: '' }],
    ['a fractional status', { status: 200.5, body: '' }],
    ['a header with CRLF', { status: 200, headers: { x: 'a\r\nb' }, body: '' }],
    ['an invalid header name', { status: 200, headers: { 'a b': 'x' }, body: '' }],
    ['a body JSON cannot serialise', { status: 200, body: { n: 1n } }],
  ])('refuses %s with InvalidOptionsError', (_name, response) => {
    let code: string | undefined;
    try {
      normaliseResponse(response as never);
    } catch (err) {
      code = isOutboxkitError(err) ? err.code : String(err);
    }
    expect(code).toBe('OUTBOXKIT_INVALID_OPTIONS');
  });
});

describe('headersToStore', () => {
  it('stores only allow-listed headers; never set-cookie', () => {
    const { replayHeaders } = resolveIdempotencyOptions();
    const stored = headersToStore(
      { 'content-type': 'application/json', location: '/o/1', 'set-cookie': 's=1', 'x-request-id': 'r1', etag: '"e"' },
      replayHeaders,
    );
    expect(stored).toEqual({ 'content-type': 'application/json', location: '/o/1', etag: '"e"' });
  });
});

describe('reject() and outcomeOfResponse (stored or released business rejections)', () => {
  it('a stored rejection is failed, an unstored one is released; plain responses follow their status', () => {
    expect(outcomeOfResponse(reject(422, { title: 'x' }))).toBe('failed');
    expect(outcomeOfResponse(reject(404, 'gone', { store: true }))).toBe('failed');
    expect(outcomeOfResponse(reject(422, { title: 'x' }, { store: false }))).toBe('release');
    expect(outcomeOfResponse(reject(409, { title: 'x' }, { store: false }))).toBe('release');
    expect(outcomeOfResponse({ status: 422, body: {} })).toBe('failed');
    expect(outcomeOfResponse({ status: 201, body: {} })).toBe('completed');
    expect(outcomeOfResponse({ status: 503, body: {} })).toBe('release');
  });

  it('keeps status, body and headers for normaliseResponse', () => {
    const r = normaliseResponse(reject(422, { a: 1 }, { headers: { 'Content-Type': 'application/problem+json' } }));
    expect(r).toEqual({
      status: 422,
      headers: { 'content-type': 'application/problem+json' },
      body: Buffer.from('{"a":1}'),
    });
  });

  it.each([200, 302, 500, 503, 399, 4.5])('refuses the non-4xx status %s', (status) => {
    expect(() => reject(status, {})).toThrow(expect.objectContaining({ code: 'OUTBOXKIT_INVALID_OPTIONS' }));
  });

  it.each([408, 409, 425, 429])('refuses to store the retriable %i (store: false is fine)', (status) => {
    expect(() => reject(status, {})).toThrow(expect.objectContaining({ code: 'OUTBOXKIT_INVALID_OPTIONS' }));
    expect(() => reject(status, {}, { store: false })).not.toThrow();
  });
});
