/**
 * consumer/tracing.ts `runHandler` with a real OpenTelemetry SDK (NodeTracerProvider and an
 * in-memory exporter): the CONSUMER span, its parent from the headers, its attributes, errors;
 * no span when tracing is off or no provider is registered; the decode hook reaching the handler.
 */
import { context, propagation, SpanKind, SpanStatusCode, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, NodeTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-node';
import type { KafkaMessage } from 'kafkajs';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { toConsumedEvent } from '../../../consumer/consumed-event.js';
import type { HandlerContext } from '../../../consumer/options.js';
import { runHandler } from '../../../consumer/tracing.js';
import type { DatabaseHandle } from '../../../src/database.js';

const ID = '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b';
const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT_ID = '00f067aa0ba902b7';

function ctxOf(headers: Record<string, string>, value: Buffer | null = Buffer.from('{"n":1}')) {
  const message: KafkaMessage = {
    key: Buffer.from('order-1'),
    value,
    timestamp: '0',
    attributes: 0,
    offset: '41',
    headers: {},
  };
  const event = toConsumedEvent('orders', 2, message, ID, { 'event-type': 'order.created', ...headers });
  return {
    tx: {},
    event,
    signal: new AbortController().signal,
    attempt: 1,
  } as unknown as HandlerContext<DatabaseHandle>;
}

const options = { groupId: 'shipping', decode: undefined, tracing: true };
let exporter: InMemorySpanExporter;
let provider: NodeTracerProvider | undefined;

function register(): void {
  exporter = new InMemorySpanExporter();
  provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register();
}

beforeEach(() => {
  exporter = new InMemorySpanExporter();
});
afterEach(async () => {
  await provider?.shutdown();
  provider = undefined;
  trace.disable();
  context.disable();
  propagation.disable();
});

describe('runHandler with a tracer provider', () => {
  it('runs the handler in a CONSUMER span that is a child of the traceparent header', async () => {
    register();
    let activeInHandler: string | undefined;
    await runHandler(
      async () => {
        activeInHandler = trace.getActiveSpan()?.spanContext().spanId;
      },
      ctxOf({ traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` }),
      options,
    );
    const [span, ...others] = exporter.getFinishedSpans();
    expect(others).toEqual([]);
    expect(span!.name).toBe('orders process');
    expect(span!.kind).toBe(SpanKind.CONSUMER);
    expect(span!.spanContext().traceId).toBe(TRACE_ID);
    expect(span!.parentSpanContext?.spanId).toBe(PARENT_ID);
    expect(span!.parentSpanContext?.isRemote).toBe(true);
    expect(activeInHandler).toBe(span!.spanContext().spanId);
    expect(span!.instrumentationScope.name).toBe('outboxkit');
    expect(span!.status.code).toBe(SpanStatusCode.UNSET);
    expect(span!.attributes).toMatchObject({
      'messaging.system': 'kafka',
      'messaging.destination.name': 'orders',
      'messaging.operation': 'process',
      'messaging.operation.type': 'process',
      'messaging.message.id': ID,
      'messaging.kafka.consumer.group': 'shipping',
      'messaging.consumer.group.name': 'shipping',
      'messaging.kafka.destination.partition': 2,
      'messaging.destination.partition.id': '2',
      'messaging.kafka.message.offset': 41,
      'messaging.kafka.message.key': 'order-1',
      'outboxkit.event.type': 'order.created',
      'outboxkit.attempt': 1,
    });
  });

  it('starts a new trace without a traceparent header', async () => {
    register();
    await runHandler(async () => {}, ctxOf({}), options);
    const [span] = exporter.getFinishedSpans();
    expect(span!.parentSpanContext).toBeUndefined();
    expect(span!.spanContext().traceId).not.toBe(TRACE_ID);
  });

  it('records what the handler throws, sets status ERROR and rethrows the same error', async () => {
    register();
    const boom = Object.assign(new Error('no stock'), { code: 'OUT_OF_STOCK' });
    const err = await runHandler(() => Promise.reject(boom), ctxOf({}), options).catch((e: unknown) => e);
    expect(err).toBe(boom);
    const [span] = exporter.getFinishedSpans();
    expect(span!.status).toEqual({ code: SpanStatusCode.ERROR, message: 'no stock' });
    expect(span!.attributes['error.type']).toBe('OUT_OF_STOCK');
    expect(span!.events.map((e) => e.name)).toEqual(['exception']);
    expect(span!.ended).toBe(true);
  });

  it('starts no span with tracing: false', async () => {
    register();
    let ran = false;
    await runHandler(
      async () => {
        ran = true;
        expect(trace.getActiveSpan()).toBeUndefined();
      },
      ctxOf({ traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` }),
      { ...options, tracing: false },
    );
    expect(ran).toBe(true);
    expect(exporter.getFinishedSpans()).toEqual([]);
  });
});

describe('runHandler without a tracer provider', () => {
  it('calls the handler directly: no span, no active context', async () => {
    let ran = false;
    await runHandler(
      async () => {
        ran = true;
        expect(trace.getActiveSpan()).toBeUndefined();
      },
      ctxOf({ traceparent: `00-${TRACE_ID}-${PARENT_ID}-01` }),
      options,
    );
    expect(ran).toBe(true);
  });
});

describe('runHandler: decode hook', () => {
  it('gives event.decoded() the consumer’s decoder; value and json() stay', async () => {
    const seen: unknown[] = [];
    await runHandler(
      async ({ event }) => {
        seen.push(await event.decoded(), await event.decoded(), event.json(), event.value?.toString());
      },
      ctxOf({}),
      { ...options, decode: (value: Buffer) => ({ decodedFrom: value.toString() }) },
    );
    expect(seen).toEqual([{ decodedFrom: '{"n":1}' }, { decodedFrom: '{"n":1}' }, { n: 1 }, '{"n":1}']);
  });
});
