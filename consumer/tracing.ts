/**
 * The handler call of the dedup consumer: the decode hook, and an OpenTelemetry CONSUMER span per
 * handler run that continues the trace the event was enqueued in.
 *
 * Span: name `<topic> process` (OpenTelemetry messaging semantic conventions v1.24, "Span name"),
 * kind CONSUMER, parent = the context extracted from the message headers with the global
 * propagator (W3C `traceparent`/`tracestate` by default), so the handler's span is a child of the
 * span that was active when `enqueue()` ran. Attributes: the v1.24 messaging names
 * (`messaging.system` = kafka, `messaging.destination.name`, `messaging.operation` = process,
 * `messaging.message.id` = event id, `messaging.kafka.consumer.group`,
 * `messaging.kafka.destination.partition`, `messaging.kafka.message.offset`,
 * `messaging.kafka.message.key`) and their current equivalents (`messaging.operation.type`,
 * `messaging.operation.name`, `messaging.consumer.group.name`,
 * `messaging.destination.partition.id`), plus `outboxkit.event.type` and `outboxkit.attempt`.
 * A handler that throws records the exception and sets the status to ERROR.
 * https://github.com/open-telemetry/semantic-conventions/blob/v1.24.0/docs/messaging/messaging-spans.md
 * https://github.com/open-telemetry/semantic-conventions/blob/v1.24.0/docs/messaging/kafka.md
 *
 * Cost without tracing: `@opentelemetry/api` absent → one memoised undefined check; present but no
 * tracer provider registered → one provider check; neither allocates.
 */
import type { Attributes, Span } from '@opentelemetry/api';
import type { DatabaseHandle } from '../src/database.js';
import { loadOpenTelemetry, type OpenTelemetry } from '../src/tracing.js';
import { useDecoder } from './consumed-event.js';
import type { DedupHandler, HandlerContext, ResolvedDedupConsumerOptions } from './options.js';

/** The options {@link runHandler} reads. */
type HandlerOptions = Pick<ResolvedDedupConsumerOptions<DatabaseHandle>, 'groupId' | 'decode' | 'tracing'>;

/**
 * Runs the application's handler for one event: gives the event the consumer's decoder, and wraps
 * the run in a CONSUMER span when tracing is on (see the file comment).
 *
 * @returns the handler's promise; what it throws is rethrown unchanged (after being recorded).
 */
export function runHandler<D extends DatabaseHandle>(
  handler: DedupHandler<D>,
  ctx: HandlerContext<D>,
  options: HandlerOptions,
): Promise<void> {
  if (options.decode !== undefined) useDecoder(ctx.event, options.decode);
  const otel = options.tracing ? loadOpenTelemetry() : undefined;
  if (otel === undefined || !otel.tracingEnabled()) return handler(ctx);
  return runTraced(otel, handler, ctx, options.groupId);
}

/** The span attributes of one handler run. */
export function processSpanAttributes(ctx: HandlerContext<DatabaseHandle>, groupId: string): Attributes {
  const { event } = ctx;
  const attributes: Attributes = {
    'messaging.system': 'kafka',
    'messaging.destination.name': event.topic,
    'messaging.operation': 'process',
    'messaging.operation.type': 'process',
    'messaging.operation.name': 'process',
    'messaging.message.id': event.id,
    'messaging.kafka.consumer.group': groupId,
    'messaging.consumer.group.name': groupId,
    'messaging.kafka.destination.partition': event.partition,
    'messaging.destination.partition.id': String(event.partition),
    'messaging.kafka.message.offset': Number(event.offset),
    'outboxkit.attempt': ctx.attempt,
  };
  if (event.key !== null) attributes['messaging.kafka.message.key'] = event.key;
  if (event.type !== null) attributes['outboxkit.event.type'] = event.type;
  if (event.value === null) attributes['messaging.kafka.message.tombstone'] = true;
  return attributes;
}

async function runTraced<D extends DatabaseHandle>(
  otel: OpenTelemetry,
  handler: DedupHandler<D>,
  ctx: HandlerContext<D>,
  groupId: string,
): Promise<void> {
  const { context, propagation, trace, SpanKind, SpanStatusCode } = otel.api;
  // The producer's context from the headers; without one, the span starts from the active context.
  const parent = propagation.extract(context.active(), ctx.event.headers);
  const span: Span = otel
    .tracer()
    .startSpan(
      `${ctx.event.topic} process`,
      { kind: SpanKind.CONSUMER, attributes: processSpanAttributes(ctx as HandlerContext<DatabaseHandle>, groupId) },
      parent,
    );
  try {
    // The handler's own spans (pg, HTTP calls) become children of this one.
    await context.with(trace.setSpan(parent, span), () => handler(ctx));
  } catch (err) {
    const error = err instanceof Error ? err : new Error(String(err));
    span.recordException(error);
    const code = (err as { code?: unknown } | null)?.code;
    span.setAttribute('error.type', typeof code === 'string' ? code : error.name);
    span.setStatus({ code: SpanStatusCode.ERROR, message: error.message });
    throw err;
  } finally {
    span.end();
  }
}
