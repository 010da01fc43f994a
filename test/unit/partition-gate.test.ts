/**
 * The relay's view of blocked topic-partitions (relay/partitions.ts), on a fake cluster (pure
 * logic): which rows wait, that later rows of a waiting key wait behind it, that rows without a
 * key wait only when the whole topic is closed, and that a partition taking writes again releases
 * its keys. test/cluster/partial-outage.test.ts runs the relay on a real cluster.
 */
import { describe, expect, it } from 'vitest';
import { PartitionGate, type PartitionSource } from '../../relay/partitions.js';
import { noopLogger } from '../../src/logger.js';
import { kafkajsPartitionForKey } from '../../src/kafka/kafkajs/producer.js';
import type { TopicPartitions } from '../../src/kafka/types.js';

/** A fake cluster: `state[topic][partition]` = leader (null: none) and ISR size. */
function cluster(
  state: Record<string, { leader: number | null; isr: number }[]>,
  minInsync: Record<string, number> = {},
) {
  const asked: string[][] = [];
  const source: PartitionSource = {
    async describe(topics) {
      asked.push([...topics]);
      return topics.map((name): TopicPartitions => ({
        name,
        partitions: (state[name] ?? []).map((p, partition) => ({
          partition,
          leader: p.leader,
          isr: Array.from({ length: p.isr }, (_, i) => i + 1),
        })),
      }));
    },
    async minInsyncReplicas(topics) {
      return new Map(topics.filter((t) => t in minInsync).map((t) => [t, minInsync[t]!]));
    },
    partitionForKey: kafkajsPartitionForKey,
  };
  return { source, asked };
}

/** Keys of `count` partitions: the first key found on each partition. */
function keyOn(partition: number, count: number, not: string[] = []): string {
  for (let i = 0; ; i++) {
    const key = `k${i}`;
    if (kafkajsPartitionForKey(key, count) === partition && !not.includes(key)) return key;
  }
}

const healthy = { leader: 1, isr: 3 };

