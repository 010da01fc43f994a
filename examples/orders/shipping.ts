/**
 * The shipping service: a dedup consumer of `order.created` that creates one shipment per order.
 * The inbox row and the shipment commit in one transaction, so redeliveries (relay republish,
 * rebalance, crash) never create a second shipment.
 *
 *   npm run example:shipping
 *
 * Environment: DATABASE_URL, KAFKA_BROKERS, ORDERS_TOPIC (default `orders`; its dead-letter topic
 * `<topic>.dlq` must exist too), SHIPPING_GROUP (default `shipping`), SHIPPING_SESSION_TIMEOUT_MS
 * and SHIPPING_HEARTBEAT_INTERVAL_MS (the consumer's defaults when unset; the chaos harness sets
 * them short so that rebalances after a crash take seconds), OUTBOXKIT_KAFKA_CLIENT (`platformatic`
 * runs the consumer on @platformatic/kafka, anything else on kafkajs: docs/kafka.md, "Choosing a
 * client").
 *
 * Orders whose cart id starts with `undeliverable-` fail every attempt and go to the dead-letter
 * topic (DESIGN G5), so that a run has dead letters to account for.
 *
 * `CHAOS_SABOTAGE` is test-only (the chaos harness's self-test, docs/chaos.md): never set it.
 */
import { fileURLToPath } from 'node:url';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { createDedupConsumer } from '../../consumer/index.js';
import { migrate } from '../../src/index.js';
import { createPlatformaticClient, type KafkaClient } from '../../src/kafka/index.js';
import { ensureDemoSchema } from './db.js';

/** Starts the shipping consumer; returns it with a count of the duplicates it absorbed. */
export async function startShipping(options: {
  pool: pg.Pool;
  /** A kafkajs `Kafka`, or outboxkit's client over @platformatic/kafka. */
  kafka: Kafka | KafkaClient;
  topic: string;
  groupId: string;
  /** Kafka group session timeout, in ms. @defaultValue the consumer's (30_000) */
  sessionTimeoutMs?: number;
  /** Heartbeat interval, in ms. @defaultValue the consumer's (3_000) */
  heartbeatIntervalMs?: number;
  /** The consumer's `recordProgress` (partition progress in PostgreSQL). @defaultValue false */
  recordProgress?: boolean;
  /**
   * Test-only: delete the inbox row in the handler's transaction, as if the effect were applied
   * without recording the event, so every redelivery applies it again (breaks DESIGN G4 on
   * purpose; `npm run chaos -- --sabotage no-dedup` must report it). @defaultValue false
   */
  sabotageNoDedup?: boolean;
}) {
  let duplicates = 0;
  let applied = 0;
  const consumer = createDedupConsumer({
    kafka: options.kafka,
    groupId: options.groupId,
    topics: [options.topic],
    database: options.pool,
    fromBeginning: true,
    ...(options.sessionTimeoutMs === undefined ? {} : { sessionTimeoutMs: options.sessionTimeoutMs }),
    ...(options.heartbeatIntervalMs === undefined ? {} : { heartbeatIntervalMs: options.heartbeatIntervalMs }),
    recordProgress: options.recordProgress ?? false,
    async handler({ tx, event }) {
      const order = event.json() as { orderId: string; cartId: string; customerId?: string; customerVersion?: number };
      if (order.cartId.startsWith('undeliverable-')) throw new Error('No carrier delivers to this address.');
      // ON CONFLICT counts a second application instead of failing: a broken dedup shows as
      // applications > 1 (the chaos harness checks it) rather than as a dead letter.
      await tx.query(
        `INSERT INTO orders_demo.shipments (order_id, event_id, customer_id, customer_version) VALUES ($1, $2, $3, $4)
         ON CONFLICT (order_id) DO UPDATE SET applications = orders_demo.shipments.applications + 1`,
        [order.orderId, event.id, order.customerId ?? null, order.customerVersion ?? null],
      );
      if (options.sabotageNoDedup)
        await tx.query('DELETE FROM outboxkit.inbox WHERE consumer_group = $1 AND event_id = $2', [
          options.groupId,
          event.id,
        ]);
    },
  });
  consumer.on('consumer:duplicate', () => duplicates++);
  consumer.on('consumer:applied', () => applied++);
  await consumer.start();
  return { consumer, stats: () => ({ duplicates, applied }) };
}

function optionalInt(value: string | undefined): number | undefined {
  return value === undefined || value === '' ? undefined : Number(value);
}

async function main(): Promise<void> {
  const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const brokers = (process.env.KAFKA_BROKERS ?? '127.0.0.1:9092').split(',');
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 });
  await migrate({ connectionString: databaseUrl });
  await ensureDemoSchema(pool);
  const kafka =
    process.env.OUTBOXKIT_KAFKA_CLIENT === 'platformatic'
      ? createPlatformaticClient({ clientId: 'shipping', brokers })
      : new Kafka({ clientId: 'shipping', brokers, logLevel: logLevel.NOTHING });
  const { consumer, stats } = await startShipping({
    pool,
    kafka,
    topic: process.env.ORDERS_TOPIC ?? 'orders',
    groupId: process.env.SHIPPING_GROUP ?? 'shipping',
    sessionTimeoutMs: optionalInt(process.env.SHIPPING_SESSION_TIMEOUT_MS),
    heartbeatIntervalMs: optionalInt(process.env.SHIPPING_HEARTBEAT_INTERVAL_MS),
    recordProgress: process.env.SHIPPING_RECORD_PROGRESS === '1',
    sabotageNoDedup: (process.env.CHAOS_SABOTAGE ?? '').split(',').includes('no-dedup'),
  });
  // kafkajs gave up on the consumer (an error it does not retry): exit, so that the supervisor
  // (systemd, Kubernetes, the chaos harness) starts a fresh process, instead of living on idle.
  consumer.on('consumer:crash', ({ restart }) => {
    if (!restart) {
      console.error('SHIPPING_CRASHED: the Kafka consumer stopped for good; exiting');
      process.exit(1);
    }
  });
  console.log('SHIPPING_READY');
  const shutdown = async () => {
    await consumer.stop();
    await pool.end();
    // The demo reads this line for its report.
    console.log(`SHIPPING_STATS ${JSON.stringify(stats())}`);
    process.exit(0);
  };
  process.once('SIGTERM', () => void shutdown());
  process.once('SIGINT', () => void shutdown());
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
