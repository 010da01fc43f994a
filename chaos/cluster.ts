/**
 * `--cluster`: the chaos run on the local 3-node KRaft cluster (scripts/services.ts,
 * `OUTBOXKIT_KAFKA_NODES=3`). Its topics, the audit stream to a replication-factor-1 topic, the
 * {@link KillableCluster} the cluster faults use, and what each of those faults did to the flow
 * of events (the report's "cluster faults" lines).
 */
import type { Kafka } from 'kafkajs';
import type pg from 'pg';
import {
  activeController,
  clusterNodes,
  killClusterNode,
  partitionLeaders,
  restartClusterNodes,
  type Log,
} from '../scripts/services.js';
import { enqueue, withPgTransaction } from '../src/index.js';
import { ensureTopics } from '../src/kafka/topics.js';
import type { FaultKind, KillableCluster } from './faults.js';
import type { Random } from './random.js';

/** Partitions of the audit topic, all on one node (replication factor 1). */
export const AUDIT_PARTITIONS = 2;
/** Audit events the harness writes per second during the load (`--cluster`). */
export const AUDIT_RATE = 2;
/** How long a restarted node may take to be back in every ISR of the run's topics. */
const IN_SYNC_TIMEOUT_MS = 90_000;

/** The run's topics on the cluster. */
export interface ClusterTopics {
  /** Replication factor 3 (the orders topic and its dead-letter topic). */
  replicated: string[];
  /** The replication-factor-1 topic and the node that holds all its partitions. */
  audit: string;
  auditNode: number;
}

/**
 * Creates the orders topic (6 partitions) and its dead-letter topic at replication factor 3, and
 * the audit topic ({@link AUDIT_PARTITIONS} partitions) at replication factor 1 with every
 * partition on one node drawn from the seed.
 */
export async function createClusterTopics(
  kafka: Kafka,
  names: { topic: string; dlq: string; audit: string },
  random: Random,
): Promise<ClusterTopics> {
  await ensureTopics(kafka, [
    { topic: names.topic, numPartitions: 6, replicationFactor: 3 },
    { topic: names.dlq, numPartitions: 1, replicationFactor: 3 },
  ]);
  const auditNode = random.pick(clusterNodes().map((n) => n.id));
  const admin = kafka.admin();
  await admin.connect();
  try {
    await admin.createTopics({
      topics: [
        {
          topic: names.audit,
          replicaAssignment: Array.from({ length: AUDIT_PARTITIONS }, (_, partition) => ({
            partition,
            replicas: [auditNode],
          })),
        },
      ],
      waitForLeaders: false,
      timeout: 15_000,
    });
  } finally {
    await admin.disconnect();
  }
  // Asked again until every partition has its leader: a node may not know the topic for a moment
  // (UNKNOWN_TOPIC_OR_PARTITION), which kafkajs's own wait (waitForLeaders) does not retry.
  const deadline = Date.now() + 30_000;
  for (;;) {
    const partitions = await partitionLeaders(names.audit).catch(() => []);
    if (partitions.length === AUDIT_PARTITIONS && partitions.every((p) => p.leader === auditNode)) break;
    if (Date.now() > deadline) throw new Error(`the audit topic ${names.audit} has no leaders after 30 s`);
    await new Promise((r) => setTimeout(r, 250));
  }
  return { replicated: [names.topic, names.dlq], audit: names.audit, auditNode };
}

/**
 * Writes {@link AUDIT_RATE} audit events per second to the outbox (topic `audit`, 8 keys, one
 * transaction each) until `signal` aborts; the relays publish them with the orders. A failed write
 * is skipped: the check compares the committed outbox rows with the topic, not this writer's count.
 */
export async function writeAuditEvents(pool: pg.Pool, audit: string, signal: AbortSignal): Promise<number> {
  let n = 0;
  while (!signal.aborted) {
    const i = n++;
    await withPgTransaction(pool, (c) =>
      enqueue(c, { topic: audit, key: `audit-${i % 8}`, type: 'audit.recorded', payload: { n: i } }),
    ).catch(() => undefined);
    await new Promise((r) => setTimeout(r, 1_000 / AUDIT_RATE));
  }
  return n;
}

