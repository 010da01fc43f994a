/**
 * The Fastify adapter's raw-body limit: with default options, a body just over the default
 * `maxBodyBytes` gets outboxkit's 413 `body-too-large` problem (not Fastify's own 413, whose
 * default `bodyLimit` equals `maxBodyBytes`), and nothing is recorded. Over real HTTP against the
 * real PostgreSQL (the harness of test/idempotency).
 */
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
