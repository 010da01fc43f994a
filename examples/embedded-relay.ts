/**
 * The relay inside an application process, beside (or instead of) the `outboxkit relay` daemon.
 *
 * The pattern:
 * 1. Kafka settings from the environment in one line (`kafkaConfigFromEnv()`: KAFKA_BROKERS,
 *    KAFKA_SASL_*, KAFKA_SSL_*, KAFKA_CONFIG_FILE; see docs/kafka.md). Log its `description` and
 *    `warnings`, never the config itself.
 * 2. `new Relay({ pool, kafka, producerOptions })` on the application's pool (the relay never ends
 *    a pool it was given) and `await relay.start()` at boot. Several processes may each run one:
 *    they share the 64 lanes through leases.
 * 3. Metrics and readiness on the application's own registry and health endpoint
 *    (`relayMetrics`, `relayReadiness`).
 * 4. Shutdown belongs to the application: on SIGTERM, stop taking work, `await relay.stop()` (the
 *    pass in flight finishes, lanes are released for the other relays), then end the pool. The
 *    relay installs no signal handler of its own.
 *
 * Run it alone: `DATABASE_URL=... KAFKA_BROKERS=... npx tsx examples/embedded-relay.ts`.
 */
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { pino, type Logger as PinoLogger } from 'pino';
import client from 'prom-client';
import { Relay, relayMetrics, relayReadiness, type RelayReadiness } from '../relay/index.js';
import { kafkaConfigFromEnv } from '../src/kafka/index.js';

export interface EmbeddedRelay {
  relay: Relay;
  /** For the application's `/readyz`: PostgreSQL answers, the Kafka producer is connected and the relay does not stand down. */
  ready: () => Promise<RelayReadiness>;
  /** Drains and stops the relay (idempotent). The pool stays open: the application ends it. */
  stop: () => Promise<void>;
}

/**
 * Starts a relay on the application's `pool`, registering its metrics on `registry`.
 *
 * @param options.env - where the Kafka settings are read. @defaultValue process.env
 * @throws InvalidKafkaConfigError for bad Kafka settings (naming the variable), before any connection.
 */
export async function startEmbeddedRelay(options: {
  pool: pg.Pool;
  registry: client.Registry;
  logger: PinoLogger;
  env?: Record<string, string | undefined>;
  schema?: string;
}): Promise<EmbeddedRelay> {
  const { pool, registry, logger } = options;
  const kafkaSettings = kafkaConfigFromEnv({ env: options.env, defaults: { clientId: 'orders-service-relay' } });
  logger.info({ kafka: kafkaSettings.description }, 'Kafka connection settings');
  for (const warning of kafkaSettings.warnings) logger.warn({}, warning);

  const relay = new Relay({
    pool,
    kafka: new Kafka({ ...kafkaSettings.kafkaConfig, logLevel: logLevel.WARN }),
    producerOptions: kafkaSettings.producer,
    schema: options.schema,
    logger: logger.child({ component: 'outboxkit-relay' }),
  });
  relayMetrics(relay, pool, registry);
  relay.on('relay:failed', ({ eventId, parked }) => {
    if (parked) logger.error({ eventId }, 'outbox event parked: see `outboxkit parked list`');
  });
  await relay.start();
  return { relay, ready: relayReadiness(relay, pool), stop: () => relay.stop({ timeoutMs: 10_000 }) };
}

async function main(): Promise<void> {
  const logger = pino({ name: 'orders-service' });
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 10 });
  const registry = new client.Registry();
  const embedded = await startEmbeddedRelay({ pool, registry, logger });
  logger.info({ relayId: embedded.relay.relayId }, 'relay running inside the service');

  // The application's own shutdown: first signal drains, a second one exits at once.
  let stopping = false;
  const shutdown = (signal: NodeJS.Signals) => {
    if (stopping) process.exit(130);
    stopping = true;
    logger.info({ signal }, 'shutting down');
    setTimeout(() => process.exit(1), 15_000).unref(); // watchdog
    void embedded
      .stop()
      .then(() => pool.end())
      .then(() => process.exit(0));
  };
  process.on('SIGTERM', shutdown);
  process.on('SIGINT', shutdown);
}

if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
