/**
 * Brokers that cannot be reached (nothing listens on 127.0.0.1:1) are said plainly, alike on both
 * clients: `BrokerUnavailableError` (OUTBOXKIT_BROKER_UNAVAILABLE, retriable) "Kafka brokers could
 * not be reached (127.0.0.1:1): connect ECONNREFUSED 127.0.0.1:1", the client's error as `cause`,
 * from a connect of the client's admin, producer and group consumer, in the relay's and the dedup
 * consumer's logs, and in the relay daemon's (src/kafka/unreachable.ts). @platformatic/kafka said
 * only "metadata failed 6 times." before, the socket's reason four causes down.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDedupConsumer } from '../../consumer/index.js';
import { Relay } from '../../relay/index.js';
import { isOutboxkitError } from '../../src/errors.js';
import { createKafkajsClient } from '../../src/kafka/kafkajs/client.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import type { KafkaClient } from '../../src/kafka/types.js';
import type { Logger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { spawnRelay } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';

const CLOSED = '127.0.0.1:1';
const SAID = /^Kafka brokers could not be reached \(127\.0\.0\.1:1\): connect ECONNREFUSED 127\.0\.0\.1:1\./;
const CLIENTS = ['kafkajs', 'platformatic'] as const;

/** A client of `name` on the closed port, with few, short client retries. */
function closedClient(name: (typeof CLIENTS)[number]): KafkaClient {
  const config = { clientId: 'unreachable', brokers: [CLOSED], retry: { retries: 0, initialRetryTime: 50 } };
  return name === 'platformatic'
    ? createPlatformaticClient(config)
    : createKafkajsClient(config, { logLevel: 'nothing' });
}

/** A logger that keeps the error of every warning. */
function warnings(): { logger: Logger; errors: unknown[] } {
  const errors: unknown[] = [];
  const none = () => {};
  const logger = {
    debug: none,
    info: none,
    error: none,
    warn: (fields: { err?: unknown }) => void errors.push(fields?.err),
  };
  return { logger: logger as Logger, errors };
}

const saysUnreachable = (err: unknown) =>
  isOutboxkitError(err, 'OUTBOXKIT_BROKER_UNAVAILABLE') && SAID.test(err.message) && err.cause !== undefined;

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

describe.each(CLIENTS)('brokers that cannot be reached, on %s', (name) => {
  it("the admin's, the producer's and the group consumer's connect say so, retriable, with the client's error as cause", async () => {
    const client = closedClient(name);
    const parts = [client.admin(), client.producer(), client.groupConsumer({ groupId: 'unreachable' })];
    const errors = await Promise.all(
      parts.map((part) =>
        part.connect().then(
          () => undefined,
          (e: unknown) => e,
        ),
      ),
    );
    await Promise.all(parts.map((part) => part.disconnect().catch(() => undefined)));
    for (const err of errors) {
      expect(saysUnreachable(err), String(err)).toBe(true);
      expect((err as { retriable: boolean }).retriable).toBe(true);
      expect(client.isRetriable(err)).toBe(true);
    }
  });

  it("the dedup consumer's start logs it while it waits, and the relay's producer connect logs it", async () => {
    const consumerLog = warnings();
    const consumer = createDedupConsumer({
      kafka: closedClient(name),
      groupId: 'unreachable',
      topics: ['unreachable'],
      database: db.pool,
      handler: async () => {},
      retryInitialMs: 50,
      retryMaxMs: 100,
      logger: consumerLog.logger,
    });
    const starting = consumer.start().catch(() => undefined);
    const relayLog = warnings();
    const relay = new Relay({
      connectionString: db.url,
      kafka: closedClient(name),
      leaseMs: 2_000,
      brokerTimeoutMs: 1_500,
      logger: relayLog.logger,
    });
    try {
      await relay.start();
      await waitFor(() => consumerLog.errors.some(saysUnreachable), {
        timeoutMs: 15_000,
        message: () => consumerLog.errors.map(String).join('\n'),
      });
      await waitFor(() => relayLog.errors.some(saysUnreachable), {
        timeoutMs: 15_000,
        message: () => relayLog.errors.map(String).join('\n'),
      });
    } finally {
      await Promise.all([consumer.stop(), relay.stop()]);
      await starting;
    }
  });

  it('the relay daemon logs it', async () => {
    const relay = spawnRelay(db.url, { KAFKA_BROKERS: CLOSED }, [
      ...['--kafka-client', name, '--kafka-retries', '0', '--kafka-retry-initial-ms', '50'],
    ]);
    try {
      await waitFor(
        () =>
          relay.output
            .join('')
            .includes('"Kafka brokers could not be reached (127.0.0.1:1): connect ECONNREFUSED 127.0.0.1:1.'),
        {
          timeoutMs: 20_000,
          message: () => relay.output.join('').slice(-2_000),
        },
      );
    } finally {
      relay.proc.kill('SIGTERM');
      await relay.exited;
    }
  });
});
