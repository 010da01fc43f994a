/**
 * The one place outboxkit loads `@opentelemetry/api`, an OPTIONAL peer dependency.
 *
 * Library code never imports it statically (an application without it must still load outboxkit):
 * {@link loadOpenTelemetry} requires it once, synchronously, through `createRequire`, and returns
 * `undefined` when it cannot be loaded. Only types are imported here (erased at build time).
 *
 * Two copies of the API in one process (the CommonJS build loaded here, the ES module build the
 * application imports) share their state: the API keeps its global tracer provider, context
 * manager and propagator on `globalThis` under a versioned `Symbol.for` key, and its context keys
 * are `Symbol.for` symbols too (see @opentelemetry/api `internal/global-utils` and
 * `context/context.ts`). So what the application registers is what outboxkit sees.
 *
 * Cost when tracing is off: with the API absent, one memoised `undefined` check per call site; with
 * the API present but no tracer provider registered, {@link OpenTelemetry.tracingEnabled} is two
 * property reads and a comparison, with no allocation.
 */
import { createRequire } from 'node:module';
import type * as Api from '@opentelemetry/api';

/** The `@opentelemetry/api` module as outboxkit uses it. */
export type OpenTelemetryApi = typeof Api;

/** `@opentelemetry/api`, loaded, with the few helpers outboxkit needs. */
export interface OpenTelemetry {
  readonly api: OpenTelemetryApi;
  /**
   * True when the application registered a tracer provider (an SDK), so spans outboxkit starts are
   * recorded. False with the API's no-op provider: then outboxkit starts no span at all.
   */
  tracingEnabled(): boolean;
  /**
   * outboxkit's tracer (instrumentation scope `outboxkit`) from the provider registered now. Not
   * cached here: the API's ProxyTracer keeps the first delegate it saw, so a provider registered
   * again (tests, hot reload) would be missed; the SDK caches tracers by name itself.
   */
  tracer(): Api.Tracer;
}

/** The instrumentation scope name of outboxkit's spans. */
export const TRACER_NAME = 'outboxkit';

/** How a module is loaded: `require` of the calling module, or a stand-in in tests. */
export type ModuleLoader = (id: string) => unknown;

/**
 * Wraps a loaded `@opentelemetry/api` module.
 *
 * @returns undefined when `api` does not look like `@opentelemetry/api` 1.x.
 */
export function wrapOpenTelemetry(api: unknown): OpenTelemetry | undefined {
  const m = api as Partial<OpenTelemetryApi> | null | undefined;
  if (
    typeof m !== 'object' ||
    m === null ||
    typeof m.trace?.getTracerProvider !== 'function' ||
    typeof m.context?.active !== 'function' ||
    typeof m.propagation?.inject !== 'function' ||
    typeof m.ProxyTracerProvider !== 'function'
  ) {
    return undefined;
  }
  const otel = m as OpenTelemetryApi;
  // The API's no-op provider: what an unregistered ProxyTracerProvider delegates to (a singleton
  // of this copy of the API). When nothing is registered, trace.getTracerProvider() is this copy's
  // own proxy, whose delegate is that same singleton.
  const noop = new otel.ProxyTracerProvider().getDelegate();
  return {
    api: otel,
    tracer: () => otel.trace.getTracer(TRACER_NAME),
    tracingEnabled(): boolean {
      const provider = otel.trace.getTracerProvider() as Api.TracerProvider & { getDelegate?: () => unknown };
      const delegate = typeof provider.getDelegate === 'function' ? provider.getDelegate() : provider;
      return delegate !== noop;
    },
  };
}

/**
 * Makes a memoised loader of `@opentelemetry/api` that uses `load` (exposed so tests can check the
 * "not installed" path by injecting a loader that throws `MODULE_NOT_FOUND`).
 *
 * @returns a function that loads the API on its first call and returns the same result after:
 *   the {@link OpenTelemetry} helpers, or undefined when the module cannot be loaded (not installed,
 *   or failing to load: tracing is never a reason for an outbox write to fail).
 */
export function createOpenTelemetryLoader(load: ModuleLoader): () => OpenTelemetry | undefined {
  let loaded: { value: OpenTelemetry | undefined } | undefined;
  return () => {
    if (loaded === undefined) {
      let value: OpenTelemetry | undefined;
      try {
        value = wrapOpenTelemetry(load('@opentelemetry/api'));
      } catch {
        value = undefined;
      }
      loaded = { value };
    }
    return loaded.value;
  };
}

/**
 * `@opentelemetry/api` when it is installed, else undefined. Loaded once per process, on first use.
 */
export const loadOpenTelemetry: () => OpenTelemetry | undefined = createOpenTelemetryLoader(
  createRequire(import.meta.url),
);

/** W3C Trace Context header names (https://www.w3.org/TR/trace-context/#traceparent-header). */
export const HEADER_TRACEPARENT = 'traceparent';
export const HEADER_TRACESTATE = 'tracestate';

/**
 * The active OpenTelemetry context as propagation headers, with the globally registered propagator
 * (`propagation.inject`; W3C `traceparent` and `tracestate` with the SDK's defaults).
 *
 * @returns the headers, or undefined when `@opentelemetry/api` is absent, no span context is
 *   active (nothing allocated then), or the propagator wrote nothing.
 */
export function activeContextHeaders(): Record<string, string> | undefined {
  const otel = loadOpenTelemetry();
  if (otel === undefined) return undefined;
  const { context, propagation, trace } = otel.api;
  const active = context.active();
  if (trace.getSpanContext(active) === undefined) return undefined;
  const carrier: Record<string, string> = {};
  propagation.inject(active, carrier);
  for (const name of Object.keys(carrier)) {
    if (typeof carrier[name] !== 'string') delete carrier[name];
  }
  return Object.keys(carrier).length > 0 ? carrier : undefined;
}
