/**
 * G7 for the WAL relay on the local 3-node KRaft cluster (docs/wal-source.md, "Held keys"): the
 * broker holding the only replica of one partition is killed (SIGKILL) while a WAL writer enqueues
 * at a steady rate. The events bound for that partition, and later events of their keys, are held
 * in the outbox table (the stream goes on, the slot is confirmed past them); the other partitions'
 * events keep flowing at the writers' rate; once the broker is back, the held events go out and
 * the topic holds every event, nothing invented, each key's first occurrences in commit order,
 * nothing parked, every row deleted.
 *
 * Runs only with OUTBOXKIT_KAFKA_NODES=3 (the `cluster` project) and the WAL test server.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Kafka } from 'kafkajs';
import { createWalRelay, type WalRelay } from '../../relay/wal/wal-relay.js';
import { createOutbox } from '../../src/outbox/enqueue.js';
import {
  activeController,
  clusterNodes,
  ensureKafkaCluster,
  killClusterNode,
  partitionLeaders,
  restartClusterNode,
} from '../../scripts/services.js';
import type { KafkaClient } from '../../src/kafka/types.js';
import type { TestDatabase } from '../helpers/db.js';
import { randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { walRelayTestFile } from '../helpers/wal.js';
import { checkTopic, clusterKafka, keptUp, log, readBack, startWriters } from './outage-harness.js';

const enabled = process.env.OUTBOXKIT_KAFKA_NODES?.trim() === '3';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const PUBLICATION = 'outboxkit_wal_cluster';
/** The share of the writers' rate the partitions that take writes keep during the outage (as C25). */
const MIN_RATIO = 0.8;

