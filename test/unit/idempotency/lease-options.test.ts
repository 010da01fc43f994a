import { createHash } from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import {
  LEASE_DEFAULTS,
  UNKEYED_OPERATION_ID_WARNING,
  resolveLeaseOptions,
} from '../../../src/idempotency/lease-options.js';
import { operationIdFor, operationIdOf } from '../../../src/idempotency/lease-store.js';

// Before any option is resolved in this file: the warning is emitted once per process.
const emitWarning = vi.spyOn(process, 'emitWarning').mockImplementation(() => {});

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return isOutboxkitError(err) ? err.code : String(err);
  }
  return undefined;
}

describe('resolveLeaseOptions', () => {
  it('applies the documented defaults and derives the schema channel', () => {
    const o = resolveLeaseOptions();
    expect(o).toMatchObject({
      policy: 'reject',
      leaseMs: 30_000,
      pollIntervalMs: 500,
      channel: 'outboxkit_idempotency',
    });
    expect(LEASE_DEFAULTS).toEqual({ policy: 'reject', leaseMs: 30_000, pollIntervalMs: 500 });
    expect(resolveLeaseOptions({ schema: 'billing' }).channel).toBe('billing_idempotency');
    expect(resolveLeaseOptions({ policy: 'wait' }).base.policy).toBe('wait');
  });

  it('returns an already resolved object as is', () => {
    const o = resolveLeaseOptions({ leaseMs: 1_000 });
    expect(resolveLeaseOptions(o)).toBe(o);
  });

  it.each([
    [{ policy: 'queue' }],
    [{ policy: 'async' }], // async needs operationLocation
    [{ leaseMs: 50 }],
    [{ leaseMs: 1.5 }],
    [{ leaseMs: 60_000, retentionMs: 60_000 }], // the lease must be shorter than the retention
    [{ pollIntervalMs: 0 }],
    [{ pollIntervalMs: 24 }], // below the shortest pause of a wait (25 ms)
    [{ operationLocation: '/ops' }],
  ])('refuses %j with InvalidOptionsError', (options) => {
    expect(codeOf(() => resolveLeaseOptions(options as never))).toBe('OUTBOXKIT_INVALID_OPTIONS');
  });

  it('accepts async with an operationLocation', () => {
    expect(resolveLeaseOptions({ policy: 'async', operationLocation: (id) => `/ops/${id}` }).policy).toBe('async');
  });
});

describe('operationIdOf (deprecated: the id of records claimed before ids were keyed)', () => {
  it('is the hex SHA-256 of the key: stable, opaque, never the key', () => {
    const id = operationIdOf('k-123');
    expect(id).toMatch(/^[0-9a-f]{64}$/);
    expect(operationIdOf('k-123')).toBe(id);
    expect(operationIdOf('k-124')).not.toBe(id);
    expect(id).not.toContain('k-123');
  });
});

describe('operationIdSecret and the operation id', () => {
  const scope = { tenant: 'tenant-a', operation: 'create-payment', key: 'order-42' };
  const secret = Buffer.alloc(32, 7);

  it('without a secret: an unkeyed id, and one process warning (OUTBOXKIT_OPERATION_ID_UNKEYED) however often options are resolved', () => {
    resolveLeaseOptions();
    resolveLeaseOptions({ policy: 'wait' });
    const unkeyed = resolveLeaseOptions().operationIdOf(scope);
    expect(unkeyed).toBe(operationIdFor(scope, Buffer.alloc(0)));
    const warnings = emitWarning.mock.calls.filter(
      (c) => (c[1] as { code?: string } | undefined)?.code === UNKEYED_OPERATION_ID_WARNING,
    );
    expect(warnings).toHaveLength(1);
    expect(String(warnings[0]![0])).toMatch(/operationIdSecret/);
  });

  it('is the HMAC-SHA256 of the documented encoding of (tenant, operation, key): stable across versions', () => {
    // Pinned (computed with Python's hmac over the documented bytes): a change of the encoding
    // would change the ids of new records (stored ones keep theirs).
    expect(operationIdFor(scope, secret)).toBe('a744a21ac4a5692a75ef15fab552dc98c16582834d622c758da3a3e3bfe401c0');
    expect(operationIdFor(scope, Buffer.alloc(0))).toBe(
      'f0c3397417807ed5c0e9caca75ada310520f4eef9e275f0b020a0227521e9de6',
    );
    const id = resolveLeaseOptions({ operationIdSecret: secret }).operationIdOf(scope);
    expect(id).toBe(operationIdFor(scope, secret));
    expect(resolveLeaseOptions({ operationIdSecret: 'x'.repeat(32) }).operationIdOf(scope)).toBe(
      operationIdFor(scope, Buffer.from('x'.repeat(32))),
    );
  });

  it('differs per tenant, operation, key and secret; is neither the key nor its plain SHA-256; fields cannot be shifted', () => {
    const id = operationIdFor(scope, secret);
    expect(id).toMatch(/^[0-9a-f]{64}$/);
    expect(id).not.toContain(scope.key);
    expect(id).not.toBe(operationIdOf(scope.key));
    expect(id).not.toBe(createHash('sha256').update(scope.key).digest('hex'));
    expect(operationIdFor({ ...scope, tenant: 'tenant-b' }, secret)).not.toBe(id);
    expect(operationIdFor({ ...scope, operation: 'refund' }, secret)).not.toBe(id);
    expect(operationIdFor({ ...scope, key: 'order-43' }, secret)).not.toBe(id);
    expect(operationIdFor(scope, Buffer.alloc(32, 8))).not.toBe(id);
    // Length prefixes: moving characters between fields gives another id.
    expect(operationIdFor({ tenant: 'ab', operation: 'c', key: 'd' }, secret)).not.toBe(
      operationIdFor({ tenant: 'a', operation: 'bc', key: 'd' }, secret),
    );
  });

  it("copies the secret: changing the caller's buffer afterwards changes no id", () => {
    const mine = Buffer.alloc(32, 1);
    const opts = resolveLeaseOptions({ operationIdSecret: mine });
    const before = opts.operationIdOf(scope);
    mine.fill(2);
    expect(opts.operationIdOf(scope)).toBe(before);
  });

  it.each([['short'], [Buffer.alloc(31)], [''], [42], [{ secret: 'x'.repeat(40) }]])(
    'refuses %j: at least 32 bytes of string or bytes, and the message never holds the value',
    (operationIdSecret) => {
      let err: unknown;
      try {
        resolveLeaseOptions({ operationIdSecret: operationIdSecret as never });
      } catch (e) {
        err = e;
      }
      expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
      expect((err as Error).message).toMatch(/operationIdSecret must be a string or bytes of at least 32 bytes/);
      if (typeof operationIdSecret === 'string' && operationIdSecret !== '') {
        expect((err as Error).message).not.toContain(operationIdSecret);
      }
    },
  );
});
