/**
 * How relayMetrics() maps a relay's blocked topic-partitions to its gauges
 * (`outboxkit_relay_partition_waiting_events{topic,partition}`, `outboxkit_relay_partitions_blocked`):
 * one series per blocked partition, gone once it takes writes again, read at most once per
 * `refreshMs`. A single broker cannot show a blocked partition (it would need a partition without
 * a leader, or Kafka to refuse acks=all for too few in-sync replicas, which it does not when the
 * replication factor is below min.insync.replicas), so the relay here is a stand-in with the
 * methods relayMetrics() uses; the partition gate itself is tested in test/unit/partition-gate.test.ts
 * and on the 3-node cluster in test/cluster/partial-outage.test.ts. No infrastructure: the database
 * gauges are never collected. The stand-down counter is counted on a real relay in
 * test/relay/readiness.test.ts.
 */
import { EventEmitter } from 'node:events';
import pg from 'pg';
import client from 'prom-client';
import { afterAll, describe, expect, it } from 'vitest';
import { relayMetrics } from '../../../relay/metrics.js';
import type { BlockedPartition } from '../../../relay/partitions.js';
import type { Relay, RelayEvents } from '../../../relay/relay.js';

const pool = new pg.Pool({ connectionString: 'postgres://nobody@127.0.0.1:1/none' });
afterAll(async () => {
  await pool.end();
});

type Waiting = { topic: string; partition: number; events: number }[];

/** A stand-in relay: what relayMetrics() reads, set by the test; counts the waitingEvents() reads. */
function standIn() {
  const state = { blocked: [] as BlockedPartition[], waiting: [] as Waiting, reads: 0 };
  const relay = Object.assign(new EventEmitter<RelayEvents>(), {
    options: { schema: 'outboxkit' },
    producerConnected: true,
    blockedPartitions: () => state.blocked,
    waitingEvents: async () => {
      state.reads++;
      return state.waiting;
    },
  });
  return { relay: relay as unknown as Relay, state };
}

async function values(registry: client.Registry, name: string) {
  const metric = registry.getSingleMetric(name);
  if (!metric) throw new Error(`${name} is not registered`);
  return (await metric.get()).values.map((v) => ({ labels: v.labels, value: v.value }));
}

const blocked = (topic: string, partition: number, keys: number): BlockedPartition => ({
  topic,
  partition,
  reason: 'no leader',
  keys,
  since: 1_796_000_000_000,
});

describe('relayMetrics: blocked topic-partitions', () => {
  it('one waiting-events series per blocked partition (topic and partition labels, never a key); recovered ones drop out', async () => {
    const { relay, state } = standIn();
    const registry = new client.Registry();
    relayMetrics(relay, pool, registry, { refreshMs: 0 });

    expect(await values(registry, 'outboxkit_relay_partition_waiting_events')).toEqual([]);
    expect(await values(registry, 'outboxkit_relay_partitions_blocked')).toEqual([{ labels: {}, value: 0 }]);

    state.blocked = [blocked('orders', 2, 3), blocked('audit', 0, 1)];
    state.waiting = [
      { topic: 'orders', partition: 2, events: 7 },
      { topic: 'audit', partition: 0, events: 1 },
    ];
    expect(await values(registry, 'outboxkit_relay_partition_waiting_events')).toEqual([
      { labels: { topic: 'orders', partition: '2' }, value: 7 },
      { labels: { topic: 'audit', partition: '0' }, value: 1 },
    ]);
    expect(await values(registry, 'outboxkit_relay_partitions_blocked')).toEqual([{ labels: {}, value: 2 }]);
    expect(await registry.getSingleMetricAsString('outboxkit_relay_partition_waiting_events')).toContain(
      'outboxkit_relay_partition_waiting_events{topic="orders",partition="2"} 7',
    );

    // orders/2 takes writes again: its series goes, it does not stay at its last count.
    state.blocked = [blocked('audit', 0, 1)];
    state.waiting = [{ topic: 'audit', partition: 0, events: 4 }];
    expect(await values(registry, 'outboxkit_relay_partition_waiting_events')).toEqual([
      { labels: { topic: 'audit', partition: '0' }, value: 4 },
    ]);
    state.blocked = [];
    state.waiting = [];
    expect(await values(registry, 'outboxkit_relay_partition_waiting_events')).toEqual([]);
    expect(await values(registry, 'outboxkit_relay_partitions_blocked')).toEqual([{ labels: {}, value: 0 }]);
  });

  it('reads the waiting events at most once per refreshMs, whatever the scrape rate', async () => {
    const { relay, state } = standIn();
    const registry = new client.Registry();
    relayMetrics(relay, pool, registry, { refreshMs: 60_000 });
    state.waiting = [{ topic: 'orders', partition: 1, events: 5 }];
    for (let i = 0; i < 5; i++) await values(registry, 'outboxkit_relay_partition_waiting_events');
    expect(state.reads).toBe(1);
    // Within the interval a scrape shows the last read, not a newer figure.
    state.waiting = [];
    expect(await values(registry, 'outboxkit_relay_partition_waiting_events')).toEqual([
      { labels: { topic: 'orders', partition: '1' }, value: 5 },
    ]);
  });
});
