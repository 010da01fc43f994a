/**
 * Strings stored as PostgreSQL text are validated before any SQL (DESIGN G6); SQLSTATE 42P01/3F000
 * becomes SchemaMissingError; the lease NOTIFY channel stays within PostgreSQL's 63 bytes.
 */
import { describe, expect, it } from 'vitest';
import { InvalidOptionsError, isOutboxkitError } from '../../../src/errors.js';
import { toProblem } from '../../../src/http/problem.js';
import { leaseChannel } from '../../../src/idempotency/lease-store.js';
import { resolveLeaseOptions } from '../../../src/idempotency/lease-options.js';
import { classifyStoreError, schemaOfTable, toSchemaMissing } from '../../../src/idempotency/pg-errors.js';
import { normaliseResponse } from '../../../src/idempotency/state-machine.js';
import {
  MAX_OPERATION_BYTES,
  MAX_TENANT_BYTES,
  assertValidOperation,
  assertValidTenant,
  storableText,
  textProblem,
} from '../../../src/idempotency/text.js';

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return isOutboxkitError(err) ? err.code : String(err);
  }
  return undefined;
}

describe('tenant and operation validation', () => {
  it('accepts ordinary and non-ASCII names up to the byte limits', () => {
    expect(assertValidTenant('acme-42')).toBe('acme-42');
    expect(assertValidTenant('société 🚀')).toBe('société 🚀');
    expect(assertValidTenant('x'.repeat(MAX_TENANT_BYTES))).toHaveLength(MAX_TENANT_BYTES);
    expect(assertValidOperation('POST /orders', 'f()')).toBe('POST /orders');
    expect(assertValidOperation('o'.repeat(MAX_OPERATION_BYTES), 'f()')).toHaveLength(MAX_OPERATION_BYTES);
  });

  it.each([
    ['a NUL', 'acme\0evil', /NUL/],
    ['a lone high surrogate', 'acme\uD800', /surrogate/],
    ['a lone low surrogate', '\uDC00acme', /surrogate/],
    ['too many UTF-8 bytes', 'é'.repeat(513), /1026 bytes/],
  ])('refuses a tenant with %s: TenantUnresolvedError saying why', (_what, tenant, why) => {
    let caught: unknown;
    try {
      assertValidTenant(tenant);
    } catch (err) {
      caught = err;
    }
    expect(isOutboxkitError(caught, 'OUTBOXKIT_TENANT_UNRESOLVED')).toBe(true);
    expect((caught as Error).message).toMatch(why);
  });

  it('refuses a missing or empty tenant (never a shared scope)', () => {
    for (const t of [undefined, null, '', 42])
      expect(codeOf(() => assertValidTenant(t))).toBe('OUTBOXKIT_TENANT_UNRESOLVED');
  });

  it('refuses an invalid operation with InvalidOptionsError', () => {
    for (const op of ['', 'op\0', 'op\uD800', 'o'.repeat(MAX_OPERATION_BYTES + 1), undefined]) {
      expect(codeOf(() => assertValidOperation(op, 'f()'))).toBe('OUTBOXKIT_INVALID_OPTIONS');
    }
  });

  it('textProblem says nothing about a valid surrogate pair', () => {
    expect(textProblem('😀', 10)).toBeUndefined();
    expect(textProblem('\uD83D', 10)).toMatch(/surrogate/);
  });

  it('storableText replaces NUL and lone surrogates with U+FFFD and keeps the rest', () => {
    expect(storableText('a\0b\uD800c😀')).toBe('a\uFFFDb\uFFFDc😀');
  });
});

describe('response headers', () => {
  it.each([
    ['a NUL', 'a\0b'],
    ['a CR', 'a\rb'],
    ['a LF', 'a\nb'],
    ['DEL', 'a\x7fb'],
    ['a character above U+00FF', 'snow ☃'],
    ['a lone surrogate', '\uD800'],
  ])('refuses a header value with %s (Node.js would refuse to send it)', (_what, value) => {
    expect(() => normaliseResponse({ status: 200, headers: { 'x-a': value }, body: {} })).toThrow(InvalidOptionsError);
  });

  it('refuses a non-string header value with a typed error', () => {
    expect(
      codeOf(() => normaliseResponse({ status: 200, headers: { 'x-a': 42 as unknown as string }, body: {} })),
    ).toBe('OUTBOXKIT_INVALID_OPTIONS');
  });

  it('accepts HTAB and obs-text (Latin-1) as Node.js does', () => {
    expect(normaliseResponse({ status: 200, headers: { 'x-a': 'a\tcafé' }, body: {} }).headers['x-a']).toBe('a\tcafé');
  });
});

describe('schema missing', () => {
  const undefinedTable = Object.assign(new Error('relation "outboxkit.idempotency_keys" does not exist'), {
    code: '42P01',
  });

  it('converts 42P01 and 3F000, also wrapped (drizzle keeps the driver error as cause)', () => {
    const wrapped = new Error('Failed query', { cause: undefinedTable });
    const noSchema = Object.assign(new Error('schema "x" does not exist'), { code: '3F000' });
    for (const err of [undefinedTable, wrapped, noSchema]) {
      const converted = toSchemaMissing(err, 'outboxkit');
      expect(isOutboxkitError(converted, 'OUTBOXKIT_SCHEMA_MISSING')).toBe(true);
      expect((converted as Error & { retriable: boolean }).retriable).toBe(false);
      expect((converted as Error).message).toMatch(/outboxkit migrate --schema outboxkit/);
    }
  });

  it('leaves other errors unchanged', () => {
    const lock = Object.assign(new Error('lock'), { code: '55P03' });
    expect(toSchemaMissing(lock, 'outboxkit')).toBe(lock);
    const plain = new Error('boom');
    expect(toSchemaMissing(plain, 'outboxkit')).toBe(plain);
    expect(classifyStoreError(undefinedTable)).toBe('other');
  });

  it('schemaOfTable reads the schema back from a quoted table', () => {
    expect(schemaOfTable('"tenant_x".idempotency_keys')).toBe('tenant_x');
  });

  it('maps to a 500 schema-missing problem without Retry-After and without the operator details', () => {
    const problem = toProblem(toSchemaMissing(undefinedTable, 'outboxkit'), { retryAfterSeconds: 5 });
    expect(problem.status).toBe(500);
    expect(problem.headers['retry-after']).toBeUndefined();
    expect(problem.body).toMatchObject({
      type: 'https://outboxkit.dev/problems/schema-missing',
      status: 500,
      code: 'OUTBOXKIT_SCHEMA_MISSING',
    });
    expect(problem.body.detail).not.toMatch(/relation|idempotency_keys/);
  });
});

describe('lease NOTIFY channel', () => {
  // PostgreSQL truncates identifiers (channel names included) to NAMEDATALEN - 1 = 63 bytes. The
  // lead limits schema names to 40 characters in src/schema-name.ts; that limit is not exported
  // (yet), so it is hard-coded here.
  const MAX_SCHEMA_NAME_LENGTH = 40;

  it('the longest allowed schema gives a channel of at most 63 bytes', () => {
    const schema = 's'.repeat(MAX_SCHEMA_NAME_LENGTH);
    expect(Buffer.byteLength(leaseChannel(schema), 'utf8')).toBeLessThanOrEqual(63);
    expect(resolveLeaseOptions({ schema }).channel).toBe(`${schema}_idempotency`);
  });
});
