import { Option, type Command } from 'commander';
import { addKafkaOptions, kafkaFromOptions, positiveInt, topicNameList } from '../shared.js';
import { ensureTopics } from '../../src/kafka-topics.js';

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
      const { kafka } = kafkaFromOptions(opts, { clientId: 'outboxkit-cli' });
      // Retries the errors a cluster answers while it starts or elects leaders (src/kafka-topics.ts).
      const { created, existing } = await ensureTopics(
        kafka,
        names.map((topic) => ({ topic, numPartitions: opts.partitions, replicationFactor: opts.replicationFactor })),
      );
      if (opts.json) console.log(JSON.stringify({ created, existing }));
      else console.log(created.length ? `created: ${created.join(', ')}` : 'all topics exist');
    });
}
