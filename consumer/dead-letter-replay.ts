/**
 * Reading and re-driving a dead-letter topic (docs/guarantees.md, G5: dead letters stay visible and can be
 * replayed). Used by `outboxkit dlq list|replay`.
 *
 * Reading uses a throwaway consumer group (kafkajs has no manual partition assignment): it reads
 * every partition from the earliest offset up to the log end taken when the read starts, commits
 * nothing, and the group is deleted afterwards. Nothing of an application's group is touched.
 *
 * Replaying produces each chosen dead letter again to the topic the dead-letter topic belongs to
 * (`orders.dlq` → `orders`), or to the one the operator names, with its original key, value and
 * headers minus the `dlq-*` ones, through an idempotent producer. Never to the topic a record's
 * `dlq-original-topic` header names: whoever may write to the dead-letter topic chooses that
 * header, and the replay runs with the operator's credentials.
 * The event id does not change, so the dedup consumer applies a replayed event at most once per
 * group: replaying twice, or replaying an event that another group had already applied, only
 * produces duplicates that are skipped. (Within the inbox retention: a group whose inbox row for
 * the event has been cleaned up applies it again.)
 */
import { randomBytes } from 'node:crypto';
import { InvalidOptionsError, TopicMissingError } from '../src/errors.js';
import { kafkaClientOf, type Kafka } from '../src/kafka/kafkajs/client.js';
import { throwIfFailed } from '../src/kafka/outcomes.js';
import type { InboundMessage, KafkaClient, ProducerMessage } from '../src/kafka/types.js';
import { HEADER_EVENT_ID, HEADER_EVENT_TYPE, KAFKA_TOPIC_NAME } from '../src/outbox/event.js';
import { decodeHeaders, readEventId } from './consumed-event.js';
import {
  DEAD_LETTER_TOPIC_SUFFIX,
  replayMessage,
  summarizeDeadLetter,
  topicOfDeadLetterTopic,
  type DeadLetterSummary,
} from './dead-letter.js';

/** One record of a dead-letter topic: its summary and the raw message (for replay). */
export interface DeadLetterRecord {
  summary: DeadLetterSummary;
  message: InboundMessage;
}

/** Options of {@link readDeadLetters}. */
export interface ReadDeadLettersOptions {
  /** Stop after this many records (in the order they are read). @defaultValue no limit */
  limit?: number;
  /** Give up waiting for the log end after this long, in ms, and return what was read. @defaultValue 30_000 */
  timeoutMs?: number;
  /** The header that carries the event id. @defaultValue 'event-id' */
  eventIdHeader?: string;
}

/** What {@link readDeadLetters} read. */
export interface DeadLetters {
  records: DeadLetterRecord[];
  /** False when `timeoutMs` passed before every partition reached its log end. */
  complete: boolean;
}

function checkTopicName(what: string, topic: string): void {
  if (typeof topic !== 'string' || !KAFKA_TOPIC_NAME.test(topic)) {
    throw new InvalidOptionsError(
      `${what} ${JSON.stringify(topic)} is not a legal Kafka topic name (1-249 letters, digits, '.', '_', '-').`,
    );
  }
}

async function existingTopics(client: KafkaClient): Promise<Set<string>> {
  const admin = client.admin();
  await admin.connect();
  try {
    return new Set(await admin.listTopics());
  } finally {
    await admin.disconnect();
  }
}

/**
 * Reads a dead-letter topic from the beginning up to its current log end.
 *
 * @param kafka - a kafkajs `Kafka` instance (made into a client by `createKafkajsClient`), or a
 *   `KafkaClient` of outboxkit/kafka.
 * @throws {@link TopicMissingError} when the topic does not exist.
 */
