/**
 * The WAL relay's producer settings (relay/wal/wal-kafka.ts): what it asks of the client's
 * producer. Pure logic: a fake client records the settings and never reaches a broker.
 */
import { describe, expect, it } from 'vitest';
import { noopLogger } from '../../../../src/logger.js';
import type { KafkaClient, KafkaProducer, ProducerSettings } from '../../../../src/kafka/types.js';
import { WalKafka } from '../../../../relay/wal/wal-kafka.js';

function recordingClient(): { client: KafkaClient; settings: ProducerSettings[] } {
  const settings: ProducerSettings[] = [];
  const producer = {
    connect: async () => {},
    disconnect: async () => {},
    send: async () => undefined,
  } as unknown as KafkaProducer;
  const client = {
    producer: (s?: ProducerSettings) => {
      settings.push(s ?? {});
      return producer;
    },
    admin: () => {
      throw new Error('not used');
    },
  } as unknown as KafkaClient;
  return { client, settings };
}

describe('WalKafka producer settings', () => {
  // Breach caught: without sendTimeoutMs, a @platformatic/kafka send the relay gave up on after
  // brokerTimeoutMs keeps its client producer busy, and a later send waits behind it (C27 on the
  // 3-node cluster, found for the table relay).
  it('gives the producer sendTimeoutMs = brokerTimeoutMs beside the tunable settings and the relay retry timing', async () => {
    const { client, settings } = recordingClient();
    const kafka = new WalKafka(
      client,
      { brokerTimeoutMs: 4_321, maxBatchBytes: 1_000_000, producerOptions: { requestTimeoutMs: 7_000 } },
      noopLogger,
    );
    await kafka.producer();
    expect(settings).toHaveLength(1);
    expect(settings[0]).toMatchObject({
      sendTimeoutMs: 4_321,
      requestTimeoutMs: 7_000,
      retryInitialMs: 100,
      metadataMaxAgeMs: 30_000,
    });
  });
});