describe.skipIf(!enabled)(
  enabled
    ? 'G7 for the WAL relay on the 3-node cluster: a dead partition holds back only its keys'
    : 'G7 for the WAL relay on the 3-node cluster (skipped: set OUTBOXKIT_KAFKA_NODES=3)',
  () => {
    const file = walRelayTestFile(PUBLICATION);
    let db: TestDatabase;
    let brokers: string[];
    let kafka: Kafka;
    let client: KafkaClient;
    let victim: number | undefined;
    const writing: { stop(): Promise<void> }[] = [];

    beforeAll(async () => {
      db = file.db;
      ({ brokers } = await ensureKafkaCluster(log));
      ({ kafka, client } = clusterKafka(brokers));
    }, 300_000);

    afterAll(async () => {
      for (const w of writing) await w.stop().catch(() => undefined);
      // Every node runs again for the next file (a failed test may have left one down).
      if (victim !== undefined && clusterNodes().find((n) => n.id === victim)?.pid === undefined) {
        await restartClusterNode(victim, log).catch(() => undefined);
      }
    }, 180_000);

    async function createTopic(topic: string, assignment: number[][]): Promise<void> {
      const admin = kafka.admin();
      await admin.connect();
      try {
        await admin.createTopics({
          waitForLeaders: false,
          topics: [{ topic, replicaAssignment: assignment.map((replicas, partition) => ({ partition, replicas })) }],
        });
      } finally {
        await admin.disconnect();
      }
      await waitFor(
        async () => {
          const p = await partitionLeaders(topic);
          return p.length === assignment.length && p.every((x) => x.leader !== undefined);
        },
        { timeoutMs: 30_000, intervalMs: 250, message: `leaders of ${topic}` },
      );
    }

    function startRelay(slot: string): WalRelay {
      const began = Date.now();
      const print = (level: string) => (obj: Record<string, unknown>, msg: string) => {
        const err = obj.err instanceof Error ? `: ${obj.err.message}` : '';
        const { err: _err, ...rest } = obj;
        log(`wal relay ${((Date.now() - began) / 1000).toFixed(1)} s ${level} ${msg}${err} ${JSON.stringify(rest)}`);
      };
      const relay = createWalRelay({
        connection: db.url,
        slot,
        publication: PUBLICATION,
        kafka: client,
        brokerTimeoutMs: 3_000,
        logger: { debug() {}, info: print('info'), warn: print('warn'), error: print('error') },
      });
      file.relays.push(relay);
      file.slots.push(slot);
      return relay;
    }

    // Breaches caught: a dead partition holding the whole stream (the other partitions' rate falls
    // to nothing: the first slice's behaviour); held events lost, published out of their key's
    // order or never published once the broker is back; events parked or rows left behind.
    it('C25 (WAL): the events of a dead replication-factor-1 partition and their keys wait in the table; the rest flows', async () => {
      const topic = randomName('wal-audit');
      await createTopic(topic, [[1], [2], [3]]);
      const controller = activeController();
      victim = [3, 2, 1].find((id) => id !== controller) ?? 3;
      const deadPartition = victim - 1;
      const keys = Array.from({ length: 30 }, (_, i) => `key-${i}`);
      const waits = (key: string) => client.partitionForKey(key, 3) === deadPartition;
      const relay = startRelay(`wal_cluster_${Date.now() % 1_000_000}`);
      await relay.start();
      const outbox = createOutbox({ source: 'wal' });
      const writers = startWriters(db.pool, {
        ratePerSecond: 40,
        topicOf: () => topic,
        keyOf: (n) => keys[(n * 7) % keys.length]!,
        write: (c, e) => outbox.enqueue(c, [e]),
      });
      writing.push(writers);
      await sleep(6_000);

      const killedAt = Date.now();
      log(`WAL C25: killing node ${victim} (the only replica of ${topic}-${deadPartition})`);
      await killClusterNode(victim);
      await waitFor(async () => (await partitionLeaders(topic))[deadPartition]?.leader === undefined, {
        timeoutMs: 30_000,
        intervalMs: 200,
        message: `${topic}-${deadPartition} without a leader`,
      });
      await waitFor(() => relay.stats().blockedPartitions.find((b) => b.topic === topic), {
        timeoutMs: 30_000,
        message: () => `the relay reports the dead partition; stats ${JSON.stringify(relay.stats())}`,
      });
      const blockedAt = Date.now();
      log(`WAL C25: partition blocked ${blockedAt - killedAt} ms after the kill`);
      await sleep(12_000);
      const windowEnd = Date.now();
      const during = relay.stats();
      log(`WAL C25: at the restart: ${JSON.stringify(during)}`);
      expect(during.held, 'events held in the table').toBeGreaterThan(0);
      expect(during.blockedPartitions, 'the dead partition, with the keys it holds').toEqual([
        expect.objectContaining({ topic, partition: deadPartition, keys: during.heldKeys }),
      ]);
      await restartClusterNode(victim, log);
      await sleep(2_000);
      await writers.stop();

      await waitFor(async () => (await db.pool.query('SELECT 1 FROM outboxkit.outbox_events')).rowCount === 0, {
        timeoutMs: 90_000,
        intervalMs: 250,
        message: () => `every row published and deleted; stats ${JSON.stringify(relay.stats())}`,
      });
      const records = await readBack(kafka, topic, new Set(writers.written.map((w) => w.n)));
      const { problems, duplicates } = checkTopic(writers.written, records);
      log(`WAL C25: ${writers.written.length} written, ${records.length} read, ${duplicates} duplicates`);
      expect(problems).toEqual([]);
      expect(relay.stats().parked, 'events parked').toBe(0);

      // The keys of the live partitions kept up with the writers while the partition was dead.
      const live = writers.written.filter((w) => !waits(w.key));
      const liveRecords = records.filter((r) => r.partition !== deadPartition);
      const ratio = keptUp(liveRecords, live, blockedAt + 2_000, windowEnd);
      log(`WAL C25: live partitions kept up at ${ratio.toFixed(2)} of the writers' rate during the outage`);
      expect(ratio).toBeGreaterThanOrEqual(MIN_RATIO);
    });
  },
);
