/**
 * Where a dedup consumer group begins on each of its topics, decided before it joins the group.
 *
 * Kafka starts a partition that has no committed offset of the group where the client's reset
 * policy says: its earliest record, or its end ("latest"). With "latest", every partition added to
 * a topic later, and every partition that had no event yet when the group last ran, starts at its
 * end when a member is first given it, and the events published to it before that moment are
 * never applied (docs/runbooks.md, "Growing a topic").
 *
 * So `fromBeginning: false` means "the partitions the topic has when the group first consumes it
 * begin at their end", and is kept durably in Kafka itself: at that first start, the member commits
 * the end offset of every partition for the group, before it joins. From then on every partition
 * of the topic without a committed offset is one that came later (added while the group ran or was
 * stopped), and the group consumer reads it from its beginning: the client runs with
 * `fromBeginning` for every topic. Reading a partition from its beginning is safe for a dedup
 * consumer: whatever it applied before is skipped by its inbox.
 *
 * A topic's first start is a start that finds no committed offset of the group on any partition
 * of the topic. Two members starting at once would both find none; the decision is serialised on a
 * PostgreSQL advisory lock of the group, held while the offsets are read and committed, so the
 * second member sees the first one's commits (test/consumer/group-start.test.ts). Kafka accepts a commit from outside the group only while the group has no
 * members (KafkaAdmin.commitGroupOffsets), so a member can never move back or forward the offsets of
 * members that run. When the group has members already (a rolling deploy that adds a topic to a
 * running group), the commit is refused: that topic is then consumed as Kafka's "latest" policy
 * says (its partitions begin at their end when assigned), and a warning says so.
 */
import { joinTransaction, runTransaction, type DatabaseHandle, type TransactionHandle } from '../src/database.js';
import type { GroupConsumer, KafkaAdmin, KafkaClient } from '../src/kafka/types.js';
import { InboxUnavailableError } from './errors.js';
import type { ResolvedDedupConsumerOptions } from './options.js';

type Options = Pick<
  ResolvedDedupConsumerOptions<DatabaseHandle>,
  'database' | 'groupId' | 'topics' | 'fromBeginning' | 'logger'
>;

/** How the group consumer subscribes: the topics whose partitions without a committed offset begin at their start, and at their end. */
export interface GroupStartPlan {
  fromBeginning: string[];
  fromEnd: string[];
}

/**
 * The transaction-scoped advisory lock that serialises the first-start decisions of a group's
 * members (one key per group id; released at COMMIT or ROLLBACK). hashtextextended is PostgreSQL's
 * 64-bit text hash; a collision with another lock only serialises the two.
 */
export function groupStartLockSql(groupId: string): { text: string; values: unknown[] } {
  return {
    text: 'SELECT pg_advisory_xact_lock(hashtextextended($1, 0))',
    values: [`outboxkit:group-start:${groupId}`],
  };
}

/**
 * Decides, and for a topic the group consumes for the first time commits, where the group begins
 * on each topic (see the module's comment). With `fromBeginning: true` there is nothing to decide.
 *
 * @returns the topics to subscribe with `fromBeginning: true` (all but the topics a running group
 *   met for the first time) and with `fromBeginning: false`.
 * @throws the Kafka client's error when Kafka does not answer (the caller retries the retriable
 *   ones); {@link InboxUnavailableError} (`retriable: true`) when PostgreSQL does not answer.
 */
export async function planGroupStart(client: KafkaClient, o: Options): Promise<GroupStartPlan> {
  const { topics, fromBeginning } = o;
  if (fromBeginning) return { fromBeginning: [...topics], fromEnd: [] };
  return runTransaction(o.database, async (tx) => {
    const q = joinTransaction(tx as TransactionHandle, 'the dedup consumer');
    const lock = groupStartLockSql(o.groupId);
    try {
      await q.query(lock.text, lock.values);
    } catch (err) {
      throw new InboxUnavailableError(
        `PostgreSQL did not answer the dedup consumer's start (${(err as Error)?.message ?? String(err)}); check the ` +
          'database connection and start again.',
        { cause: err, retriable: true },
      );
    }
    const admin = client.admin();
    await admin.connect();
    try {
      const plan: GroupStartPlan = { fromBeginning: [], fromEnd: [] };
      for (const topic of topics) {
        const begun = await beginTopic(admin, o, topic);
        (begun ? plan.fromBeginning : plan.fromEnd).push(topic);
      }
      return plan;
    } finally {
      await admin.disconnect();
    }
  });
}

/**
 * Commits the end offset of each partition of `topic` for the group when the group has no
 * committed offset of the topic yet (its first start on it).
 *
 * @returns false when that first start met a group with members (the commit was refused), else true.
 */
async function beginTopic(admin: KafkaAdmin, o: Options, topic: string): Promise<boolean> {
  const { groupId, logger } = o;
  const committed = await admin.groupOffsets(groupId, topic);
  if (committed.some((p) => p.offset !== null)) return true;
  const ends = await admin.partitionOffsets(topic);
  const offsets = ends.map((p) => ({ partition: p.partition, offset: p.high }));
  const outcome = await admin.commitGroupOffsets(groupId, topic, offsets);
  if (outcome === 'committed') {
    logger.info(
      { groupId, topic, offsets },
      `First start of the group on ${topic}: each of its ${offsets.length} partitions begins at its end (committed for ` +
        'the group). A partition without a committed offset from now on (one added to the topic) is read from its beginning.',
    );
    return true;
  }
  logger.warn(
    { groupId, topic },
    `The group has no committed offset of ${topic} yet, but has members already, so its starting offsets cannot be ` +
      'committed: this member consumes the topic with Kafka\'s "latest" policy (a partition without a committed offset ' +
      "begins at its end when assigned), and events published to such a partition before that are not applied. Start a topic's " +
      'first consumption while no member of the group runs (docs/runbooks.md, "Growing a topic").',
  );
  return false;
}

/** Subscribes `consumer` to the topics of `plan`, each group with its `fromBeginning`. */
export async function subscribePlan(consumer: GroupConsumer, plan: GroupStartPlan): Promise<void> {
  if (plan.fromBeginning.length > 0) await consumer.subscribe(plan.fromBeginning, { fromBeginning: true });
  if (plan.fromEnd.length > 0) await consumer.subscribe(plan.fromEnd, { fromBeginning: false });
}
