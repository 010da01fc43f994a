/**
 * The shipping service: a dedup consumer of `order.created` that creates one shipment per order.
 * The inbox row and the shipment commit in one transaction, so redeliveries (relay republish,
 * rebalance, crash) never create a second shipment.
 *
 *   npm run example:shipping
 *
 * Environment: DATABASE_URL, KAFKA_BROKERS, ORDERS_TOPIC (default `orders`; its dead-letter topic
 * `<topic>.dlq` must exist too), SHIPPING_GROUP (default `shipping`).
 */
import { fileURLToPath } from 'node:url';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { createDedupConsumer } from '../../consumer/index.js';
import { migrate } from '../../src/index.js';
import { ensureDemoSchema } from './db.js';

/** Starts the shipping consumer; returns it with a count of the duplicates it absorbed. */
export async function startShipping(options: { pool: pg.Pool; kafka: Kafka; topic: string; groupId: string }) {
  let duplicates = 0;
  let applied = 0;
  const consumer = createDedupConsumer({
    kafka: options.kafka,
    groupId: options.groupId,
    topics: [options.topic],
    database: options.pool,
    fromBeginning: true,
    async handler({ tx, event }) {
      const order = event.json() as { orderId: string };
      await tx.query('INSERT INTO orders_demo.shipments (order_id, event_id) VALUES ($1, $2)', [
        order.orderId,
        event.id,
      ]);
    },
  });
  consumer.on('consumer:duplicate', () => duplicates++);
  consumer.on('consumer:applied', () => applied++);
  await consumer.start();
  return { consumer, stats: () => ({ duplicates, applied }) };
}

async function main(): Promise<void> {
  const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const brokers = (process.env.KAFKA_BROKERS ?? '127.0.0.1:9092').split(',');
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 });
  await migrate({ connectionString: databaseUrl });
  await ensureDemoSchema(pool);
  const kafka = new Kafka({ clientId: 'shipping', brokers, logLevel: logLevel.NOTHING });
  const { consumer, stats } = await startShipping({
    pool,
    kafka,
    topic: process.env.ORDERS_TOPIC ?? 'orders',
    groupId: process.env.SHIPPING_GROUP ?? 'shipping',
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
