/**
 * The optional `@opentelemetry/api` loader (src/tracing.ts): absent → undefined, loaded once; with
 * the real API, `tracingEnabled()` follows the registered provider and `activeContextHeaders()`
 * carries the active span as W3C `traceparent`. A real SDK, no mock of OpenTelemetry.
 */
import { createRequire } from 'node:module';
import { context, propagation, trace } from '@opentelemetry/api';
import { InMemorySpanExporter, NodeTracerProvider, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-node';
import { afterEach, describe, expect, it } from 'vitest';
import {
  activeContextHeaders,
  createOpenTelemetryLoader,
  loadOpenTelemetry,
  wrapOpenTelemetry,
} from '../../../src/tracing.js';

function notFound(id: string): never {
  throw Object.assign(new Error(`Cannot find module '${id}'`), { code: 'MODULE_NOT_FOUND' });
}

afterEach(() => {
  trace.disable();
  context.disable();
  propagation.disable();
});

describe('createOpenTelemetryLoader', () => {
  it('returns undefined when @opentelemetry/api cannot be resolved, and tries only once', () => {
    const calls: string[] = [];
    const load = createOpenTelemetryLoader((id) => {
      calls.push(id);
      return notFound(id);
    });
    expect(load()).toBeUndefined();
    expect(load()).toBeUndefined();
    expect(calls).toEqual(['@opentelemetry/api']);
  });

  it('returns undefined for a module that is not the OpenTelemetry API', () => {
    expect(createOpenTelemetryLoader(() => ({ trace: {} }))()).toBeUndefined();
    expect(wrapOpenTelemetry(null)).toBeUndefined();
  });

  it('loads the installed API through require, once', () => {
    const real = createRequire(import.meta.url);
    let calls = 0;
    const load = createOpenTelemetryLoader((id) => {
      calls += 1;
      return real(id);
    });
    const otel = load();
    expect(otel?.api.trace).toBeDefined();
    expect(load()).toBe(otel);
    expect(calls).toBe(1);
    expect(loadOpenTelemetry()).toBeDefined();
  });
});

describe('tracingEnabled', () => {
  it('is false with the no-op provider and true once an SDK provider is registered', async () => {
    const otel = loadOpenTelemetry()!;
    expect(otel.tracingEnabled()).toBe(false);
    const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(new InMemorySpanExporter())] });
    provider.register();
    try {
      expect(otel.tracingEnabled()).toBe(true);
    } finally {
      await provider.shutdown();
    }
    trace.disable();
    expect(otel.tracingEnabled()).toBe(false);
  });
});

describe('activeContextHeaders', () => {
  it('is undefined without an active span, and the W3C traceparent of the active span with one', async () => {
    const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(new InMemorySpanExporter())] });
    provider.register();
    try {
      expect(activeContextHeaders()).toBeUndefined();
      const tracer = trace.getTracer('test');
      await tracer.startActiveSpan('request', async (span) => {
        await Promise.resolve(); // still active across an await (AsyncLocalStorage context manager)
        const headers = activeContextHeaders();
        const { traceId, spanId } = span.spanContext();
        expect(headers).toEqual({ traceparent: `00-${traceId}-${spanId}-01` });
        span.end();
      });
      expect(activeContextHeaders()).toBeUndefined();
    } finally {
      await provider.shutdown();
    }
  });

  it('is undefined with the API present but nothing registered, even inside a span call', () => {
    // No provider: the API's no-op tracer gives non-recording spans with an invalid context.
    trace.getTracer('test').startActiveSpan('request', (span) => {
      expect(activeContextHeaders()).toBeUndefined();
      span.end();
    });
  });
});