export async function readDeadLetters(
  kafka: Kafka | KafkaClient,
  topic: string,
  options: ReadDeadLettersOptions = {},
): Promise<DeadLetters> {
  const client = kafkaClientOf(kafka);
  checkTopicName('The dead-letter topic', topic);
  const limit = options.limit ?? Number.POSITIVE_INFINITY;
  if (!(limit === Number.POSITIVE_INFINITY || (Number.isInteger(limit) && limit >= 1))) {
    throw new InvalidOptionsError(`limit must be a positive integer, got ${String(options.limit)}.`);
  }
  const timeoutMs = options.timeoutMs ?? 30_000;
  const eventIdHeader = options.eventIdHeader ?? HEADER_EVENT_ID;

  const admin = client.admin();
  await admin.connect();
  let ends: Map<number, bigint>;
  try {
    if (!(await admin.listTopics()).includes(topic)) {
      throw new TopicMissingError(`The dead-letter topic ${JSON.stringify(topic)} does not exist.`);
    }
    // The log end of each partition now: records dead-lettered while we read are left for later.
    ends = new Map(
      (await admin.partitionOffsets(topic))
        .filter((p) => BigInt(p.high) > BigInt(p.low))
        .map((p) => [p.partition, BigInt(p.high)]),
    );
  } finally {
    await admin.disconnect();
  }
  const records: DeadLetterRecord[] = [];
  if (ends.size === 0) return { records, complete: true };

  const groupId = `outboxkit-dlq-reader-${randomBytes(6).toString('hex')}`;
  const consumer = client.groupConsumer({ groupId, fetchMaxWaitMs: 500 });
  let complete = false;
  await consumer.connect();
  try {
    await consumer.subscribe([topic], { fromBeginning: true });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(resolve, timeoutMs);
      const finish = () => {
        clearTimeout(timer);
        complete = true;
        resolve();
      };
      consumer
        .run({
          // No autoCommitIntervalMs: the throwaway group commits nothing.
          eachBatch: async (batch) => {
            // The whole batch is read (the next fetch starts after it), whatever is kept of it.
            try {
              const end = ends.get(batch.partition);
              if (end === undefined) return;
              for (const message of batch.messages) {
                if (BigInt(message.offset) >= end || records.length >= limit) break;
                const headers = decodeHeaders(message.headers);
                const summary = summarizeDeadLetter(
                  message,
                  { topic, partition: batch.partition },
                  readEventId(headers, eventIdHeader),
                  headers[HEADER_EVENT_TYPE] ?? null,
                  eventIdHeader,
                );
                records.push({ summary, message });
                if (BigInt(message.offset) + 1n >= end) ends.delete(batch.partition);
              }
              // A partition whose last records were removed (compaction, transactions' markers)
              // never shows its last offset: the batch's high watermark tells it is read through.
              if (BigInt(batch.highWatermark) <= BigInt(batch.lastOffset) + 1n) ends.delete(batch.partition);
              if (ends.size === 0 || records.length >= limit) finish();
            } finally {
              batch.markProcessed(batch.lastOffset);
            }
          },
        })
        .catch(reject);
    });
  } finally {
    await consumer.disconnect();
    await deleteGroup(client, groupId);
  }
  // Partitions are read concurrently; list in a stable order.
  records.sort(
    (a, b) =>
      a.summary.dlq.partition - b.summary.dlq.partition || compareOffsets(a.summary.dlq.offset, b.summary.dlq.offset),
  );
  return { records, complete };
}

function compareOffsets(a: string, b: string): number {
  const d = BigInt(a) - BigInt(b);
  return d < 0n ? -1 : d > 0n ? 1 : 0;
}

