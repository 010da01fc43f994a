/**
 * A header name repeated in one record (`RecordHeaders`: an array of its values) is sent once per
 * value, in order, through either client's producer, and kafkajs reads it back as that array. The
 * dead-letter and replay paths carry a consumed record's headers as they came, repeats included.
 */
import { inject, describe, expect, it } from 'vitest';
import { createKafkajsClient } from '../../src/kafka/kafkajs/client.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import type { KafkaClient } from '../../src/kafka/types.js';
import { createTopics, randomName, testKafka } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';

const clients: [string, () => KafkaClient][] = [
  ['kafkajs', () => createKafkajsClient({ brokers: inject('kafkaBrokers'), clientId: 'repeated-headers' })],
  [
    '@platformatic/kafka',
    () => createPlatformaticClient({ brokers: inject('kafkaBrokers'), clientId: 'repeated-headers' }),
  ],
];

describe.each(clients)('repeated header names on %s', (_name, makeClient) => {
  it('sends each value of a repeated name, in order, beside single ones', async () => {
    const [topic] = await createTopics(['repeated-headers'], { partitions: 1 });
    const producer = makeClient().producer();
    await producer.connect();
    try {
      const result = await producer.send([
        {
          topic: topic!,
          key: 'k',
          value: Buffer.from('v'),
          headers: { 'x-hop': ['a', Buffer.from('b'), 'c'], single: 's', one: ['only'] },
        },
      ]);
      expect(result.outcomes).toMatchObject([{ ok: true }]);
    } finally {
      await producer.disconnect();
    }

    const consumer = testKafka('repeated-headers-reader').consumer({ groupId: randomName('reader') });
    await consumer.connect();
    const seen: Record<string, unknown>[] = [];
    try {
      await consumer.subscribe({ topic: topic!, fromBeginning: true });
      await consumer.run({
        eachMessage: async ({ message }) => {
          seen.push(message.headers ?? {});
        },
      });
      await waitFor(() => seen.length > 0, { timeoutMs: 30_000 });
    } finally {
      await consumer.disconnect();
    }
    const text = (v: unknown) => (Array.isArray(v) ? v.map(String) : String(v));
    expect(Object.fromEntries(Object.entries(seen[0]!).map(([k, v]) => [k, text(v)]))).toEqual({
      'x-hop': ['a', 'b', 'c'],
      single: 's',
      one: 'only',
    });
  });
});
