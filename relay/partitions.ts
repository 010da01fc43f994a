/**
 * Which topic-partitions cannot take writes now, and which pending events wait for them (G7 in
 * docs/guarantees.md): an event waits only when the partition it goes to has no leader or fewer
 * in-sync replicas than its topic's `min.insync.replicas` (the broker would refuse it with
 * NOT_ENOUGH_REPLICAS), or when an earlier event of its key waits. Everything else keeps flowing.
 *
 * How the relay learns it: a send fails (kafkajs fails a whole request, without saying which
 * partition was at fault), and the relay asks the cluster for the metadata of that send's topics
 * (`refresh`). A partition found blocked holds back its events and, through their keys, every
 * later event of the same keys (the relay's read skips those keys: a backlog of waiting events
 * never fills a pass). While some partition is blocked, the relay asks again every
 * `recheckMs` and releases the keys of a partition that can take writes again.
 *
 * A waiting event is never parked and its attempts are not counted: a partition that cannot take
 * writes is the cluster's state, not the event's fault.
 *
 * Keys are placed on partitions by the Kafka client's partitioner (`KafkaClient.partitionForKey`,
 * murmur2 like Kafka's Java client). An event without a key goes to any partition with a leader
 * (the client's round-robin): it waits only when no partition of its topic can take writes.
 */
import type { Logger } from '../src/logger.js';
import type { KafkaAdmin, KafkaClient, TopicPartitions } from '../src/kafka/types.js';

/** What the gate needs of the cluster. */
export interface PartitionSource {
  /** Partitions of `topics`, with leaders and in-sync replicas (a metadata request naming only them). */
  describe(topics: readonly string[]): Promise<TopicPartitions[]>;
  /** `min.insync.replicas` of each of `topics` (absent when the broker did not say). */
  minInsyncReplicas(topics: readonly string[]): Promise<Map<string, number>>;
  /** The partition a key goes to, of `partitionCount` (the client's partitioner). */
  partitionForKey(key: string, partitionCount: number): number;
}

/**
 * A {@link PartitionSource} asking the cluster through `client`: `withAdmin` runs a request with a
 * connected admin client and bounds its wait (the relays' own); `onDescribed` is called after each
 * metadata answer.
 */
export function clusterPartitionSource(
  client: KafkaClient,
  withAdmin: <T>(what: string, fn: (admin: KafkaAdmin) => Promise<T>) => Promise<T>,
  onDescribed: () => void = () => {},
): PartitionSource {
  return {
    describe: async (topics) => {
      const described = await withAdmin('a metadata request', (a) => a.describeTopics(topics));
      onDescribed();
      return described;
    },
    minInsyncReplicas: (topics) =>
      withAdmin('a topic configuration read', async (a) => {
        const configs = await a.describeTopicConfigs(topics, ['min.insync.replicas']);
        const values = new Map<string, number>();
        for (const [topic, c] of configs) {
          const n = Number(c['min.insync.replicas']);
          if (Number.isSafeInteger(n) && n > 0) values.set(topic, n);
        }
        return values;
      }),
    partitionForKey: (key, count) => client.partitionForKey(key, count),
  };
}

/** A topic-partition that cannot take writes now. */
export interface BlockedPartition {
  topic: string;
  partition: number;
  /** Why: `no leader`, or `NOT_ENOUGH_REPLICAS (isr 1 < min.insync.replicas 2)`. */
  reason: string;
  /** Keys of pending events held back by it (this relay's lanes only). */
  keys: number;
  /** Since when it is blocked (ms since the epoch). */
  since: number;
}

/** A pending event, as far as the gate is concerned. */
export interface GatedRow {
  topic: string;
  key: string | null;
}

interface TopicView {
  partitionCount: number;
  /** Blocked partitions: reason and since when (ms since the epoch). */
  blocked: Map<number, { reason: string; since: number }>;
}

