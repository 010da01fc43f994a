import { Option, type Command } from 'commander';
import type { KafkaClient } from '../../src/kafka/types.js';
import { addKafkaOptions, kafkaFromOptions, positiveInt, topicNameList } from '../shared.js';
import { printError, printJson, printLines } from '../printable.js';
import { ensureTopics } from '../../src/kafka/topics.js';

/** `outboxkit topics ensure`. */
export function registerTopics(program: Command): void {
  const topics = program.command('topics').description('Kafka topic operations');
  const ensure = topics
    .command('ensure')
    .description('create the given topics if they do not exist')
    .argument('<topics...>', 'topic names', topicNameList);
  addKafkaOptions(ensure)
    .addOption(new Option('--partitions <n>', 'partitions of new topics').argParser(positiveInt).default(3))
    .addOption(
      new Option('--replication-factor <n>', 'replication factor of new topics').argParser(positiveInt).default(1),
    )
    .option('--json', 'print JSON')
    .action(async (names: string[], opts: { partitions: number; replicationFactor: number; json?: boolean }) => {
      const { client } = kafkaFromOptions(opts, { clientId: 'outboxkit-cli' });
      // Retries the errors a cluster answers while it starts or elects leaders (src/kafka/topics.ts).
      const { created, existing } = await ensureTopics(
        client,
        names.map((topic) => ({ topic, numPartitions: opts.partitions, replicationFactor: opts.replicationFactor })),
      );
      // An existing topic is left as it is: say when its partition count is not the one asked for
      // (per-key order and the consumers' parallelism depend on it; Kafka never shrinks a topic).
      const partitions = await partitionCounts(client, [...created, ...existing]);
      const differ = existing.filter((t) => partitions[t] !== undefined && partitions[t] !== opts.partitions);
      if (opts.json) printJson({ created, existing, partitions });
      else printLines(created.length ? `created: ${created.join(', ')}` : 'all topics exist');
      for (const topic of differ) {
        printError(
          `outboxkit: ${topic} exists with ${partitions[topic]} partitions, not ${opts.partitions}: left as it is ` +
            '(--partitions applies to new topics only).',
        );
      }
    });
}

/** Partition count of each of `topics`, by name (a topic that vanished meanwhile is left out; {} when the read fails). */
async function partitionCounts(client: KafkaClient, topics: readonly string[]): Promise<Record<string, number>> {
  if (topics.length === 0) return {};
  const admin = client.admin();
  try {
    await admin.connect();
    const metadata = await admin.describeTopics(topics);
    return Object.fromEntries(metadata.map((t) => [t.name, t.partitions.length]));
  } catch {
    return {};
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}
