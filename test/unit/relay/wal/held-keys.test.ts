/**
 * The WAL relay's held keys (relay/wal/held-keys.ts), on a fake cluster (pure logic): an event is
 * held when its partition cannot take writes (its key held from then on, even once the partition
 * takes writes again), when its key is held, or when it has no key and no partition of its topic
 * takes writes (holding nothing behind it). test/wal/wal-relay-held.test.ts and
 * test/cluster/wal-partial-outage.test.ts run the relay on the real PostgreSQL and Kafka.
 */
import { describe, expect, it } from 'vitest';
import { PartitionGate, type PartitionSource } from '../../../../relay/partitions.js';
import { HeldKeys } from '../../../../relay/wal/held-keys.js';
import { noopLogger } from '../../../../src/logger.js';
import { kafkajsPartitionForKey } from '../../../../src/kafka/kafkajs/producer.js';

function gateOf(leaders: Record<string, (number | null)[]>): PartitionGate {
  const source: PartitionSource = {
    async describe(topics) {
      return topics.map((name) => ({
        name,
        partitions: (leaders[name] ?? []).map((leader, partition) => ({ partition, leader, isr: [1] })),
      }));
    },
    async minInsyncReplicas() {
      return new Map();
    },
    partitionForKey: kafkajsPartitionForKey,
  };
  return new PartitionGate(source, noopLogger);
}

function keyOn(partition: number, count: number, not: string[] = []): string {
  for (let i = 0; ; i++) {
    const key = `k${i}`;
    if (kafkajsPartitionForKey(key, count) === partition && !not.includes(key)) return key;
  }
}

describe('HeldKeys', () => {
  it('holds the keys it starts with and those added (a parked event), nothing else', () => {
    const held = new HeldKeys(undefined, ['a']);
    held.add('b');
    held.add(null);
    expect(held.holds({ topic: 't', key: 'a' })).toBe(true);
    expect(held.holds({ topic: 'u', key: 'b' })).toBe(true);
    expect(held.holds({ topic: 't', key: 'c' })).toBe(false);
    expect(held.holds({ topic: 't', key: null })).toBe(false);
    expect(held.size).toBe(2);
  });

  it("holds a blocked partition's events and keeps their keys held once it takes writes again", async () => {
    const leaders: Record<string, (number | null)[]> = { t: [1, null, 1] };
    const gate = gateOf(leaders);
    await gate.refresh(['t']);
    const held = new HeldKeys(gate);
    const dead = keyOn(1, 3);
    const live = keyOn(0, 3);
    expect(held.holds({ topic: 't', key: live })).toBe(false);
    expect(held.holds({ topic: 't', key: dead })).toBe(true);
    // The same key in another topic waits behind it (per-key order across topics).
    expect(held.holds({ topic: 'other', key: dead })).toBe(true);
    leaders.t = [1, 1, 1];
    await gate.refresh(['t']);
    expect(gate.blocks({ topic: 't', key: dead })).toBe(false);
    // Until the relay has published its held rows, the key stays held.
    expect(held.holds({ topic: 't', key: dead })).toBe(true);
    expect(held.size).toBe(1);
    // Counted per topic-partition for stats and metrics.
    expect(held.on('t', 1)).toBe(1);
    expect(held.on('t', 0)).toBe(0);
    expect(held.on('unknown', 1)).toBe(0);
  });

  it('holds an event without a key only while no partition of its topic takes writes, and no key with it', async () => {
    const leaders: Record<string, (number | null)[]> = { t: [null, 1] };
    const gate = gateOf(leaders);
    await gate.refresh(['t']);
    const held = new HeldKeys(gate);
    expect(held.holds({ topic: 't', key: null })).toBe(false);
    leaders.t = [null, null];
    await gate.refresh(['t']);
    expect(held.holds({ topic: 't', key: null })).toBe(true);
    expect(held.size).toBe(0);
  });
});
