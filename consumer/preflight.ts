/**
 * The dedup consumer's start-up checks, before it connects to its group: the inbox table (and,
 * with `recordProgress`, the progress table) exists and PostgreSQL answers; every consumed topic
 * and dead-letter topic exists (nothing is ever created); warnings about topics that keep
 * messages at least as long as the inbox keeps rows, and about dead-letter topics that take
 * smaller records than their consumed topic.
 */
import { joinTransaction, runTransaction, type DatabaseHandle, type TransactionHandle } from '../src/database.js';
import { TopicMissingError } from '../src/errors.js';
import type { KafkaAdmin, KafkaClient } from '../src/kafka/types.js';
import { MISSING_RELATION_SQLSTATES } from '../src/postgres.js';
import { codesOf } from './classify-error.js';
import { InboxUnavailableError } from './errors.js';
import type { DedupConsumerEvents, TypedEmitter } from './events.js';
import { probeInboxSql } from './inbox-sql.js';
import type { ResolvedDedupConsumerOptions } from './options.js';
import { probeProgressSql } from './progress-sql.js';

/** The topic configuration that bounds how far back Kafka can redeliver (Kafka topic configs). */
const TOPIC_RETENTION_CONFIG = 'retention.ms';
const TOPIC_MAX_MESSAGE_BYTES_CONFIG = 'max.message.bytes';
/**
 * Room a dead letter needs above the largest record of its consumed topic, in bytes: the `dlq-*`
 * headers (a reason of up to 1,000 characters, the original position, attempts, time, group).
 */
const DEAD_LETTER_HEADROOM_BYTES = 2_048;

type Options = Pick<
  ResolvedDedupConsumerOptions<DatabaseHandle>,
  | 'database'
  | 'schema'
  | 'schemaSql'
  | 'recordProgress'
  | 'groupId'
  | 'topics'
  | 'deadLetterTopics'
  | 'inboxRetentionMs'
  | 'logger'
>;

/**
 * Checks that the inbox table (and, with `recordProgress`, the `consumer_progress` table) exists
 * and that PostgreSQL answers.
 *
 * @throws {@link InboxUnavailableError} when a table is missing (`retriable: false`: apply the
 *   migrations), or PostgreSQL does not answer (`retriable: true`).
 */
export async function checkInbox(o: Options): Promise<void> {
  const { database, schema, schemaSql, recordProgress } = o;
  let table = 'inbox';
  try {
    // Through runTransaction() on purpose: for a pg.Pool it also adds outboxkit's 'error' listener
    // (once per pool), so PostgreSQL terminating an idle connection cannot crash the process
    // (test/consumer/pool-idle-terminated.test.ts).
    await runTransaction(database, async (tx) => {
      const q = joinTransaction(tx as TransactionHandle, 'the dedup consumer');
      await q.query(probeInboxSql(schemaSql).text);
      table = 'consumer_progress';
      if (recordProgress) await q.query(probeProgressSql(schemaSql).text);
    });
  } catch (err) {
    if ([...codesOf(err)].some((code) => MISSING_RELATION_SQLSTATES.has(code))) {
      const what =
        table === 'inbox'
          ? `The inbox table "${schema}".inbox does not exist in this database`
          : `The table "${schema}".consumer_progress, which recordProgress writes, does not exist in this database ` +
            '(migration 0001_consumer_progress not applied)';
      throw new InboxUnavailableError(
        `${what}; apply outboxkit's migrations (\`outboxkit migrate\`, or migrate() from outboxkit) or set the ` +
          '`schema` option to the schema that holds it.',
        { cause: err },
      );
    }
    throw new InboxUnavailableError(
      `PostgreSQL did not answer the dedup consumer's inbox check (${(err as Error)?.message ?? String(err)}); ` +
        'check the database connection and start again.',
      { cause: err, retriable: true },
    );
  }
}

/**
 * Checks that every consumed topic and dead-letter topic exists, then warns about retention and
 * dead-letter size limits (log, and `consumer:retention-warning`).
 *
 * @throws {@link TopicMissingError} naming the missing topics (nothing is created).
 */
export async function checkTopics(
  client: KafkaClient,
  o: Options,
  events: TypedEmitter<DedupConsumerEvents>,
): Promise<void> {
  const admin = client.admin();
  await admin.connect();
  try {
    await requireTopics(admin, o);
    await checkRetention(admin, o, events);
    await checkDeadLetterLimits(admin, o);
  } finally {
    await admin.disconnect();
  }
}

/**
 * Throws a {@link TopicMissingError} naming the consumed and dead-letter topics that do not exist.
 * Asks the metadata of those topics only (a leaderless partition elsewhere in the cluster is none
 * of the consumer's business; the admin client never asks the broker to auto-create them, Metadata
 * v4+); only when one is missing, the list of every topic, to name which.
 */
