/**
 * The spans of one order, from the HTTP request to the consumer's handler, printed by the
 * OpenTelemetry SDK's ConsoleSpanExporter.
 *
 *   npx tsx examples/tracing/order-trace.ts
 *
 * Environment: DATABASE_URL (default the local server), KAFKA_BROKERS (default 127.0.0.1:9092).
 * It uses its own schema (`outboxkit_tracing_example`) and topic (`tracing-example-orders` and its
 * `.dlq`), creates them when missing, and stops everything it started.
 *
 * The trace: `POST /orders` (SERVER, the application's) → `insert order` (the application's, in the
 * transaction) — enqueue() stores the active context as `traceparent` in the outbox row; the relay
 * publishes the row's headers to Kafka as they are; the dedup consumer extracts the context and runs
 * the handler in `tracing-example-orders process` (CONSUMER, outboxkit's), whose parent is the
 * request span; `create shipment` (the application's) is a child of it. One trace id throughout.
 * A real service would get the SERVER span from @opentelemetry/instrumentation-http and the pg
 * spans from @opentelemetry/instrumentation-pg; they are written by hand here to keep the example
 * to installed packages.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { ConsoleSpanExporter, NodeTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-node';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { createDedupConsumer } from '../../consumer/index.js';
import { createRelay } from '../../relay/index.js';
import { createOutbox, migrate } from '../../src/index.js';
import { ensureTopics } from '../../src/kafka/index.js';

const SCHEMA = 'outboxkit_tracing_example';
const TOPIC = 'tracing-example-orders';

// 1. The SDK: register() installs the tracer provider, the AsyncLocalStorage context manager and
//    the W3C trace-context propagator globally; outboxkit uses whatever is registered.
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(new ConsoleSpanExporter())] });
provider.register();
const tracer = trace.getTracer('orders-service');

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const kafka = new Kafka({
  clientId: 'tracing-example',
  brokers: (process.env.KAFKA_BROKERS ?? '127.0.0.1:9092').split(','),
  logLevel: logLevel.NOTHING,
});
const outbox = createOutbox({ schema: SCHEMA, cloudEvents: { source: '/orders' } });

async function setUp(): Promise<void> {
  await migrate({ connectionString: databaseUrl, schema: SCHEMA });
  await ensureTopics(kafka, [
    { topic: TOPIC, numPartitions: 1 },
    { topic: `${TOPIC}.dlq`, numPartitions: 1 },
  ]);
}

/** The orders service: POST /orders writes the order's event in one transaction. */
function ordersHandler(pool: pg.Pool) {
  return (req: IncomingMessage, res: ServerResponse): void => {
    void tracer.startActiveSpan(
      'POST /orders',
      { kind: SpanKind.SERVER, attributes: { 'http.request.method': 'POST', 'url.path': '/orders' } },
      async (span) => {
        const client = await pool.connect();
        try {
          const orderId = `order-${Date.now()}`;
          await client.query('BEGIN');
          await tracer.startActiveSpan('insert order', async (insert) => {
            // (the business INSERT would go here, in the same transaction)
            await outbox.enqueue(client, {
              topic: TOPIC,
              key: orderId,
              type: 'order.created',
              payload: { orderId, totalCents: 4_200 },
              aggregateType: 'order',
              aggregateId: orderId,
            });
            insert.end();
          });
          await client.query('COMMIT');
          span.setAttribute('http.response.status_code', 201);
          res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ orderId }));
        } catch (err) {
          await client.query('ROLLBACK').catch(() => {});
          span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).message });
          res.writeHead(500).end();
        } finally {
          client.release();
          span.end();
        }
      },
    );
  };
}

async function main(): Promise<void> {
  await setUp();
  const pool = new pg.Pool({ connectionString: databaseUrl });
  const server = createServer(ordersHandler(pool));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const relay = createRelay({ connectionString: databaseUrl, kafka, schema: SCHEMA, pollIntervalMs: 100 });
  let shipped: ((orderId: string) => void) | undefined;
  let shippedId: string | undefined;
  const consumer = createDedupConsumer({
    kafka,
    groupId: 'tracing-example-shipping',
    topics: [TOPIC],
    database: pool,
    schema: SCHEMA,
    fromBeginning: true,
    async handler({ event }) {
      // Runs inside outboxkit's CONSUMER span: this span is its child.
      await tracer.startActiveSpan('create shipment', async (span) => {
        const { orderId } = await event.decoded<{ orderId: string }>();
        span.setAttribute('order.id', orderId);
        span.end();
        shippedId = orderId;
      });
    },
  });
  // After the commit (and the end of outboxkit's span), not from inside the handler.
  consumer.on('consumer:applied', () => {
    if (shippedId !== undefined) shipped?.(shippedId);
  });
  await relay.start();
  await consumer.start();
  try {
    const { port } = server.address() as AddressInfo;
    const response = await fetch(`http://127.0.0.1:${port}/orders`, { method: 'POST' });
    const { orderId } = (await response.json()) as { orderId: string };
    // Wait for this order (an earlier run's events may be delivered first).
    await new Promise<void>((resolve) => {
      shipped = (id) => {
        if (id === orderId) resolve();
      };
    });
    console.log(`\norder ${orderId}: HTTP ${response.status}, shipped; spans above share one traceId`);
  } finally {
    await consumer.stop();
    await relay.stop();
    server.close();
    await pool.end();
    await provider.shutdown();
  }
}

await main();
