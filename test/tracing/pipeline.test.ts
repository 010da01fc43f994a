/**
 * The event path end to end, on the real PostgreSQL and Kafka with a real OpenTelemetry SDK
 * (NodeTracerProvider, in-memory exporter): a request span → enqueue() → relay → Kafka → dedup
 * consumer. The trace context is stored in the outbox row, published in the Kafka headers and
 * continued by the consumer's CONSUMER span; CloudEvents headers arrive valid; an encoder's bytes
 * reach Kafka byte for byte and the decode hook's result reaches the handler.
 */
import { context, propagation, SpanKind, trace } from '@opentelemetry/api';
import {
  InMemorySpanExporter,
  NodeTracerProvider,
  SimpleSpanProcessor,
  type ReadableSpan,
} from '@opentelemetry/sdk-trace-node';
import type { PoolClient } from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { ConsumedEvent } from '../../consumer/index.js';
import { createOutbox, readCloudEventAttributes } from '../../src/index.js';
import { ConsumerRegistry, createTopicsWithDlq } from '../consumer/support.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { readTopic } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

const exporter = new InMemorySpanExporter();
const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const consumers = new ConsumerRegistry();
let db: TestDatabase;

beforeAll(async () => {
  provider.register();
  db = await createTestDatabase();
});
afterEach(async () => {
  await consumers.stopAll();
});
afterAll(async () => {
  await db.drop();
  await provider.shutdown();
  trace.disable();
  context.disable();
  propagation.disable();
});