/** Best effort: the throwaway group committed nothing, so the broker would expire it anyway. */
async function deleteGroup(client: KafkaClient, groupId: string): Promise<void> {
  const admin = client.admin();
  try {
    await admin.connect();
    await admin.deleteGroup(groupId);
  } catch {
    // ignored
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

/** Options of {@link replayDeadLetters}. */
export interface ReplayDeadLettersOptions {
  /** Replay these events (by event id). Either this or `all`. */
  eventIds?: readonly string[];
  /** Replay every dead letter that has a usable event id. */
  all?: boolean;
  /**
   * Produce every chosen dead letter to this topic. Needed when the dead-letter topic is not named
   * `<topic>.dlq`, or to send dead letters elsewhere than their topic (a retry topic).
   * @defaultValue the topic the dead-letter topic belongs to (`orders.dlq` → `orders`)
   */
  to?: string;
  /** The header that carries the event id. @defaultValue 'event-id' */
  eventIdHeader?: string;
  /** See {@link ReadDeadLettersOptions.timeoutMs}. @defaultValue 30_000 */
  timeoutMs?: number;
}

/** What {@link replayDeadLetters} did. */
export interface ReplayResult {
  /** The events produced again, with the topic they went to. */
  replayed: { eventId: string; topic: string; dlqOffset: string; dlqPartition: number }[];
  /** Dead letters left alone, and why. */
  skipped: { dlqPartition: number; dlqOffset: string; eventId: string | null; why: string }[];
  /** Requested event ids that are not in the dead-letter topic. */
  notFound: string[];
}

/**
 * Re-drives dead letters: produces each chosen record again (original key, value and headers
 * minus `dlq-*`) to the topic the dead-letter topic belongs to (`orders.dlq` → `orders`), or to
 * `to`, and waits for the broker's acknowledgement. Without `to`, a record whose
 * `dlq-original-topic` header names another topic (or none) is skipped, with the reason: the
 * dedup consumer always writes the topic it read from, so such a record was written by someone
 * else, and replaying it there would publish with the operator's credentials wherever its writer
 * chose.
 * When an event was dead-lettered several times, only its latest record is replayed (its latest
 * one with a value, when a later copy went without). Records
 * without a usable event id are skipped: the consumer would dead-letter them again at once. So are
 * records whose value was left out (`dlq-omitted`): their original is in the original topic.
 * A record with a key goes to the partition the default partitioner picks for that key (the
 * relay's choice too); one without a key goes back to its original partition.
 *
 * @param kafka - a kafkajs `Kafka` instance (made into a client by `createKafkajsClient`), or a
 *   `KafkaClient` of outboxkit/kafka.
 * @throws {@link InvalidOptionsError} when neither `eventIds` nor `all` is given, a name is invalid,
 *   or `to` is missing for a dead-letter topic not named `<topic>.dlq`.
 * @throws {@link TopicMissingError} when the dead-letter or a target topic does not exist.
 */
export async function replayDeadLetters(
  kafka: Kafka | KafkaClient,
  dlqTopic: string,
  options: ReplayDeadLettersOptions,
): Promise<ReplayResult> {
  const client = kafkaClientOf(kafka);
  const wanted = options.eventIds?.map((id) => id.toLowerCase());
  if (!options.all && (!wanted || wanted.length === 0)) {
    throw new InvalidOptionsError('replayDeadLetters: give the event ids to replay, or all: true.');
  }
  if (options.all && wanted && wanted.length > 0) {
    throw new InvalidOptionsError('replayDeadLetters: give either event ids or all: true, not both.');
  }
  if (options.to !== undefined) checkTopicName('The target topic', options.to);
  checkTopicName('The dead-letter topic', dlqTopic);
  const owner = topicOfDeadLetterTopic(dlqTopic);
  if (options.to === undefined && owner === null) {
    throw new InvalidOptionsError(
      `Cannot tell which topic ${JSON.stringify(dlqTopic)} is the dead-letter topic of (it is not named ` +
        `<topic>${DEAD_LETTER_TOPIC_SUFFIX}): name the topic to replay to with --to <topic> (to: in replayDeadLetters()). ` +
        "A record's dlq-original-topic header is never trusted for it.",
    );
  }

  const { records } = await readDeadLetters(client, dlqTopic, {
    eventIdHeader: options.eventIdHeader,
    timeoutMs: options.timeoutMs,
  });
  const result: ReplayResult = { replayed: [], skipped: [], notFound: [] };
  const wantedSet = wanted ? new Set(wanted) : undefined;
  // The latest dead letter of each event id wins.
  const latest = new Map<string, DeadLetterRecord>();
  for (const record of records) {
    const { eventId, dlq } = record.summary;
    if (eventId === null) {
      if (options.all) {
        result.skipped.push({
          dlqPartition: dlq.partition,
          dlqOffset: dlq.offset,
          eventId: null,
          why: 'no usable event id (it would be dead-lettered again)',
        });
      }
      continue;
    }
    if (wantedSet && !wantedSet.has(eventId)) continue;
    const previous = latest.get(eventId);
    if (previous && previous.summary.omitted === null && record.summary.omitted !== null) {
      // A later copy without its value: the earlier one, which has it, is the one to replay.
      result.skipped.push({
        dlqPartition: dlq.partition,
        dlqOffset: dlq.offset,
        eventId,
        why: 'a later dead letter of the same event, without its value (an earlier one with it is replayed)',
      });
      continue;
    }
    if (previous) {
      result.skipped.push({
        dlqPartition: previous.summary.dlq.partition,
        dlqOffset: previous.summary.dlq.offset,
        eventId,
        why: 'an earlier dead letter of the same event',
      });
    }
    latest.set(eventId, record);
  }
  if (wanted) result.notFound = [...new Set(wanted)].filter((id) => !latest.has(id));

  const byTopic = new Map<string, { record: DeadLetterRecord; message: ProducerMessage }[]>();
  for (const [eventId, record] of latest) {
    const { summary } = record;
    if (summary.omitted !== null) {
      result.skipped.push({
        dlqPartition: summary.dlq.partition,
        dlqOffset: summary.dlq.offset,
        eventId,
        why:
          'its value was left out (dlq-omitted: too large for the dead-letter topic); re-drive the original, ' +
          `${summary.originalTopic ?? '?'}/${summary.originalPartition ?? '?'}@${summary.originalOffset ?? '?'}, ` +
          'while that topic keeps it (docs/runbooks.md, dead letters)',
      });
      continue;
    }
    const target = options.to ?? owner!;
    if (options.to === undefined && summary.originalTopic !== owner) {
      result.skipped.push({
        dlqPartition: summary.dlq.partition,
        dlqOffset: summary.dlq.offset,
        eventId,
        why:
          summary.originalTopic === null
            ? `no dlq-original-topic header (not written by the dedup consumer); replay it with --to ${owner} ` +
              'if it belongs there'
            : `its dlq-original-topic header names ${JSON.stringify(summary.originalTopic)}, not ${owner}, the topic ` +
              `${dlqTopic} belongs to: not replayed (the dedup consumer never writes that; whoever wrote the ` +
              'record chose it). Replay it with --to <topic> if you mean it',
      });
      continue;
    }
    const message = replayMessage(record.message);
    if (message.key === null && target === summary.originalTopic && summary.originalPartition !== null) {
      message.partition = summary.originalPartition;
    }
    let list = byTopic.get(target);
    if (!list) byTopic.set(target, (list = []));
    list.push({ record, message });
  }
  if (byTopic.size === 0) return result;

  const existing = await existingTopics(client);
  const missing = [...byTopic.keys()].filter((t) => !existing.has(t));
  if (missing.length > 0) {
    throw new TopicMissingError(
      `Cannot replay: topic${missing.length > 1 ? 's' : ''} ${missing.map((t) => JSON.stringify(t)).join(', ')} ` +
        'do(es) not exist; nothing was replayed. Create them, or choose another with --to.',
    );
  }
  // Idempotent, acks=all, one request in flight: the broker never duplicates or reorders a retried
  // send. The relay's partitioner (Java-compatible murmur2): a replayed key lands where its events did.
  const producer = client.producer({ retries: 5 });
  await producer.connect();
  try {
    for (const [topic, items] of byTopic) {
      throwIfFailed(await producer.send(items.map((i) => ({ ...i.message, topic }))));
      for (const { record } of items) {
        result.replayed.push({
          eventId: record.summary.eventId!,
          topic,
          dlqPartition: record.summary.dlq.partition,
          dlqOffset: record.summary.dlq.offset,
        });
      }
    }
  } finally {
    await producer.disconnect();
  }
  return result;
}
