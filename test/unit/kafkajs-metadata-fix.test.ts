/**
 * The replacement of kafkajs' Metadata response `parse` (src/kafka/kafkajs/metadata-fix.ts): a
 * partition without a leader (LEADER_NOT_AVAILABLE) or with a replica down (REPLICA_NOT_AVAILABLE)
 * no longer fails the whole answer; every other error still does, as kafkajs' own parse. On
 * kafkajs' real response modules of every Metadata version it ships; test/cluster/partial-outage
 * runs it against a cluster with a dead broker.
 */
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { applyKafkajsMetadataFix } from '../../src/kafka/kafkajs/metadata-fix.js';

const require = createRequire(import.meta.url);
type Parse = (data: unknown) => Promise<unknown>;
const responses = [0, 1, 2, 3, 4, 5, 6].map(
  (v) => require(`kafkajs/src/protocol/requests/metadata/v${v}/response.js`) as { parse: Parse },
);

/** kafkajs' own parse, taken before any test applies the fix (each test file has its own modules). */
const originalParse = responses[0]!.parse;

/** A Metadata answer with one topic whose partitions carry `codes` (Kafka protocol error codes). */
function answer(codes: number[], topicErrorCode = 0) {
  return {
    brokers: [{ nodeId: 1, host: '127.0.0.1', port: 9092 }],
    topicMetadata: [
      {
        topic: 'orders',
        topicErrorCode,
        partitionMetadata: codes.map((partitionErrorCode, partitionId) => ({
          partitionErrorCode,
          partitionId,
          leader: partitionErrorCode === 5 ? -1 : 1,
          replicas: [1],
          isr: partitionErrorCode === 5 ? [] : [1],
        })),
      },
    ],
  };
}

describe('the kafkajs metadata fix', () => {
  it("kafkajs' own parse fails a whole answer on one leaderless partition (what the fix is for)", async () => {
    await expect(originalParse(answer([0, 5]))).rejects.toMatchObject({ type: 'LEADER_NOT_AVAILABLE' });
    expect(applyKafkajsMetadataFix()).toBe('applied');
    expect(responses.every((r) => r.parse !== originalParse)).toBe(true);
  });

  it('keeps leaderless partitions (leader -1) and those with a replica down, in every Metadata version', async () => {
    applyKafkajsMetadataFix();
    for (const [v, r] of responses.entries()) {
      const data = answer([0, 5, 9]);
      await expect(r.parse(data), `v${v}`).resolves.toBe(data);
    }
  });

  it('still fails on every other partition error, and on a topic error', async () => {
    applyKafkajsMetadataFix();
    for (const [v, r] of responses.entries()) {
      // 3 UNKNOWN_TOPIC_OR_PARTITION, 29 TOPIC_AUTHORIZATION_FAILED: as kafkajs, the first one found.
      await expect(r.parse(answer([0, 5, 3])), `v${v}`).rejects.toMatchObject({ type: 'UNKNOWN_TOPIC_OR_PARTITION' });
      await expect(r.parse(answer([0], 29)), `v${v}`).rejects.toMatchObject({ type: 'TOPIC_AUTHORIZATION_FAILED' });
      // A topic error comes first, even with a leaderless partition in it.
      await expect(r.parse(answer([5], 17)), `v${v}`).rejects.toMatchObject({ type: 'INVALID_TOPIC_EXCEPTION' });
    }
  });

  it('is applied once: a second call says so', () => {
    applyKafkajsMetadataFix();
    expect(applyKafkajsMetadataFix()).toBe('already-applied');
  });
});
