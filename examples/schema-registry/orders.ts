/**
 * Avro events through a Confluent Schema Registry, with @kafkajs/confluent-schema-registry plugged
 * into outboxkit's serialisation hooks: `createOutbox({ encode })` on the writer side and
 * `createDedupConsumer({ decode })` on the reader side.
 *
 * NOT RUN in this repository's checks: it needs a Schema Registry (none runs here). It is
 * typechecked with the rest of the code (`npm run typecheck`). To run it, start a registry (for
 * example Confluent's `cp-schema-registry` image next to the Kafka broker) and:
 *
 *   SCHEMA_REGISTRY_URL=http://localhost:8081 npx tsx examples/schema-registry/orders.ts
 *
 * Environment: SCHEMA_REGISTRY_URL (required), DATABASE_URL, KAFKA_BROKERS.
 *
 * What it shows:
 * - the encoder runs inside `enqueue()`, before the INSERT: a payload the schema refuses throws
 *   `EventEncodingError` (code OUTBOXKIT_ENCODING_FAILED) and nothing is written;
 * - the Kafka value is the registry's wire format (magic byte 0, 4-byte schema id, Avro body),
 *   published byte for byte; any Confluent-compatible consumer can read it;
 * - the handler gets the decoded record from `await event.decoded()`; `event.value` keeps the bytes.
 */
import { SchemaRegistry, SchemaType } from '@kafkajs/confluent-schema-registry';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { createDedupConsumer } from '../../consumer/index.js';
import { createRelay } from '../../relay/index.js';
import { createOutbox, isOutboxkitError, migrate, type PayloadEncoder } from '../../src/index.js';
import { ensureTopics } from '../../src/kafka/index.js';

const SCHEMA = 'outboxkit_registry_example';
const TOPIC = 'registry-example-orders';

/** The Avro schema of `order.created` (registered under the subject `<topic>-value`). */
const ORDER_CREATED = {
  type: 'record',
  name: 'OrderCreated',
  namespace: 'com.example.orders',
  fields: [
    { name: 'orderId', type: 'string' },
    { name: 'totalCents', type: 'long' },
  ],
};

interface OrderCreated {
  orderId: string;
  totalCents: number;
}

async function main(): Promise<void> {
  const host = process.env.SCHEMA_REGISTRY_URL;
  if (!host) {
    console.error('Set SCHEMA_REGISTRY_URL to a running Confluent Schema Registry (see the header comment).');
    process.exitCode = 2;
    return;
  }
  const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  const kafka = new Kafka({
    clientId: 'registry-example',
    brokers: (process.env.KAFKA_BROKERS ?? '127.0.0.1:9092').split(','),
    logLevel: logLevel.WARN,
  });
  const registry = new SchemaRegistry({ host });
  const { id: orderCreatedId } = await registry.register(
    { type: SchemaType.AVRO, schema: JSON.stringify(ORDER_CREATED) },
    { subject: `${TOPIC}-value` },
  );

  // One schema per event type; the encoder learns the type (and topic, key, event id) of each event.
  const schemaIds: Record<string, number> = { 'order.created': orderCreatedId };
  const encode: PayloadEncoder = async (payload, { type }) => {
    const schemaId = schemaIds[type];
    if (schemaId === undefined) throw new Error(`no Avro schema for event type ${type}`);
    return registry.encode(schemaId, payload); // a Buffer in the registry's wire format
  };
  const outbox = createOutbox({ schema: SCHEMA, encode, cloudEvents: { source: '/orders' } });

  await migrate({ connectionString: databaseUrl, schema: SCHEMA });
  await ensureTopics(kafka, [{ topic: TOPIC }, { topic: `${TOPIC}.dlq` }]);

  const pool = new pg.Pool({ connectionString: databaseUrl });
  const relay = createRelay({ connectionString: databaseUrl, kafka, schema: SCHEMA });
  let received: (() => void) | undefined;
  const done = new Promise<void>((resolve) => (received = resolve));
  const consumer = createDedupConsumer({
    kafka,
    groupId: 'registry-example',
    topics: [TOPIC],
    database: pool,
    schema: SCHEMA,
    fromBeginning: true,
    decode: (value) => registry.decode(value),
    async handler({ event }) {
      const order = await event.decoded<OrderCreated>();
      console.log(`handled ${event.type} ${order.orderId}: ${order.totalCents} cents (${event.value?.length} bytes)`);
      received?.();
    },
  });

  const client = await pool.connect();
  try {
    // A payload the schema refuses: nothing is written, the transaction stays usable.
    await client.query('BEGIN');
    const refused = await outbox
      .enqueue(client, { topic: TOPIC, key: 'o-1', type: 'order.created', payload: { orderId: 'o-1' } })
      .catch((err: unknown) => err);
    console.log('refused:', isOutboxkitError(refused, 'OUTBOXKIT_ENCODING_FAILED') ? refused.message : refused);
    const order: OrderCreated = { orderId: 'o-1', totalCents: 4_200 };
    await outbox.enqueue(client, { topic: TOPIC, key: order.orderId, type: 'order.created', payload: order });
    await client.query('COMMIT');
  } finally {
    client.release();
  }

  await relay.start();
  await consumer.start();
  await done;
  await consumer.stop();
  await relay.stop();
  await pool.end();
}

await main();
