import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import { LEASE_DEFAULTS, resolveLeaseOptions } from '../../../src/idempotency/lease-options.js';
import { operationIdOf } from '../../../src/idempotency/lease-store.js';

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
    [{ operationLocation: '/ops' }],
  ])('refuses %j with InvalidOptionsError', (options) => {
    expect(codeOf(() => resolveLeaseOptions(options as never))).toBe('OUTBOXKIT_INVALID_OPTIONS');
  });

  it('accepts async with an operationLocation', () => {
    expect(resolveLeaseOptions({ policy: 'async', operationLocation: (id) => `/ops/${id}` }).policy).toBe('async');
  });
});

describe('operationIdOf', () => {
  it('is the hex SHA-256 of the key: stable, opaque, never the key', () => {
    const id = operationIdOf('k-123');
    expect(id).toMatch(/^[0-9a-f]{64}$/);
    expect(operationIdOf('k-123')).toBe(id);
    expect(operationIdOf('k-124')).not.toBe(id);
    expect(id).not.toContain('k-123');
  });
});
