/**
 * Per-topic size limits. kafkajs sends all messages of one partition in one record batch, and the
 * broker refuses a batch larger than the topic's `max.message.bytes` (MESSAGE_TOO_LARGE), even when
 * every message in it is small. The relay reads that limit once per topic and splits its sends so
 * that no send carries more than a safe share of it for one topic; a split never reorders a key.
 */
import type { KafkaAdmin, OutboundRecord } from './types.js';

/** Kafka's default `message.max.bytes` (broker) and `max.message.bytes` (topic): 1,048,588 bytes. */
export const KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588;

/** Room left for the record batch header and per-record overhead, in bytes per record. */
const RECORD_OVERHEAD_BYTES = 70;

/** Reads `max.message.bytes` of each topic. Topics it cannot read get Kafka's default. */
export async function readTopicLimits(admin: KafkaAdmin, topics: readonly string[]): Promise<Map<string, number>> {
  const limits = new Map<string, number>();
  if (topics.length === 0) return limits;
  for (const [topic, configs] of await admin.describeTopicConfigs(topics, ['max.message.bytes'])) {
    const v = Number(configs['max.message.bytes']);
    limits.set(topic, Number.isFinite(v) && v > 0 ? v : KAFKA_DEFAULT_MAX_MESSAGE_BYTES);
  }
  return limits;
}

/** Approximate encoded size of a record, in bytes. */
export function recordBytes(r: OutboundRecord): number {
  let n = RECORD_OVERHEAD_BYTES + r.value.length + (r.key === null ? 0 : Buffer.byteLength(r.key));
  for (const [k, v] of Object.entries(r.headers)) n += Buffer.byteLength(k) + Buffer.byteLength(v) + 4;
  return n;
}

/**
 * Splits records, in order, into consecutive chunks such that the records of one topic in one
 * chunk add up to at most `limitOf(topic)` bytes (a record larger than that alone forms its own
 * chunk, and the broker will judge it). Sending the chunks one after another keeps every key's
 * order.
 */
export function splitByTopicLimit(
  records: readonly OutboundRecord[],
  limitOf: (topic: string) => number,
): OutboundRecord[][] {
  const chunks: OutboundRecord[][] = [];
  let current: OutboundRecord[] = [];
  const used = new Map<string, number>();
  for (const r of records) {
    const size = recordBytes(r);
    const sofar = used.get(r.topic) ?? 0;
    if (current.length > 0 && sofar > 0 && sofar + size > limitOf(r.topic)) {
      chunks.push(current);
      current = [];
      used.clear();
    }
    current.push(r);
    used.set(r.topic, (used.get(r.topic) ?? 0) + size);
  }
  if (current.length > 0) chunks.push(current);
  return chunks;
}
