/**
 * Prometheus metrics of a dedup consumer (prom-client), fed by its typed events and, for the
 * per-partition gauges, read from its `health()` at each scrape. Labels are the consumer group,
 * the topic and (partition gauges) the partition number: never event ids or keys (unbounded
 * cardinality, and they can carry business identifiers).
 */
import client from 'prom-client';
import type { DedupConsumer } from './dedup-consumer.js';
import type { PartitionHealth } from './partition-health.js';

const LABELS = ['group', 'topic'] as const;

/** Bucket bounds of the handler latency histogram, in seconds (1 ms to 30 s). */
export const HANDLER_DURATION_BUCKETS = Object.freeze([
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
]);

type Label = (typeof LABELS)[number];

/** The metric registered under `name`, or a new one: several consumers may share a registry. */
function counter(registry: client.Registry, name: string, help: string): client.Counter<Label> {
  const existing = registry.getSingleMetric(name);
  if (existing) return existing as client.Counter<Label>;
  return new client.Counter({ name, help, labelNames: LABELS, registers: [registry] });
}

/**
 * Registers the consumer's metrics on `registry` and keeps them up to date:
 *
 * - `outboxkit_consumer_applied_total`: events whose handler ran and committed.
 * - `outboxkit_consumer_duplicates_total`: events skipped because the group had applied them.
 * - `outboxkit_consumer_duplicates_elsewhere_total`: of those, the ones whose event id the group
 *   applied from another message (topic, partition or offset): a relay republish, or a different
 *   event reusing the id, which the group never applies (see `consumer:duplicate`). Alert on it.
 * - `outboxkit_consumer_progress_skipped_total`: redelivered records skipped without a
 *   transaction because the partition's progress proves them handled (`recordProgress`).
 * - `outboxkit_consumer_retries_total`: failed handler runs that will run again (each an
 *   attempt: whatever the handler threw, network errors included).
 * - `outboxkit_consumer_retry_later_total`: handler runs deferred by a `RetryLaterError`, not
 *   counted as attempts. A rise that does not stop means a downstream stays down.
 * - `outboxkit_consumer_retry_later_exhausted_total`: `RetryLaterError`s counted as attempts
 *   because their message had been deferred for `maxRetryLaterMs`.
 * - `outboxkit_consumer_dead_lettered_total`: messages sent to the dead-letter topic.
 * - `outboxkit_consumer_errors_total`: failures outside the handler (database down, the
 *   consumer's connection lost during a transaction, lock timeout on the inbox row, a failed
 *   dead-letter send), retried without counting as attempts.
 * - `outboxkit_consumer_handler_duration_seconds`: time to apply one event (inbox claim,
 *   handler and commit), for applied events. With `transactionScope: 'batch'`, the event's part
 *   of the shared transaction (its claim and handler), the COMMIT counted with the last event.
 *
 * - `outboxkit_consumer_partition_stuck{group,topic,partition}`: 1 while the partition is stuck
 *   (messages to handle, no progress for `stuckAfterMs`), else 0.
 * - `outboxkit_consumer_partition_stalled_seconds{group,topic,partition}`: how long the partition
 *   has had messages to handle without progress, in seconds; 0 when it has none.
 *
 * Every counter series is labelled `group` and `topic`, and starts at 0 for each consumed topic.
 * The partition gauges have a series for each partition the consumer owns at the scrape: a
 * partition a rebalance took away drops out (its new owner's process reports it).
 *
 * @returns a function that stops updating the metrics (they stay registered).
 */