/** Runs `fn` in one pg transaction on its own client. */
async function inTransaction<T>(fn: (client: PoolClient) => Promise<T>): Promise<T> {
  const client = await db.pool.connect();
  try {
    await client.query('BEGIN');
    const out = await fn(client);
    await client.query('COMMIT');
    return out;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

async function storedRow(eventId: string): Promise<{ headers: Record<string, string>; payload: Buffer }> {
  const { rows } = await db.pool.query<{ headers: Record<string, string>; payload: Buffer }>(
    'SELECT headers, payload FROM outboxkit.outbox_events WHERE event_id = $1',
    [eventId],
  );
  return rows[0]!;
}

describe('W3C trace context from the request to the consumer handler', () => {
  it('the consumer span is a child of the request span; traceparent is in the row and the Kafka headers', async () => {
    const [topic] = await createTopicsWithDlq(['traced']);
    const outbox = createOutbox({ cloudEvents: { source: '/orders' } });
    const tracer = trace.getTracer('test-app');

    // The application: an HTTP request span around its transaction.
    let request: ReadableSpan | undefined;
    const eventId = await tracer.startActiveSpan('POST /orders', { kind: SpanKind.SERVER }, async (span) => {
      try {
        const [written] = await inTransaction((client) =>
          outbox.enqueue(client, {
            topic: topic!,
            key: 'order-1',
            type: 'order.created',
            payload: { orderId: 'order-1' },
            aggregateType: 'order',
            aggregateId: 'order-1',
          }),
        );
        return written!.eventId;
      } finally {
        span.end();
        request = span as unknown as ReadableSpan;
      }
    });
    const { traceId, spanId } = request!.spanContext();
    const traceparent = `00-${traceId}-${spanId}-01`;
    expect((await storedRow(eventId)).headers.traceparent).toBe(traceparent);

    const seen: { event: ConsumedEvent; activeTraceId: string | undefined }[] = [];
    await consumers.start({
      topics: [topic!],
      database: db.pool,
      async handler({ event }) {
        seen.push({ event, activeTraceId: trace.getActiveSpan()?.spanContext().traceId });
      },
    });
    await startRelay(db.url);
    await waitFor(() => seen.length === 1, { message: 'the handler ran' });

    // The consumer's span continues the request's trace, as a child of the request span.
    const consumerSpan = await waitFor(() =>
      exporter.getFinishedSpans().find((s) => s.name === `${topic} process` && s.kind === SpanKind.CONSUMER),
    );
    expect(consumerSpan.spanContext().traceId).toBe(traceId);
    expect(consumerSpan.parentSpanContext?.spanId).toBe(spanId);
    expect(consumerSpan.attributes['messaging.message.id']).toBe(eventId);
    expect(consumerSpan.attributes['messaging.destination.name']).toBe(topic);
    expect(seen[0]!.activeTraceId).toBe(traceId);

    // The Kafka message carries the same traceparent, and valid CloudEvents attributes.
    const [message] = await readTopic(
      topic!,
      (m) => m,
      (all) => all.length === 1,
    );
    expect(message!.headers.traceparent).toBe(traceparent);
    expect(seen[0]!.event.headers.traceparent).toBe(traceparent);
    const ce = readCloudEventAttributes(message!.headers);
    expect(ce).toMatchObject({
      specversion: '1.0',
      id: eventId,
      source: '/orders',
      type: 'order.created',
      subject: 'order-1',
      datacontenttype: 'application/json',
    });
    expect(Number.isNaN(Date.parse(ce!.time!))).toBe(false);
    expect(seen[0]!.event.cloudEvent()).toEqual(ce);
  });

  it('stores no trace header outside a span, or with traceContext: false', async () => {
    const outbox = createOutbox();
    const quiet = createOutbox({ traceContext: false });
    const [plain] = await inTransaction((c) => outbox.enqueue(c, { topic: 'orders', key: 'k', type: 't', payload: 1 }));
    const [off] = await trace.getTracer('test-app').startActiveSpan('POST /orders', async (span) => {
      try {
        return await inTransaction((c) => quiet.enqueue(c, { topic: 'orders', key: 'k', type: 't', payload: 1 }));
      } finally {
        span.end();
      }
    });
    expect((await storedRow(plain!.eventId)).headers).toEqual({});
    expect((await storedRow(off!.eventId)).headers).toEqual({});
  });
});

/** A stand-in binary encoding (Confluent wire format: magic byte 0, 4-byte schema id, body). */
function frame(schemaId: number, body: Buffer): Buffer {
  const header = Buffer.alloc(5);
  header.writeUInt32BE(schemaId, 1);
  return Buffer.concat([header, body]);
}

describe('serialisation hooks', () => {
  it('an encoder failure writes nothing (EventEncodingError) and leaves the transaction usable', async () => {
    const outbox = createOutbox({
      encode: async (payload) => {
        if ((payload as { bad?: boolean }).bad) throw new Error('field total is required by schema 7');
        return Buffer.from('ok');
      },
    });
    const count = async () =>
      (await db.pool.query<{ n: number }>('SELECT count(*)::int AS n FROM outboxkit.outbox_events')).rows[0]!.n;
    const before = await count();
    const err = await inTransaction(async (client) => {
      const e = await outbox
        .enqueue(client, [
          { topic: 'orders', key: 'a', type: 't', payload: { bad: false } },
          { topic: 'orders', key: 'b', type: 't', payload: { bad: true } },
        ])
        .catch((x: unknown) => x);
      await client.query('SELECT 1'); // still a live transaction: nothing was sent to it
      return e;
    });
    expect((err as { code?: string }).code).toBe('OUTBOXKIT_ENCODING_FAILED');
    expect((err as Error).message).toContain('schema 7');
    expect(await count()).toBe(before);
  });

  it('encoded bytes reach Kafka byte for byte; the decode hook result reaches the handler', async () => {
    const [topic] = await createTopicsWithDlq(['encoded']);
    // Bytes no text round trip survives: NUL, 0xff, a lone UTF-8 continuation byte.
    const body = Buffer.from([0x00, 0xff, 0x80, 0x7b, 0x22, 0xc3]);
    const outbox = createOutbox({
      encode: async (payload) => ({
        value: frame(7, Buffer.concat([body, Buffer.from(String((payload as { n: number }).n))])),
        contentType: 'application/vnd.test.framed',
      }),
    });
    const [written] = await inTransaction((c) =>
      outbox.enqueue(c, { topic: topic!, key: 'k1', type: 'thing.made', payload: { n: 42 } }),
    );
    const expected = frame(7, Buffer.concat([body, Buffer.from('42')]));
    const row = await storedRow(written!.eventId);
    expect(row.payload.equals(expected)).toBe(true);
    expect(row.headers['content-type']).toBe('application/vnd.test.framed');

    const decodedInHandler: unknown[] = [];
    await consumers.start({
      topics: [topic!],
      database: db.pool,
      decode: async (value) => ({ schemaId: value.readUInt32BE(1), tail: value.subarray(5 + body.length).toString() }),
      async handler({ event }) {
        decodedInHandler.push(await event.decoded(), event.value);
      },
    });
    await startRelay(db.url);
    await waitFor(() => decodedInHandler.length === 2, { message: 'the handler ran' });
    expect(decodedInHandler[0]).toEqual({ schemaId: 7, tail: '42' });
    expect((decodedInHandler[1] as Buffer).equals(expected)).toBe(true);
    const [message] = await readTopic(
      topic!,
      (m) => m,
      (all) => all.length === 1,
    );
    expect(message!.value!.equals(expected)).toBe(true);
    expect(message!.headers['content-type']).toBe('application/vnd.test.framed');
  });
});