/** The relay's view of its topics' partitions, and the keys that wait for a blocked one. */
export class PartitionGate {
  private readonly topics = new Map<string, TopicView>();
  /** `min.insync.replicas` of the topics seen, read once per topic. */
  private readonly minInsync = new Map<string, number>();
  /** Waiting keys → the `topic\0partition` they wait for. */
  private readonly waitingKeys = new Map<string, string>();
  /** Changes of the set of blocked partitions so far: a caller compares it to tell a change. */
  private changeCount = 0;

  constructor(
    private readonly source: PartitionSource,
    private readonly logger: Logger,
  ) {}

  /** How many times the set of blocked partitions changed (a partition blocked, or taking writes again). */
  get changes(): number {
    return this.changeCount;
  }

  /** Whether some partition is blocked (the relay then rechecks it on a timer). */
  get anyBlocked(): boolean {
    for (const view of this.topics.values()) if (view.blocked.size > 0) return true;
    return false;
  }

  /** The keys whose events wait (the relay's read skips them). */
  keys(): string[] {
    return [...this.waitingKeys.keys()];
  }

  /** The partition `row` goes to, when it has a key and its topic's partitions are known. */
  partitionOf(row: GatedRow): number | undefined {
    const view = this.topics.get(row.topic);
    if (row.key === null || !view || view.partitionCount === 0) return undefined;
    return this.source.partitionForKey(row.key, view.partitionCount);
  }

  /** The waiting keys that wait for `partition` of `topic`. */
  keysOf(topic: string, partition: number): string[] {
    const tp = tpKey(topic, partition);
    return [...this.waitingKeys].filter(([, t]) => t === tp).map(([k]) => k);
  }

  /** Topics none of whose partitions can take writes: their events without a key wait too. */
  closedTopics(): string[] {
    const closed: string[] = [];
    for (const [topic, view] of this.topics) {
      if (view.partitionCount > 0 && view.blocked.size >= view.partitionCount) closed.push(topic);
    }
    return closed;
  }

  /** Topics with a blocked partition (rechecked on a timer). */
  blockedTopics(): string[] {
    return [...this.topics].filter(([, v]) => v.blocked.size > 0).map(([t]) => t);
  }

  /** The blocked partitions, with how many waiting keys each holds back. */
  blocked(): BlockedPartition[] {
    const keys = new Map<string, number>();
    for (const tp of this.waitingKeys.values()) keys.set(tp, (keys.get(tp) ?? 0) + 1);
    const out: BlockedPartition[] = [];
    for (const [topic, view] of this.topics) {
      for (const [partition, b] of view.blocked) {
        out.push({ topic, partition, reason: b.reason, since: b.since, keys: keys.get(tpKey(topic, partition)) ?? 0 });
      }
    }
    return out;
  }

  /**
   * Whether `row` would wait now for a blocked partition: its key's partition is blocked, or it has
   * no key and no partition of its topic takes writes. Records nothing (unlike {@link split}).
   */
  blocks(row: GatedRow): boolean {
    const view = this.topics.get(row.topic);
    if (!view || view.blocked.size === 0) return false;
    if (row.key === null) return view.partitionCount > 0 && view.blocked.size >= view.partitionCount;
    return view.blocked.has(this.source.partitionForKey(row.key, view.partitionCount));
  }

  /**
   * Splits `rows` (in sequence order) into those to send now and those that wait: a row whose
   * partition is blocked, or whose key already waits (an earlier event of it waits), waits, and
   * its key with it. A row without a key waits only when its whole topic is closed.
   */
  split<R extends GatedRow>(rows: readonly R[]): { send: R[]; waiting: R[] } {
    if (this.waitingKeys.size === 0 && !this.anyBlocked) return { send: rows as R[], waiting: [] };
    const send: R[] = [];
    const waiting: R[] = [];
    for (const row of rows) {
      const view = this.topics.get(row.topic);
      if (row.key === null) {
        if (view && view.partitionCount > 0 && view.blocked.size >= view.partitionCount) waiting.push(row);
        else send.push(row);
        continue;
      }
      if (this.waitingKeys.has(row.key)) {
        waiting.push(row);
        continue;
      }
      if (view && view.blocked.size > 0) {
        const partition = this.source.partitionForKey(row.key, view.partitionCount);
        if (view.blocked.has(partition)) {
          this.waitingKeys.set(row.key, tpKey(row.topic, partition));
          waiting.push(row);
          continue;
        }
      }
      send.push(row);
    }
    return { send, waiting };
  }