/** Event ids of the committed outbox rows of `topic`. */
export async function outboxIds(pool: pg.Pool, topic: string): Promise<string[]> {
  const r = await pool.query<{ event_id: string }>('SELECT event_id FROM outboxkit.outbox_events WHERE topic = $1', [
    topic,
  ]);
  return r.rows.map((row) => row.event_id);
}

/**
 * The {@link KillableCluster} of the local cluster. Each fault's measurements go to `lines`: how
 * long its nodes were down and until back in sync, the orders events marked published per second
 * in the 10 s before the kill, between the kill and the restart, and between the kill and the
 * nodes being back in sync, and (for `kill-rf1-broker`) the audit events waiting when the node
 * came back.
 */
export function localCluster(opts: {
  topics: ClusterTopics;
  ordersTopic: string;
  pool: pg.Pool;
  log: Log;
  lines: string[];
}): KillableCluster {
  const { topics, ordersTopic, pool, log, lines } = opts;
  let killedAt = 0;
  let restartAt = 0;
  const published = async (from: number, to: number) => {
    const r = await pool.query<{ n: string }>(
      `SELECT count(*) AS n FROM outboxkit.outbox_events
        WHERE topic = $1 AND published_at >= to_timestamp($2 / 1000.0) AND published_at < to_timestamp($3 / 1000.0)`,
      [ordersTopic, from, to],
    );
    return Number(r.rows[0]!.n);
  };
  const pendingAudit = async () => {
    const r = await pool.query<{ n: string }>(
      'SELECT count(*) AS n FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NULL',
      [topics.audit],
    );
    return Number(r.rows[0]!.n);
  };
  let auditWaiting: number | undefined;
  const inSync = async () => {
    for (const topic of topics.replicated) {
      const partitions = await partitionLeaders(topic);
      if (partitions.some((p) => p.leader === undefined || p.isr.length < 3)) return false;
    }
    return true;
  };
  return {
    nodeIds: clusterNodes().map((n) => n.id),
    rf1Node: topics.auditNode,
    async busiestLeader() {
      const leaders = (await partitionLeaders(ordersTopic)).flatMap((p) => (p.leader === undefined ? [] : [p.leader]));
      if (leaders.length === 0) return undefined;
      const count = (id: number) => leaders.filter((l) => l === id).length;
      return [...new Set(leaders)].sort((a, b) => count(b) - count(a) || a - b)[0];
    },
    controller: () => activeController(),
    kill: (id) => killClusterNode(id),
    async restart(ids) {
      restartAt = Date.now();
      auditWaiting = await pendingAudit().catch(() => undefined);
      await restartClusterNodes(ids, log);
      const deadline = Date.now() + IN_SYNC_TIMEOUT_MS;
      while (!(await inSync().catch(() => false))) {
        if (Date.now() > deadline) throw new Error(`nodes ${ids.join(', ')} not back in every ISR within 90 s`);
        await new Promise((r) => setTimeout(r, 500));
      }
    },
    down() {
      killedAt = Date.now();
    },
    async back(kind: FaultKind, ids: readonly number[]) {
      const backAt = Date.now();
      const [before, during, until] = await Promise.all([
        published(killedAt - 10_000, killedAt),
        published(killedAt, restartAt),
        published(killedAt, backAt),
      ]).catch(() => [NaN, NaN, NaN]);
      const downS = (restartAt - killedAt) / 1000;
      const backS = (backAt - killedAt) / 1000;
      const line =
        `${kind} (node${ids.length > 1 ? 's' : ''} ${ids.join(', ')}): down ${downS.toFixed(1)} s, ` +
        `back in sync ${backS.toFixed(1)} s after the kill; orders events published ` +
        `${(before! / 10).toFixed(1)}/s in the 10 s before, ${(during! / downS).toFixed(1)}/s while down, ` +
        `${(until! / backS).toFixed(1)}/s from the kill until back in sync` +
        (kind === 'kill-rf1-broker' && auditWaiting !== undefined ? `; ${auditWaiting} audit events waiting` : '');
      lines.push(line);
      log(line);
    },
  };
}
