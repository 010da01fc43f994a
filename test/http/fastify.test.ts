/**
 * The Fastify adapter's raw bodies: with default options, a body just over the default
 * `maxBodyBytes` gets outboxkit's 413 `body-too-large` problem (not Fastify's own 413, whose
 * default `bodyLimit` equals `maxBodyBytes`), and nothing is recorded; a body Fastify decoded as
 * text, or with a prototype-poisoning member, is 400 `body-invalid` (docs/http-contract.md,
 * "Request bodies"). Over real HTTP against the real PostgreSQL (the harness of test/idempotency).
 */
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  DEFAULT_MAX_BODY_BYTES,
  DEFAULT_RAW_BODY_LIMIT,
  registerRawJsonBody,
  type ContentTypeParserHost,
} from '../../src/http/fastify.js';
import {
  countOrders,
  countRecords,
  post,
  startApp,
  useOrdersDatabase,
  type HttpResult,
} from '../idempotency/harness.js';

const db = useOrdersDatabase();

/** A JSON body of exactly `bytes` bytes. */
function jsonOfSize(bytes: number): string {
  const body = JSON.stringify({ note: 'x'.repeat(bytes - 11) });
  expect(Buffer.byteLength(body)).toBe(bytes);
  return body;
}

function expectBodyTooLarge(res: HttpResult): void {
  expect(res.status).toBe(413);
  expect(res.headers.get('content-type')).toBe('application/problem+json');
  expect(res.json()).toMatchObject({
    type: 'https://outboxkit.dev/problems/body-too-large',
    status: 413,
    code: 'OUTBOXKIT_BODY_TOO_LARGE',
  });
}

describe('Fastify: bodies over maxBodyBytes with default options', () => {
  it("get outboxkit's 413 body-too-large problem, not Fastify's; nothing runs, nothing recorded", async () => {
    const app = await startApp({ pool: db.pool });
    // Just over the default maxBodyBytes, and the reviewer's ~1.1 MB.
    for (const size of [DEFAULT_MAX_BODY_BYTES + 1, 1_100_000]) {
      expectBodyTooLarge(await post(app, '/orders', { body: jsonOfSize(size) }));
    }
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    expect(await countOrders(db.pool)).toBe(0);
    // At the limit it is accepted.
    expect((await post(app, '/orders', { body: jsonOfSize(DEFAULT_MAX_BODY_BYTES) })).status).toBe(201);
    expect(await countRecords(db.pool)).toBe(1);
    await app.close();
  });

  it("the raw-body limit stays bounded: over it, Fastify's own 413 answers and nothing is recorded", async () => {
    const app = await startApp({ pool: db.pool });
    const res = await post(app, '/orders', { body: jsonOfSize(DEFAULT_RAW_BODY_LIMIT + 1) });
    expect(res.status).toBe(413);
    expect(res.json()).toMatchObject({ code: 'FST_ERR_CTP_BODY_TOO_LARGE' });
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    await app.close();
  });
});

describe('registerRawJsonBody: the parser limit', () => {
  function limitOf(initialConfig: { bodyLimit?: number } | undefined, bodyLimit?: number): number | undefined {
    let registered: number | undefined;
    const host: ContentTypeParserHost = {
      hasContentTypeParser: () => false,
      removeContentTypeParser: () => {},
      addContentTypeParser: (_type, opts) => (registered = opts.bodyLimit),
      ...(initialConfig === undefined ? {} : { initialConfig }),
    };
    registerRawJsonBody(host, bodyLimit === undefined ? {} : { bodyLimit });
    return registered;
  }

  it('is above the default maxBodyBytes whatever the instance bodyLimit, and always set', () => {
    expect(DEFAULT_RAW_BODY_LIMIT).toBeGreaterThan(DEFAULT_MAX_BODY_BYTES);
    expect(limitOf(undefined)).toBe(DEFAULT_RAW_BODY_LIMIT);
    expect(limitOf({ bodyLimit: 1_048_576 })).toBe(DEFAULT_RAW_BODY_LIMIT); // Fastify's default
    expect(limitOf({ bodyLimit: 10 })).toBe(DEFAULT_RAW_BODY_LIMIT);
    expect(limitOf({ bodyLimit: 8_000_000 })).toBe(8_000_000); // a larger instance limit is kept
    expect(limitOf({ bodyLimit: 8_000_000 }, 4_096)).toBe(4_096); // the option wins
  });
});

/** `{"note":"<byte>"}`: JSON whose string holds one byte that is not UTF-8 (0xFE, 0xFF, ...). */
function withInvalidByte(byte: number): Buffer {
  return Buffer.concat([Buffer.from('{"note":"'), Buffer.from([byte]), Buffer.from('"}')]);
}

function expectBodyInvalid(res: HttpResult, detail?: RegExp): void {
  expect(res.status).toBe(400);
  expect(res.headers.get('content-type')).toBe('application/problem+json');
  expect(res.json()).toMatchObject({ code: 'OUTBOXKIT_BODY_INVALID', status: 400 });
  if (detail) expect(String(res.json().detail)).toMatch(detail);
}

describe('Fastify: the fingerprint covers raw bytes only', () => {
  it("a text/plain body (decoded by Fastify's text parser) gets 400 body-invalid; bodies differing only in invalid UTF-8 never replay each other", async () => {
    const app = await startApp({ pool: db.pool });
    const key = randomUUID();
    for (const byte of [0xff, 0xfe]) {
      const res = await post(app, '/orders', {
        key,
        body: withInvalidByte(byte),
        headers: { 'content-type': 'text/plain' },
      });
      expectBodyInvalid(res, /not kept as raw bytes \(content type "text\/plain"\)/);
      expect(res.headers.get('idempotent-replayed')).toBeNull();
    }
    // Valid JSON sent as text/plain is refused too: its bytes were not kept.
    expectBodyInvalid(await post(app, '/orders', { body: '{"amount":10}', headers: { 'content-type': 'text/plain' } }));
    // Invalid UTF-8 is 400 whatever the content type.
    expectBodyInvalid(await post(app, '/orders', { key, body: withInvalidByte(0xff) }), /not valid UTF-8/);
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    expect(await countOrders(db.pool)).toBe(0);
    // The key was never used: a JSON body executes with it.
    expect((await post(app, '/orders', { key })).status).toBe(201);
    await app.close();
  });
});

describe('Fastify: prototype-poisoning members are refused like Fastify’s own JSON parser does', () => {
  it('__proto__ and constructor.prototype get 400 body-invalid; the handler never sees them, nothing recorded', async () => {
    const app = await startApp({ pool: db.pool });
    for (const body of [
      '{"__proto__":{"isAdmin":true},"amount":10}',
      '{"amount":10,"meta":{"\\u005f_proto__":{"isAdmin":true}}}',
      '{"constructor":{"prototype":{"isAdmin":true}},"amount":10}',
    ]) {
      expectBodyInvalid(await post(app, '/orders', { body }), /prototype poisoning/);
    }
    expect(app.calls.total).toBe(0);
    expect(await countRecords(db.pool)).toBe(0);
    // A constructor member that holds no prototype is an ordinary member.
    expect((await post(app, '/orders', { body: '{"constructor":{"name":"x"},"amount":10}' })).status).toBe(201);
    await app.close();
  });
});
