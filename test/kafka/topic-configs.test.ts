/**
 * A topic created through either client's admin (`KafkaAdmin.createTopic`, what `ensureTopics()`,
 * `outboxkit topics ensure` and the tests' helpers call) gets the configurations it was given.
 * @platformatic/kafka 1.35.0 refuses `configs` in its own option check (src/kafka/platformatic/admin.ts).
 */
import { inject, describe, expect, it } from 'vitest';
import { createKafkajsClient } from '../../src/kafka/kafkajs/client.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import type { KafkaClient } from '../../src/kafka/types.js';
import { randomName } from '../helpers/kafka.js';

const clients: [string, () => KafkaClient][] = [
  ['kafkajs', () => createKafkajsClient({ brokers: inject('kafkaBrokers'), clientId: 'topic-configs' })],
  [
    '@platformatic/kafka',
    () => createPlatformaticClient({ brokers: inject('kafkaBrokers'), clientId: 'topic-configs' }),
  ],
];

describe.each(clients)('createTopic on %s', (_name, makeClient) => {
  it('creates the topic with its configurations and leaders; a second call says it exists', async () => {
    const admin = makeClient().admin();
    await admin.connect();
    try {
      const topic = randomName('topic-configs');
      const configEntries = [
        { name: 'retention.ms', value: '3600000' },
        { name: 'max.message.bytes', value: '2000' },
        { name: 'cleanup.policy', value: 'compact' },
      ];
      expect(await admin.createTopic({ topic, numPartitions: 2, replicationFactor: 1, configEntries })).toBe('created');
      const configs = await admin.describeTopicConfigs(
        [topic],
        ['retention.ms', 'max.message.bytes', 'cleanup.policy'],
      );
      expect(configs.get(topic)).toEqual({
        'retention.ms': '3600000',
        'max.message.bytes': '2000',
        'cleanup.policy': 'compact',
      });
      const [described] = await admin.describeTopics([topic]);
      expect(described?.partitions).toHaveLength(2);
      expect(described?.partitions.every((p) => p.leader !== null)).toBe(true);
      expect(await admin.createTopic({ topic, numPartitions: 2, configEntries })).toBe('exists');
    } finally {
      await admin.disconnect();
    }
  });
});