async function requireTopics(admin: KafkaAdmin, o: Options): Promise<void> {
  const needed = [...new Set([...o.topics, ...o.deadLetterTopics.values()])];
  let failure: unknown;
  try {
    const described = await admin.describeTopics(needed);
    if (needed.every((t) => described.some((d) => d.name === t && d.partitions.length > 0))) return;
  } catch (err) {
    // A missing topic fails the request (UNKNOWN_TOPIC_OR_PARTITION): the list below names it;
    // when none is missing, this error is the answer.
    failure = err;
  }
  const existing = new Set(await admin.listTopics());
  const missing = needed.filter((topic) => !existing.has(topic));
  if (missing.length === 0) {
    if (failure !== undefined) throw failure;
    return;
  }
  const names = missing.map((t) => JSON.stringify(t)).join(', ');
  throw new TopicMissingError(
    `Kafka topic${missing.length > 1 ? 's' : ''} ${names} ${missing.length > 1 ? 'do' : 'does'} not exist. The dedup consumer ` +
      'needs every consumed topic and its dead-letter topic, and never creates topics. Create them with ' +
      '`outboxkit topics ensure` or, for each, `kafka-topics.sh --bootstrap-server <broker> --create --topic <name> --partitions <n>`.',
  );
}

/**
 * Warns about each consumed topic whose `retention.ms` is not shorter than the inbox retention:
 * Kafka could then redeliver (offset reset, replay from the earliest offset) an event whose
 * inbox row was already cleaned up, and it would be applied again. A broker that refuses
 * DescribeConfigs (ACLs) costs a warning, not the start.
 */
async function checkRetention(admin: KafkaAdmin, o: Options, events: TypedEmitter<DedupConsumerEvents>): Promise<void> {
  const { topics, inboxRetentionMs, logger, groupId } = o;
  const retention = await describeTopics(admin, o, {
    topics,
    configName: TOPIC_RETENTION_CONFIG,
    what: 'the inbox retention',
  });
  for (const [topic, value] of retention) {
    const topicRetentionMs = value < 0 ? null : value;
    if (topicRetentionMs !== null && topicRetentionMs < inboxRetentionMs) continue;
    logger.warn(
      { groupId, topic, topicRetentionMs, inboxRetentionMs },
      `Topic ${topic} keeps messages ${topicRetentionMs === null ? 'forever' : `for ${topicRetentionMs} ms`}, ` +
        `not less than the inbox keeps rows (${inboxRetentionMs} ms): a redelivery of an older message would be applied ` +
        "again. Lower the topic's retention.ms or raise inboxRetentionMs (and the cleanup's retention).",
    );
    events.emit('consumer:retention-warning', { topic, topicRetentionMs, inboxRetentionMs });
  }
}

/**
 * Warns about each dead-letter topic whose `max.message.bytes` is below its consumed topic's: the
 * larger messages would be dead-lettered without their value (`dlq-omitted`; equal limits leave
 * that to the few messages within {@link DEAD_LETTER_HEADROOM_BYTES} of the limit).
 */
async function checkDeadLetterLimits(admin: KafkaAdmin, o: Options): Promise<void> {
  const { topics, deadLetterTopics, logger, groupId } = o;
  const limits = await describeTopics(admin, o, {
    topics: [...new Set([...topics, ...deadLetterTopics.values()])],
    configName: TOPIC_MAX_MESSAGE_BYTES_CONFIG,
    what: "the dead-letter topics' size limits",
  });
  for (const topic of topics) {
    const deadLetterTopic = deadLetterTopics.get(topic);
    const sourceMax = limits.get(topic);
    const deadLetterMax = deadLetterTopic === undefined ? undefined : limits.get(deadLetterTopic);
    if (sourceMax === undefined || deadLetterMax === undefined || deadLetterMax >= sourceMax) continue;
    logger.warn(
      {
        groupId,
        topic,
        deadLetterTopic,
        maxMessageBytes: sourceMax,
        deadLetterMaxMessageBytes: deadLetterMax,
      },
      `Dead-letter topic ${deadLetterTopic} accepts records of up to ${deadLetterMax} bytes, less than ${topic} ` +
        `(${sourceMax}): a message larger than the dead-letter topic takes would be dead-lettered without its ` +
        `value (dlq-omitted). Give it at least ${topic}'s max.message.bytes plus ${DEAD_LETTER_HEADROOM_BYTES} for the dlq-* headers.`,
    );
  }
}

/**
 * One numeric configuration of each of `topics` (DescribeConfigs), by topic; topics whose value is
 * missing or not a number are left out. A refused request costs a warning naming `what`, and an
 * empty map.
 */
async function describeTopics(
  admin: KafkaAdmin,
  o: Options,
  { topics, configName, what }: { topics: readonly string[]; configName: string; what: string },
): Promise<Map<string, number>> {
  const values = new Map<string, number>();
  let described: Map<string, Record<string, string | null>>;
  try {
    described = await admin.describeTopicConfigs(topics, [configName]);
  } catch (err) {
    o.logger.warn(
      { groupId: o.groupId, err },
      `Could not read the topics' ${configName} (DescribeConfigs refused?); ${what} is not checked.`,
    );
    return values;
  }
  for (const [topic, configs] of described) {
    const configValue = configs[configName];
    if (configValue === undefined || configValue === null) continue;
    const value = Number(configValue);
    if (Number.isFinite(value)) values.set(topic, value);
  }
  return values;
}
