/**
 * What a replay is sent as for the retry's Accept-Encoding (src/http/replay-encoding.ts;
 * docs/http-contract.md, "Replayed representation"), RFC 9110 §12.5.3: the pure decision, and the
 * decoded response's headers. No infrastructure.
 */
import zlib from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import { toProblem } from '../../../src/http/problem.js';
import {
  acceptEncodingWeights,
  decideReplayEncoding,
  negotiateReplayEncoding,
} from '../../../src/http/replay-encoding.js';
import type { IdempotentResponse } from '../../../src/idempotency/state-machine.js';

describe('C32 decideReplayEncoding: as stored, decoded, or 406', () => {
  it.each([
    // [stored content-encoding, Accept-Encoding, decision]
    [undefined, 'identity', 'as-stored'], // nothing to decode; a middleware negotiates identity bodies
    ['gzip', undefined, 'as-stored'], // no Accept-Encoding: no preference
    ['gzip', 'gzip, deflate, br', 'as-stored'],
    ['br', 'br;q=0.1', 'as-stored'],
    ['gzip', '*', 'as-stored'],
    ['gzip', 'x-gzip', 'as-stored'], // x-gzip is gzip (RFC 9110 §8.4.1.3)
    ['x-gzip', 'gzip', 'as-stored'],
    ['GZIP', 'Gzip;Q=0.5', 'as-stored'], // case-insensitive
    ['deflate, br', 'br, deflate', 'as-stored'],
    ['identity', 'identity;q=0', 'as-stored'], // identity is no coding
    ['gzip', 'identity', 'decode'],
    ['gzip', '', 'decode'], // an empty field: no coding wanted
    ['br', 'gzip, deflate', 'decode'], // identity acceptable by default
    ['gzip', 'gzip;q=0, *', 'decode'],
    ['gzip', 'gzip;q=0.000', 'decode'],
    ['gzip', 'gzip;q=2', 'decode'], // a malformed weight: the member is ignored
    ['deflate, br', 'br', 'decode'], // every coding must be acceptable
    ['br', 'gzip, identity;q=0', 'not-acceptable'],
    ['br', '*;q=0', 'not-acceptable'],
    ['br', 'gzip;q=1, *;q=0', 'not-acceptable'],
    ['zstd', 'gzip', 'not-acceptable'], // not decodable here
    ['compress', 'identity', 'not-acceptable'],
  ] as const)('stored %s, Accept-Encoding %s: %s', (stored, accept, kind) => {
    expect(decideReplayEncoding(stored, accept).kind).toBe(kind);
  });

  it('a stored range of coded bytes is never decoded', () => {
    expect(decideReplayEncoding('gzip', 'identity', true)).toEqual({
      kind: 'not-acceptable',
      codings: ['gzip'],
      reason: 'undecodable',
    });
    expect(decideReplayEncoding('gzip', 'gzip', true).kind).toBe('as-stored');
  });

  it('reads repeated fields as one list and keeps the first weight of a coding', () => {
    expect([...acceptEncodingWeights(['gzip;q=0.5', 'br, GZIP'])]).toEqual([
      ['gzip', 0.5],
      ['br', 1],
    ]);
    expect([...acceptEncodingWeights(' , br ; q=0 ,')]).toEqual([['br', 0]]);
  });
});

function stored(headers: Record<string, string>, body: Buffer): IdempotentResponse {
  return { status: 201, headers: { 'idempotent-replayed': 'true', ...headers }, body };
}

describe('C32 negotiateReplayEncoding', () => {
  const json = Buffer.from(JSON.stringify({ id: 7, note: 'Größe M' }), 'utf8');

  it('returns the stored response itself when it is acceptable', async () => {
    const r = stored({ 'content-encoding': 'gzip' }, zlib.gzipSync(json));
    expect(await negotiateReplayEncoding(r, 'gzip')).toBe(r);
    expect(await negotiateReplayEncoding(r, undefined)).toBe(r);
  });

  it('decodes stacked codings last first, drops what described the coded bytes, adds Vary: accept-encoding', async () => {
    const r = stored(
      {
        'content-type': 'application/json',
        'content-encoding': 'deflate, br',
        'content-language': 'de',
        'content-disposition': 'attachment; filename="o.json"',
        'content-location': '/orders/7',
        'content-digest': 'sha-256=:abc=:',
        etag: '"strong"',
        'last-modified': 'Tue, 01 Dec 2026 10:00:00 GMT',
        vary: 'Accept-Language',
      },
      zlib.brotliCompressSync(zlib.deflateSync(json)),
    );
    const out = await negotiateReplayEncoding(r, 'identity');
    expect(out.body.equals(json)).toBe(true);
    expect(out.status).toBe(201);
    expect(out.headers).toEqual({
      'idempotent-replayed': 'true',
      'content-type': 'application/json',
      'content-language': 'de',
      'content-disposition': 'attachment; filename="o.json"',
      'content-location': '/orders/7',
      'last-modified': 'Tue, 01 Dec 2026 10:00:00 GMT',
      vary: 'Accept-Language, accept-encoding',
    });
    expect(r.headers['content-encoding']).toBe('deflate, br'); // the stored response is not changed
  });

  it('keeps a weak ETag, a Vary that already names accept-encoding or is *, and reads raw deflate', async () => {
    const weak = await negotiateReplayEncoding(
      stored({ 'content-encoding': 'deflate', etag: 'W/"w"', vary: 'Accept-Encoding' }, zlib.deflateRawSync(json)),
      'identity',
    );
    expect(weak.body.equals(json)).toBe(true);
    expect(weak.headers.etag).toBe('W/"w"');
    expect(weak.headers.vary).toBe('Accept-Encoding');
    const star = await negotiateReplayEncoding(
      stored({ 'content-encoding': 'gzip', vary: '*' }, zlib.gzipSync(json)),
      '',
    );
    expect(star.headers.vary).toBe('*');
    const none = await negotiateReplayEncoding(stored({ 'content-encoding': 'br' }, zlib.brotliCompressSync(json)), '');
    expect(none.headers.vary).toBe('accept-encoding');
  });

  it('refuses with ReplayNotAcceptableError, a 406 problem', async () => {
    const r = stored({ 'content-encoding': 'br' }, zlib.brotliCompressSync(json));
    const err: unknown = await negotiateReplayEncoding(r, 'gzip, identity;q=0').catch((e: unknown) => e);
    expect(isOutboxkitError(err, 'OUTBOXKIT_REPLAY_NOT_ACCEPTABLE')).toBe(true);
    expect(err).toMatchObject({ storedCodings: ['br'], retriable: false });
    const problem = toProblem(err);
    expect(problem.status).toBe(406);
    expect(problem.body).toMatchObject({
      type: 'https://outboxkit.dev/problems/replay-not-acceptable',
      code: 'OUTBOXKIT_REPLAY_NOT_ACCEPTABLE',
    });
    expect(problem.body.detail).toMatch(/encoded with br.*refuses identity too/);
  });

  it('a body that does not decode as its content-encoding says is a plain Error (answered 500 internal)', async () => {
    const err: unknown = await negotiateReplayEncoding(stored({ 'content-encoding': 'gzip' }, json), 'identity').catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect(isOutboxkitError(err)).toBe(false);
    expect((err as Error).message).toMatch(/does not decode as gzip/);
  });
});
