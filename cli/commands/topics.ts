import { Option, type Command } from 'commander';
import type { KafkaClient } from '../../src/kafka/types.js';
import { addKafkaOptions, kafkaFromOptions, positiveInt, topicNameList } from '../shared.js';
import { printError, printJson, printLines } from '../printable.js';
import { ensureTopics, weakAcksReason } from '../../src/kafka/topics.js';

/**
 * Default of `topics ensure --timeout-ms`, in ms: a cluster that starts or elects leaders is ready
 * well within it, and an operator with a wrong broker address is told so in 15 s, not a minute.
 */
const ENSURE_TIMEOUT_MS = 15_000;

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
      new Option(
        '--replication-factor <n>',
        "replication factor of new topics (default: the brokers' default.replication.factor)",
      ).argParser(positiveInt),
    )
    .addOption(
      new Option('--timeout-ms <ms>', 'give up when the topics are not ready after this long, retries included')
        .argParser(positiveInt)
        .default(ENSURE_TIMEOUT_MS),
    )
    .option('--json', 'print JSON')
    .action(
      async (
        names: string[],
        opts: { partitions: number; replicationFactor?: number; timeoutMs: number; json?: boolean },
      ) => {
        const { client } = kafkaFromOptions(opts, { clientId: 'outboxkit-cli' });
        // Retries the errors a cluster answers while it starts or elects leaders (src/kafka/topics.ts).
        const { created, existing } = await ensureTopics(
          client,
          names.map((topic) => ({
            topic,
            numPartitions: opts.partitions,
            ...(opts.replicationFactor !== undefined ? { replicationFactor: opts.replicationFactor } : {}),
          })),
          { timeoutMs: opts.timeoutMs },
        );
        const facts = await topicFacts(client, [...created, ...existing]);
        const partitions = Object.fromEntries(Object.entries(facts).map(([t, f]) => [t, f.partitions]));
        const replication = Object.fromEntries(
          Object.entries(facts).map(([t, f]) => [
            t,
            { replicationFactor: f.replicationFactor ?? null, minInsyncReplicas: f.minInsyncReplicas ?? null },
          ]),
        );
        // An existing topic is left as it is: say when its partition count is not the one asked for
        // (per-key order and the consumers' parallelism depend on it; Kafka never shrinks a topic).
        const differ = existing.filter((t) => partitions[t] !== undefined && partitions[t] !== opts.partitions);
        if (opts.json) printJson({ created, existing, partitions, replication });
        else printLines(created.length ? `created: ${created.join(', ')}` : 'all topics exist');
        for (const topic of differ) {
          printError(
            `outboxkit: ${topic} exists with ${partitions[topic]} partitions, not ${opts.partitions}: left as it is ` +
              '(--partitions applies to new topics only).',
          );
        }
        // In the order the topics were given.
        for (const topic of new Set(names)) {
          const f = facts[topic];
          if (!f) continue;
          const weak = f.replicationFactor && weakAcksReason(f.replicationFactor, f.minInsyncReplicas);
          if (weak) printError(`outboxkit: warning: ${topic} has ${weak}.`);
        }
      },
    );
}

/** What `topics ensure` reports of a topic: partitions, replication factor, effective `min.insync.replicas`. */
interface TopicFacts {
  partitions: number;
  /** Undefined when the client does not report the partitions' replicas. */
  replicationFactor: number | undefined;
  minInsyncReplicas: number | undefined;
}

/**
 * The facts of each of `topics`, by name (a topic that vanished meanwhile is left out; {} when the
 * metadata read fails; `minInsyncReplicas` undefined when its configuration cannot be read).
 */
async function topicFacts(client: KafkaClient, topics: readonly string[]): Promise<Record<string, TopicFacts>> {
  if (topics.length === 0) return {};
  const admin = client.admin();
  try {
    await admin.connect();
    const metadata = await admin.describeTopics(topics);
    const configs = await admin
      .describeTopicConfigs(
        metadata.map((t) => t.name),
        ['min.insync.replicas'],
      )
      .catch(() => new Map<string, Record<string, string | null>>());
    return Object.fromEntries(
      metadata.map((t) => {
        const minIsr = Number(configs.get(t.name)?.['min.insync.replicas'] ?? NaN);
        const replicas = t.partitions.map((p) => p.replicas?.length ?? 0);
        const facts: TopicFacts = {
          partitions: t.partitions.length,
          // The smallest over the partitions: a partition reassigned to fewer replicas is the weak one.
          replicationFactor: replicas.length > 0 && !replicas.includes(0) ? Math.min(...replicas) : undefined,
          minInsyncReplicas: Number.isInteger(minIsr) ? minIsr : undefined,
        };
        return [t.name, facts];
      }),
    );
  } catch {
    return {};
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}
