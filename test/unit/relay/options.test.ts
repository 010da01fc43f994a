/**
 * relay/options.ts `resolveRelayOptions`: the rules between options, checked after each option
 * alone. `brokerTimeoutMs` must be below `leaseMs` (a relay facing a hung broker would otherwise
 * hold its lanes past their lease), and `retryMaxMs` not below `retryInitialMs`; a refused pair is
 * an InvalidOptionsError naming both options (and, for the CLI's, both flags) and the values given.
 * Needs no infrastructure: nothing connects before `start()`.
 */
import { describe, expect, it } from 'vitest';
import { createRelay, Relay } from '../../../relay/relay.js';
import { RELAY_DEFAULTS, resolveRelayOptions, type RelayOptions } from '../../../relay/options.js';
import { isOutboxkitError } from '../../../src/errors.js';

const nullProducer = { connect: async () => {}, send: async () => {}, disconnect: async () => {} };
const base = (): RelayOptions => ({ connectionString: 'postgres://nobody@127.0.0.1:1/none', producer: nullProducer });

/** The InvalidOptionsError message `fn` throws (fails the test when it returns or throws another error). */
function refusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS'), String(err)).toBe(true);
    return (err as Error).message;
  }
  throw new Error('no InvalidOptionsError');
}

describe('brokerTimeoutMs and leaseMs', () => {
  it.each([
    ['equal', { leaseMs: 2_000, brokerTimeoutMs: 2_000 }, 2_000, 2_000],
    ['above the lease', { leaseMs: 2_000, brokerTimeoutMs: 5_000 }, 5_000, 2_000],
    ['a lease shortened below the default timeout', { leaseMs: 3_000 }, RELAY_DEFAULTS.brokerTimeoutMs, 3_000],
    ['a timeout raised to the default lease', { brokerTimeoutMs: 10_000 }, 10_000, RELAY_DEFAULTS.leaseMs],
  ])('refuses a timeout not below the lease (%s), naming both options, both flags and the values', (_, pair, t, l) => {
    const message = refusal(() => resolveRelayOptions({ ...base(), ...pair }));
    expect(message).toBe(
      `createRelay: brokerTimeoutMs (flag --broker-timeout-ms) must be below leaseMs (flag --lease-ms), got ${t} and ${l}: ` +
        'a send waits up to brokerTimeoutMs and the relay stands down only after leaseMs of failing, so a hung broker ' +
        'would keep it holding its lanes past their lease. Lower brokerTimeoutMs or raise leaseMs (defaults 5000 and 10000).',
    );
  });

  it('refuses it in new Relay() and createRelay() too, before anything connects', () => {
    const pair = { leaseMs: 1_000, brokerTimeoutMs: 1_000 };
    expect(refusal(() => new Relay({ ...base(), ...pair }))).toMatch(/brokerTimeoutMs .* must be below leaseMs/);
    expect(refusal(() => createRelay({ ...base(), ...pair }))).toMatch(/brokerTimeoutMs .* must be below leaseMs/);
  });

  it('accepts the edges: a timeout 1 ms below the lease, the shortest lease and timeout, the defaults', () => {
    expect(resolveRelayOptions({ ...base(), leaseMs: 2_000, brokerTimeoutMs: 1_999 })).toMatchObject({
      leaseMs: 2_000,
      brokerTimeoutMs: 1_999,
    });
    expect(resolveRelayOptions({ ...base(), leaseMs: 1_000, brokerTimeoutMs: 999 }).brokerTimeoutMs).toBe(999);
    expect(resolveRelayOptions({ ...base(), leaseMs: 1_000, brokerTimeoutMs: 100 }).leaseMs).toBe(1_000);
    expect(resolveRelayOptions({ ...base(), leaseMs: 5_001 }).brokerTimeoutMs).toBe(5_000);
    expect(resolveRelayOptions(base())).toMatchObject({ leaseMs: 10_000, brokerTimeoutMs: 5_000 });
  });

  it('names an option invalid alone before the rule between them', () => {
    expect(refusal(() => resolveRelayOptions({ ...base(), leaseMs: 10 }))).toBe(
      'createRelay: leaseMs must be an integer ≥ 1000, got 10.',
    );
    expect(refusal(() => resolveRelayOptions({ ...base(), leaseMs: 1_000, brokerTimeoutMs: 50 }))).toBe(
      'createRelay: brokerTimeoutMs must be an integer ≥ 100, got 50.',
    );
  });
});

describe('retryInitialMs and retryMaxMs', () => {
  it('refuses a cap below the first delay, naming both and the values', () => {
    expect(refusal(() => resolveRelayOptions({ ...base(), retryInitialMs: 500, retryMaxMs: 499 }))).toBe(
      'createRelay: retryMaxMs (499) must be at least retryInitialMs (500).',
    );
    // The default cap (10 s) below a first delay raised alone.
    expect(refusal(() => resolveRelayOptions({ ...base(), retryInitialMs: 20_000 }))).toMatch(
      /retryMaxMs \(10000\) must be at least retryInitialMs \(20000\)/,
    );
  });

  it('accepts a cap equal to the first delay', () => {
    expect(resolveRelayOptions({ ...base(), retryInitialMs: 500, retryMaxMs: 500 }).retryMaxMs).toBe(500);
  });
});

describe('producerOptions.metadataMaxAgeMs', () => {
  it('takes 100 ms to a day and refuses what is outside, naming the option', () => {
    const o = resolveRelayOptions({ ...base(), producerOptions: { metadataMaxAgeMs: 500 } });
    expect(o).toBeDefined();
    for (const metadataMaxAgeMs of [99, 86_400_001, 1.5]) {
      expect(refusal(() => resolveRelayOptions({ ...base(), producerOptions: { metadataMaxAgeMs } }))).toMatch(
        /producerOptions\.metadataMaxAgeMs.*from 100 to 86400000/,
      );
    }
  });
});