describe('PartitionGate', () => {
  it('lets everything through while nothing is known to be blocked', () => {
    const gate = new PartitionGate(cluster({}).source, noopLogger);
    const rows = [
      { topic: 'a', key: 'x' },
      { topic: 'a', key: null },
    ];
    expect(gate.split(rows)).toEqual({ send: rows, waiting: [] });
    expect(gate.anyBlocked).toBe(false);
  });

  it('holds back rows of a leaderless partition and the later rows of their keys, in any topic', async () => {
    const { source } = cluster({ audit: [healthy, { leader: null, isr: 0 }, healthy], orders: Array(6).fill(healthy) });
    const gate = new PartitionGate(source, noopLogger);
    const blocked = await gate.refresh(['audit', 'orders']);
    expect(blocked).toMatchObject([{ topic: 'audit', partition: 1, reason: 'no leader' }]);
    const dead = keyOn(1, 3);
    const live = keyOn(0, 3);
    const rows = [
      { topic: 'orders', key: dead, n: 1 }, // before its key's blocked row: goes
      { topic: 'audit', key: dead, n: 2 }, // blocked partition: waits
      { topic: 'orders', key: dead, n: 3 }, // later row of a waiting key: waits
      { topic: 'audit', key: live, n: 4 },
      { topic: 'audit', key: null, n: 5 }, // no key: any partition with a leader
    ];
    const { send, waiting } = gate.split(rows);
    expect(send.map((r) => r.n)).toEqual([1, 4, 5]);
    expect(waiting.map((r) => r.n)).toEqual([2, 3]);
    expect(gate.keys()).toEqual([dead]);
    expect(gate.keysOf('audit', 1)).toEqual([dead]);
    expect(gate.blocked()).toMatchObject([{ topic: 'audit', partition: 1, keys: 1 }]);
    expect(gate.closedTopics()).toEqual([]);
  });

  it('blocks a partition with fewer in-sync replicas than min.insync.replicas (NOT_ENOUGH_REPLICAS)', async () => {
    const { source } = cluster({ payments: [{ leader: 2, isr: 1 }, healthy, healthy] }, { payments: 2 });
    const gate = new PartitionGate(source, noopLogger);
    expect(await gate.refresh(['payments'])).toMatchObject([
      { topic: 'payments', partition: 0, reason: 'NOT_ENOUGH_REPLICAS (isr 1 < min.insync.replicas 2)' },
    ]);
    // Replication factor 1 under min.insync.replicas 2: the broker takes acks=all writes (checked on one broker).
    const single = new PartitionGate(
      {
        ...source,
        describe: async (topics) =>
          topics.map((name) => ({ name, partitions: [{ partition: 0, leader: 1, replicas: [1], isr: [1] }] })),
      },
      noopLogger,
    );
    expect(await single.refresh(['payments'])).toEqual([]);
    // Without a min.insync.replicas from the broker: Kafka's default 1, one in-sync replica is enough.
    const other = new PartitionGate(cluster({ payments: [{ leader: 2, isr: 1 }] }).source, noopLogger);
    expect(await other.refresh(['payments'])).toEqual([]);
  });

  it('asks for min.insync.replicas again after a failed read (a dead broker answered first), not taking 1 for good', async () => {
    const { source } = cluster({ payments: [{ leader: 2, isr: 1 }] }, { payments: 2 });
    let failures = 1;
    const flaky: PartitionSource = {
      ...source,
      async minInsyncReplicas(topics) {
        if (failures-- > 0) throw new Error('connect ECONNREFUSED');
        return source.minInsyncReplicas(topics);
      },
    };
    const gate = new PartitionGate(flaky, noopLogger);
    expect(await gate.refresh(['payments'])).toEqual([]);
    expect(await gate.refresh(['payments'])).toMatchObject([
      { partition: 0, reason: expect.stringMatching(/NOT_ENOUGH_REPLICAS/) },
    ]);
  });

  it('holds back rows without a key only when no partition of their topic takes writes', async () => {
    const state = {
      audit: [
        { leader: null, isr: 0 },
        { leader: null, isr: 0 },
      ],
    };
    const gate = new PartitionGate(cluster(state).source, noopLogger);
    await gate.refresh(['audit']);
    expect(gate.closedTopics()).toEqual(['audit']);
    expect(gate.split([{ topic: 'audit', key: null }]).waiting).toHaveLength(1);
    expect(gate.split([{ topic: 'other', key: null }]).send).toHaveLength(1);
  });

  it('releases the keys of a partition that takes writes again, and keeps those still blocked', async () => {
    const state = { audit: [{ leader: null, isr: 0 }, { leader: null, isr: 0 }, healthy] };
    const { source, asked } = cluster(state);
    const gate = new PartitionGate(source, noopLogger);
    await gate.refresh(['audit']);
    const k0 = keyOn(0, 3);
    const k1 = keyOn(1, 3);
    gate.split([
      { topic: 'audit', key: k0 },
      { topic: 'audit', key: k1 },
    ]);
    expect(gate.keys().sort()).toEqual([k0, k1].sort());
    const changes = gate.changes;
    await gate.refresh(gate.blockedTopics()); // nothing changed
    expect(gate.changes).toBe(changes);
    state.audit[0] = healthy;
    await gate.refresh(gate.blockedTopics());
    expect(gate.changes).toBe(changes + 1);
    expect(asked.at(-1)).toEqual(['audit']);
    expect(gate.keys()).toEqual([k1]);
    expect(gate.split([{ topic: 'audit', key: k0 }]).send).toHaveLength(1);
    state.audit[1] = healthy;
    await gate.refresh(gate.blockedTopics());
    expect(gate.keys()).toEqual([]);
    expect(gate.anyBlocked).toBe(false);
    expect(gate.blockedTopics()).toEqual([]);
  });

  it('knows the partition of a keyed row once its topic was described', async () => {
    const gate = new PartitionGate(cluster({ orders: Array(6).fill(healthy) }).source, noopLogger);
    expect(gate.partitionOf({ topic: 'orders', key: 'k1' })).toBeUndefined();
    await gate.refresh(['orders']);
    expect(gate.partitionOf({ topic: 'orders', key: 'k1' })).toBe(kafkajsPartitionForKey('k1', 6));
    expect(gate.partitionOf({ topic: 'orders', key: null })).toBeUndefined();
  });
});
