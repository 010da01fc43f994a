/** Starts relays for a test and stops every one of them afterwards (a leaked relay fails the test). */
import { afterEach } from 'vitest';
import { Relay, type RelayOptions } from '../../relay/index.js';
import { testKafka } from './kafka.js';

const running = new Set<Relay>();

// The helper that starts relays stops them: whatever a test leaves running is stopped here, and a
// relay that fails to stop fails the test.
afterEach(async () => {
  const left = [...running];
  running.clear();
  await Promise.all(left.map((r) => r.stop({ timeoutMs: 10_000 })));
});

/** Starts a relay on the test database with fast test timings. */
export async function startRelay(
  url: string,
  options: Partial<RelayOptions> = {},
): Promise<Relay & { stopAndForget(): Promise<void> }> {
  const relay = new Relay({
    connectionString: url,
    kafka: testKafka('outboxkit-test-relay'),
    pollIntervalMs: 100,
    leaseMs: 2_000,
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
