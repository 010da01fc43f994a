/**
 * The keys whose events the WAL relay holds in the table instead of sending them as the stream
 * brings them (G7 in docs/guarantees.md; docs/wal-source.md, "Held keys").
 *
 * An event is held when its topic-partition cannot take writes (relay/partitions.ts: no leader,
 * too few in-sync replicas), when an earlier event of its key is held, or, with
 * `holdKeyBehindFailure`, when an earlier event of its key is parked. A held event's row stays in
 * the outbox table (it is the durable copy already), marked held with its transaction's commit LSN
 * (`holdRelayed()` in relay/sql.ts), so the stream is confirmed past it and memory holds only
 * keys, never events. The relay publishes held rows later from the table, in commit order, once
 * nothing holds their key (`readHeld()`).
 *
 * Keys, not partitions, are held: a key's later events must wait behind its held ones even after
 * its partition takes writes again, until those are out. An event without a key is held only
 * while no partition of its topic takes writes, and holds nothing behind it.
 */
import type { GatedRow, PartitionGate } from '../partitions.js';

/** A set of held keys, consulted in commit order. */
export class HeldKeys {
  private readonly keys: Set<string>;

  /**
   * @param gate - the relay's view of blocked partitions (none: only keys held so far hold).
   * @param keys - keys held from the start (those of held rows in the table).
   */
  constructor(
    private readonly gate: PartitionGate | undefined,
    keys: Iterable<string> = [],
  ) {
    this.keys = new Set(keys);
  }

  /** How many keys are held. */
  get size(): number {
    return this.keys.size;
  }

  /**
   * Whether `row`, the next event in commit order, is held: its key is, or its partition cannot
   * take writes now (its key is then held from here on).
   */
  holds(row: GatedRow): boolean {
    if (row.key !== null && this.keys.has(row.key)) return true;
    if (this.gate?.blocks(row) !== true) return false;
    if (row.key !== null) this.keys.add(row.key);
    return true;
  }

  /**
   * How many held keys go to `partition` of `topic` (by the gate's partitioner; 0 while the topic's
   * partitions are unknown). Walks every held key: for stats, not for the send path.
   */
  on(topic: string, partition: number): number {
    let n = 0;
    for (const key of this.keys) if (this.gate?.partitionOf({ topic, key }) === partition) n++;
    return n;
  }

  /** Holds `key` from here on (its event was parked, or held for another reason). */
  add(key: string | null): void {
    if (key !== null) this.keys.add(key);
  }
}