export function consumerMetrics(consumer: DedupConsumer, registry: client.Registry): () => void {
  const applied = counter(
    registry,
    'outboxkit_consumer_applied_total',
    'Events whose handler ran and whose transaction (with the inbox row) committed.',
  );
  const duplicates = counter(
    registry,
    'outboxkit_consumer_duplicates_total',
    'Events skipped because the inbox shows the consumer group already applied them.',
  );
  const duplicatesElsewhere = counter(
    registry,
    'outboxkit_consumer_duplicates_elsewhere_total',
    'Duplicates whose event id the group applied from another message (topic, partition or offset): ' +
      'a relay republish, or a different event reusing the id, which the group never applies.',
  );
  const progressSkipped = counter(
    registry,
    'outboxkit_consumer_progress_skipped_total',
    "Redelivered records skipped without a transaction: the partition's recorded progress proves them handled.",
  );
  const retries = counter(
    registry,
    'outboxkit_consumer_retries_total',
    'Failed handler runs that were rolled back and will run again after a backoff.',
  );
  const retryLater = counter(
    registry,
    'outboxkit_consumer_retry_later_total',
    'Handler runs deferred by a RetryLaterError (rolled back, not counted as attempts).',
  );
  const retryLaterExhausted = counter(
    registry,
    'outboxkit_consumer_retry_later_exhausted_total',
    'RetryLaterErrors counted as attempts because their message had been deferred for maxRetryLaterMs.',
  );
  const deadLettered = counter(
    registry,
    'outboxkit_consumer_dead_lettered_total',
    'Messages produced to the dead-letter topic (no usable event id, or the handler kept failing).',
  );
  const errors = counter(
    registry,
    'outboxkit_consumer_errors_total',
    "Failures outside the handler (the consumer's database connection or statements, dead-letter sends); retried.",
  );
  const durationName = 'outboxkit_consumer_handler_duration_seconds';
  const duration =
    (registry.getSingleMetric(durationName) as client.Histogram<Label> | undefined) ??
    new client.Histogram({
      name: durationName,
      help: 'Time to apply one event (inbox claim, handler, commit) in seconds, for applied events.',
      labelNames: LABELS,
      buckets: [...HANDLER_DURATION_BUCKETS],
      registers: [registry],
    });

  const partitionGauges = partitionGaugesOf(registry);
  partitionGauges.sources.add(consumer);

  const group = consumer.groupId;
  for (const topic of consumer.topics) {
    for (const c of [
      applied,
      duplicates,
      duplicatesElsewhere,
      progressSkipped,
      retries,
      retryLater,
      retryLaterExhausted,
      deadLettered,
      errors,
    ]) {
      c.inc({ group, topic }, 0);
    }
    duration.zero({ group, topic });
  }
  const off = [
    consumer.on('consumer:applied', ({ event, durationMs }) => {
      applied.inc({ group, topic: event.topic });
      duration.observe({ group, topic: event.topic }, durationMs / 1_000);
    }),
    consumer.on('consumer:duplicate', ({ event, elsewhere }) => {
      duplicates.inc({ group, topic: event.topic });
      if (elsewhere) duplicatesElsewhere.inc({ group, topic: event.topic });
    }),
    consumer.on('consumer:progress-skipped', ({ topic }) => progressSkipped.inc({ group, topic })),
    consumer.on('consumer:retry', ({ event }) => retries.inc({ group, topic: event.topic })),
    consumer.on('consumer:retry-later', ({ event, counted }) =>
      (counted ? retryLaterExhausted : retryLater).inc({ group, topic: event.topic }),
    ),
    consumer.on('consumer:dead-lettered', ({ topic }) => deadLettered.inc({ group, topic })),
    consumer.on('consumer:error', ({ topic }) => errors.inc({ group, topic })),
  ];
  return () => {
    for (const f of off) f();
    partitionGauges.sources.delete(consumer);
  };
}

const PARTITION_LABELS = ['group', 'topic', 'partition'] as const;

/** The per-partition gauges of a registry, and the consumers they read at each scrape. */
interface PartitionGauges {
  sources: Set<DedupConsumer>;
}

const partitionGaugesByRegistry = new WeakMap<client.Registry, PartitionGauges>();

/**
 * The registry's per-partition gauges, registered with the first consumer: several consumers may
 * share a registry, and each scrape reads the health of all of them.
 */
function partitionGaugesOf(registry: client.Registry): PartitionGauges {
  const existing = partitionGaugesByRegistry.get(registry);
  if (existing) return existing;
  const gauges: PartitionGauges = { sources: new Set() };
  /** Per series, the largest value among the consumers (two members of a group may both list a partition mid-rebalance). */
  const read = (value: (p: PartitionHealth) => number) => {
    const values = new Map<string, { labels: Record<(typeof PARTITION_LABELS)[number], string>; value: number }>();
    for (const consumer of gauges.sources) {
      for (const p of consumer.health().partitions) {
        const labels = { group: consumer.groupId, topic: p.topic, partition: String(p.partition) };
        const key = JSON.stringify([labels.group, labels.topic, labels.partition]);
        const v = value(p);
        const seen = values.get(key);
        if (!seen || v > seen.value) values.set(key, { labels, value: v });
      }
    }
    return values.values();
  };
  new client.Gauge({
    name: 'outboxkit_consumer_partition_stuck',
    help: 'Whether the partition is stuck (1): messages to handle and no progress for stuckAfterMs.',
    labelNames: PARTITION_LABELS,
    registers: [registry],
    collect() {
      // Reset first: a partition a rebalance took away leaves the scrape instead of keeping its last value.
      this.reset();
      for (const { labels, value } of read((p) => (p.stuck ? 1 : 0))) this.set(labels, value);
    },
  });
  new client.Gauge({
    name: 'outboxkit_consumer_partition_stalled_seconds',
    help: 'Seconds the partition has had messages to handle without progress (0 when it has none).',
    labelNames: PARTITION_LABELS,
    registers: [registry],
    collect() {
      this.reset();
      for (const { labels, value } of read((p) => p.stalledMs / 1_000)) this.set(labels, value);
    },
  });
  partitionGaugesByRegistry.set(registry, gauges);
  return gauges;
}