  /**
   * Asks the cluster for the partitions of `topics` and updates the view: partitions without a
   * leader, or with fewer in-sync replicas than `min.insync.replicas`, are blocked; the keys of
   * those that are not blocked any more are released. Rejects with the client's error when the
   * cluster does not answer (the caller bounds the wait).
   *
   * @returns the partitions of `topics` that are blocked now.
   */
  async refresh(topics: readonly string[]): Promise<BlockedPartition[]> {
    const unique = [...new Set(topics)];
    if (unique.length === 0) return [];
    const unknown = unique.filter((t) => !this.minInsync.has(t));
    if (unknown.length > 0) {
      try {
        const values = await this.source.minInsyncReplicas(unknown);
        // Absent from the answer: 1, Kafka's default (any in-sync replica takes writes).
        for (const t of unknown) this.minInsync.set(t, values.get(t) ?? 1);
      } catch (err) {
        // Asked again at the next refresh; meanwhile only leaders are checked.
        this.logger.warn(
          { err, topics: unknown },
          'could not read min.insync.replicas; in-sync replicas not checked this time',
        );
      }
    }
    const described = await this.source.describe(unique);
    const now = Date.now();
    for (const t of described) {
      const before = this.topics.get(t.name);
      const minInsync = this.minInsync.get(t.name) ?? 1;
      const blocked = new Map<number, { reason: string; since: number }>();
      for (const p of t.partitions) {
        // A broker holds acks=all writes to fewer in-sync replicas than min.insync.replicas only
        // when the partition has that many replicas: one of replication factor 1 takes them.
        const needed = p.replicas && p.replicas.length > 0 ? Math.min(minInsync, p.replicas.length) : minInsync;
        const reason =
          p.leader === null
            ? 'no leader'
            : p.isr !== undefined && p.isr.length < needed
              ? `NOT_ENOUGH_REPLICAS (isr ${p.isr.length} < min.insync.replicas ${minInsync})`
              : undefined;
        if (reason) blocked.set(p.partition, { reason, since: before?.blocked.get(p.partition)?.since ?? now });
      }
      for (const [partition, b] of blocked) {
        if (!before?.blocked.has(partition)) {
          this.changeCount++;
          this.logger.warn(
            { topic: t.name, partition, reason: b.reason },
            'partition cannot take writes: its events wait',
          );
        }
      }
      for (const partition of before?.blocked.keys() ?? []) {
        if (!blocked.has(partition)) {
          this.changeCount++;
          this.logger.info({ topic: t.name, partition }, 'partition takes writes again: its waiting events go out');
        }
      }
      this.topics.set(t.name, { partitionCount: t.partitions.length, blocked });
    }
    this.releaseKeys();
    return this.blocked().filter((b) => unique.includes(b.topic));
  }

  /** Forgets every waiting key and blocked partition (the relay lost its lanes, or stops). */
  clear(): void {
    this.waitingKeys.clear();
    this.topics.clear();
  }

  /** Releases the waiting keys of partitions that are not blocked any more. */
  private releaseKeys(): void {
    for (const [key, tp] of this.waitingKeys) {
      const [topic, partition] = splitTp(tp);
      if (!this.topics.get(topic)?.blocked.has(partition)) this.waitingKeys.delete(key);
    }
  }
}

function tpKey(topic: string, partition: number): string {
  return `${topic}\0${partition}`;
}

function splitTp(tp: string): [string, number] {
  const i = tp.lastIndexOf('\0');
  return [tp.slice(0, i), Number(tp.slice(i + 1))];
}
