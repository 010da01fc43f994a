/** Starts relays for a test and stops every one of them afterwards (a leaked relay fails the test). */
import { afterEach } from 'vitest';
import { Relay, type RelayOptions } from '../../relay/index.js';
import { testRelayKafka } from './kafka.js';

const running = new Set<Relay>();

// The helper that starts relays stops them: whatever a test leaves running is stopped here, and a
// relay that fails to stop fails the test.
afterEach(async () => {
  const left = [...running];
  running.clear();
  await Promise.all(left.map((r) => r.stop({ timeoutMs: 10_000 })));
});

/**
 * Starts a relay on the test database with fast test timings, on the client library
 * `OUTBOXKIT_KAFKA_CLIENT` names (kafkajs by default: test/helpers/kafka.ts): a 2 s lease, and a broker timeout
 * below it (1.5 s: createRelay refuses one that is not). A test that sets `leaseMs` below 1.5 s
 * sets `brokerTimeoutMs` too.
 */
export async function startRelay(
  url: string,
  options: Partial<RelayOptions> = {},
): Promise<Relay & { stopAndForget(): Promise<void> }> {
  const relay = new Relay({
    connectionString: url,
    kafka: testRelayKafka('outboxkit-test-relay'),
    pollIntervalMs: 100,
    leaseMs: 2_000,
    brokerTimeoutMs: 1_500,
    ...options,
  }) as Relay & { stopAndForget(): Promise<void> };
  relay.stopAndForget = async () => {
    await relay.stop();
    running.delete(relay);
  };
  running.add(relay);
  await relay.start();
  return relay;
}

/**
 * Resolves after `count` more passes of `relay` (its `relay:pass` events) that match `which`
 * (every pass by default); rejects after `timeoutMs`. For tests that need passes to run while
 * something holds (an open transaction), instead of a fixed sleep.
 */
export function passes(
  relay: Relay,
  count: number,
  options: { which?: (pass: { read: number; sent: number }) => boolean; timeoutMs?: number } = {},
): Promise<void> {
  const { which = () => true, timeoutMs = 20_000 } = options;
  return new Promise((resolve, reject) => {
    let seen = 0;
    const timer = setTimeout(() => {
      relay.off('relay:pass', onPass);
      reject(new Error(`${seen} of ${count} relay passes within ${timeoutMs} ms`));
    }, timeoutMs);
    function onPass(pass: { read: number; sent: number }): void {
      if (!which(pass) || ++seen < count) return;
      clearTimeout(timer);
      relay.off('relay:pass', onPass);
      resolve();
    }
    relay.on('relay:pass', onPass);
  });
}
