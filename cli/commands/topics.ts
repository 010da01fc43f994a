import { Option, type Command } from 'commander';
import { addKafkaOptions, int, kafkaFromOptions, positiveInt, topicNameList } from '../shared.js';

/** `outboxkit topics ensure`. */
export function registerTopics(program: Command): void {
  const topics = program.command('topics').description('Kafka topic operations');
  const ensure = topics
    .command('ensure')
    .description('create the given topics if they do not exist')
    .argument('<topics...>', 'topic names', topicNameList);
  addKafkaOptions(ensure)
    .addOption(new Option('--partitions <n>', 'partitions of new topics').argParser(positiveInt).default(3))
    .addOption(new Option('--replication-factor <n>', 'replication factor of new topics').argParser(int).default(1))
    .option('--json', 'print JSON')
    .action(async (names: string[], opts: { partitions: number; replicationFactor: number; json?: boolean }) => {
      const { kafka } = kafkaFromOptions(opts, { clientId: 'outboxkit-cli' });
      const admin = kafka.admin();
      await admin.connect();
      try {
        const existing = new Set(await admin.listTopics());
        const missing = names.filter((t) => !existing.has(t));
        if (missing.length > 0) {
          await admin.createTopics({
            waitForLeaders: true,
            topics: missing.map((topic) => ({
              topic,
              numPartitions: opts.partitions,
              replicationFactor: opts.replicationFactor,
            })),
          });
        }
        if (opts.json)
          console.log(JSON.stringify({ created: missing, existing: names.filter((t) => existing.has(t)) }));
        else console.log(missing.length ? `created: ${missing.join(', ')}` : 'all topics exist');
      } finally {
        await admin.disconnect();
      }
    });
}
