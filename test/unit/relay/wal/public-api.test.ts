/**
 * The WAL relay is part of the public API: `outboxkit/relay` (package.json "exports" maps it to
 * the build of relay/index.ts) exports `createWalRelay`, its defaults, its option, event and
 * handle types, the slot and publication setup and their default names, and `WalStreamError`
 * (also from the package root, with every other error class). Imported here the way a user's
 * code imports them, from the entry points' sources; the types are checked by `tsc` (this file is
 * in tsconfig.json). No infrastructure: nothing connects.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, expectTypeOf, it } from 'vitest';
import * as root from '../../../../src/index.js';
import {
  createWalRelay,
  ensureLogicalSlot,
  ensurePublication,
  WAL_RELAY_DEFAULTS,
  walPublicationName,
  walSlotName,
  WalStreamError,
  type WalRelay,
  type WalRelayEvents,
  type WalRelayOptions,
  type WalRelayReadiness,
} from '../../../../relay/index.js';

describe('outboxkit/relay exports the WAL relay', () => {
  it('package.json maps outboxkit/relay to the build of relay/index.ts', () => {
    const pkg = JSON.parse(readFileSync('package.json', 'utf8')) as { exports: Record<string, unknown> };
    expect(pkg.exports['./relay']).toEqual({ types: './dist/relay/index.d.ts', import: './dist/relay/index.js' });
    const build = JSON.parse(readFileSync('tsconfig.build.json', 'utf8')) as { include: string[] };
    expect(build.include).toContain('relay');
  });

  it('createWalRelay makes a relay with the documented defaults, and refuses unknown options', () => {
    const options: WalRelayOptions = {
      connection: 'postgres://127.0.0.1:1/none',
      slot: walSlotName('outboxkit'),
      publication: walPublicationName('outboxkit'),
      brokers: ['127.0.0.1:1'],
    };
    const relay: WalRelay = createWalRelay(options);
    expect(typeof relay.start).toBe('function');
    expect(relay.stats()).toMatchObject({ published: 0, parked: 0, deleted: 0, confirmedLsn: '0/0', queued: 0 });
    expect(WAL_RELAY_DEFAULTS).toEqual({
      leaseMs: 10_000,
      holdKeyBehindFailure: true,
      batchSize: 500,
      maxBatchBytes: 900_000,
      brokerTimeoutMs: 5_000,
      retryInitialMs: 200,
      retryMaxMs: 10_000,
      statusIntervalMs: 10_000,
      // The retention cleanup's, the table relay's (relay/options.ts, RELAY_DEFAULTS).
      publishedRetentionMs: 86_400_000,
      cleanupIntervalMs: 60_000,
      cleanupBatchSize: 1_000,
      cleanupRowsPerSecond: 2_000,
    });
    expect(() => createWalRelay({ ...options, lane: 1 } as WalRelayOptions)).toThrow(
      expect.objectContaining({ code: 'OUTBOXKIT_INVALID_OPTIONS' }),
    );
    // The lease: 1 s to 1 h (a longer one would overflow the renewal timer), above brokerTimeoutMs;
    // before start() no lease is held.
    expect(() => createWalRelay({ ...options, leaseMs: 500 })).toThrow(
      /leaseMs must be an integer from 1000 to 3600000/,
    );
    expect(() => createWalRelay({ ...options, leaseMs: 99_999_999_999 })).toThrow(/leaseMs must be an integer/);
    expect(() => createWalRelay({ ...options, leaseMs: 2_000, brokerTimeoutMs: 3_000 })).toThrow(
      /brokerTimeoutMs must be below leaseMs, got 3000 and 2000/,
    );
    expect(relay.stats()).toMatchObject({ leaseHeld: false, fencingToken: undefined, standbyOf: undefined });
    expectTypeOf<WalRelayEvents['wal:published'][0]['events']>().toEqualTypeOf<number>();
    expectTypeOf<WalRelayReadiness['stream']>().toEqualTypeOf<boolean>();
  });

  it('the setup functions, default names and WalStreamError (from the root too)', () => {
    expect(typeof ensureLogicalSlot).toBe('function');
    expect(typeof ensurePublication).toBe('function');
    expect(walSlotName('orders')).toBe('orders_relay');
    expect(walPublicationName('orders')).toBe('orders_outbox_events');
    const err = new WalStreamError('lost', { retriable: false });
    expect(root.isOutboxkitError(err, 'OUTBOXKIT_WAL_STREAM_FAILED')).toBe(true);
    expect(err.retriable).toBe(false);
    expect(new WalStreamError('lost').retriable).toBe(true);
    expect(root.WalStreamError).toBe(WalStreamError);
    expect(root.ERROR_CODES).toContain('OUTBOXKIT_WAL_STREAM_FAILED');
  });
});
