/**
 * The local 3-node KRaft cluster of `OUTBOXKIT_KAFKA_NODES=3 npm run services:up`
 * (scripts/services.ts): it starts, its defaults are replication factor 3 and
 * min.insync.replicas 2, a topic stays writable with acks=all while the leader of one of its
 * partitions is killed (SIGKILL), the node comes back and catches up, and `services:down` stops
 * every node. No mocks: three real brokers.
 *
 * Runs only with OUTBOXKIT_KAFKA_NODES=3 (it starts three JVMs and kills one); it leaves the
 * cluster stopped.
 */
import * as fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigResourceTypes, Kafka, Partitioners, logLevel, type Producer } from 'kafkajs';
import {
  activeController,
  clusterNodes,
  ensureKafkaCluster,
  killClusterNode,
  partitionLeader,
  partitionLeaders,
  restartClusterNode,
  stopKafkaCluster,
} from '../../scripts/services.js';
import { ensureTopics } from '../../src/kafka/topics.js';
import { kafkajsProducer } from '../../src/kafka/kafkajs/producer.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import type { KafkaProducer } from '../../src/kafka/types.js';
import { randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';

const enabled = process.env.OUTBOXKIT_KAFKA_NODES?.trim() === '3';
const log = (msg: string) => console.log(`[cluster] ${msg}`);

/** The process runs (an exited child not yet reaped, a zombie, does not). */
function runs(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return !/^\d+ \(.*\) Z/.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

describe.skipIf(!enabled)(
  enabled
    ? 'the local 3-node cluster'
    : 'the local 3-node cluster (skipped: set OUTBOXKIT_KAFKA_NODES=3 to start and break it; README "Local services")',
  () => {
    let kafka: Kafka;
    let brokers: string[];
    const producers: Producer[] = [];

    /** A producer that waits for every in-sync replica and rides out a leader's death. */
    async function producer(): Promise<Producer> {
      const p = kafka.producer({
        createPartitioner: Partitioners.DefaultPartitioner,
        allowAutoTopicCreation: false,
        retry: { retries: 12, initialRetryTime: 200, maxRetryTime: 3_000 },
      });
      producers.push(p);
      await p.connect();
      return p;
    }

    /**
     * Sends `count` messages spread over partitions 0-2 with acks=all, one request per partition:
     * kafkajs 2.2.4's send() can resolve without writing the messages of a partition whose leader
     * died, when its new leader already answered for another partition of the same send (its
     * per-broker response map survives the retry). A request per partition keeps this test about
     * the cluster.
     */
    async function send(p: Producer, topic: string, from: number, count: number): Promise<void> {
      for (const partition of [0, 1, 2]) {
        const messages = Array.from({ length: count }, (_, i) => from + i)
          .filter((n) => n % 3 === partition)
          .map((n) => ({ partition, key: `k${n}`, value: String(n) }));
        await p.send({ topic, acks: -1, timeout: 10_000, messages });
      }
    }

    beforeAll(async () => {
      const started = Date.now();
      ({ brokers } = await ensureKafkaCluster(log));
      log(`cluster ready in ${((Date.now() - started) / 1000).toFixed(1)} s (including any start)`);
      kafka = new Kafka({
        clientId: 'cluster-test',
        brokers,
        logLevel: logLevel.NOTHING,
        retry: { retries: 5 },
      });
    }, 300_000);

    afterAll(async () => {
      for (const p of producers) await p.disconnect().catch(() => undefined);
      // Also after a failed test: no JVM of this file outlives it.
      await stopKafkaCluster(log);
    }, 120_000);

    it('runs three registered brokers whose defaults are replication factor 3 and min.insync.replicas 2', async () => {
      const nodes = clusterNodes();
      expect(nodes.map((n) => n.id)).toEqual([1, 2, 3]);
      expect(brokers).toEqual(['127.0.0.1:9192', '127.0.0.1:9292', '127.0.0.1:9392']);
      for (const n of nodes) expect(n.pid, `node ${n.id} runs`).toBeTypeOf('number');

      const admin = kafka.admin();
      await admin.connect();
      try {
        const cluster = await admin.describeCluster();
        expect(cluster.brokers.map((b) => b.nodeId).sort()).toEqual([1, 2, 3]);

        const { resources } = await admin.describeConfigs({
          includeSynonyms: false,
          resources: nodes.map((n) => ({ type: ConfigResourceTypes.BROKER, name: String(n.id) })),
        });
        for (const r of resources) {
          const config = new Map(r.configEntries.map((e) => [e.configName, e.configValue]));
          expect(config.get('default.replication.factor'), `node ${r.resourceName}`).toBe('3');
          expect(config.get('min.insync.replicas'), `node ${r.resourceName}`).toBe('2');
          expect(config.get('offsets.topic.replication.factor'), `node ${r.resourceName}`).toBe('3');
          expect(config.get('transaction.state.log.replication.factor'), `node ${r.resourceName}`).toBe('3');
          expect(config.get('transaction.state.log.min.isr'), `node ${r.resourceName}`).toBe('2');
        }

        // A topic created without a replication factor gets the cluster's defaults.
        const topic = randomName('cluster-defaults');
        await ensureTopics(kafka, [{ topic, numPartitions: 3 }]);
        // A broker other than the one that answered the creation may not know the topic for a
        // moment (UNKNOWN_TOPIC_OR_PARTITION): asked again until one answers.
        const partitions = await waitFor(() => partitionLeaders(topic), { timeoutMs: 15_000, intervalMs: 250 });
        expect(partitions).toHaveLength(3);
        for (const p of partitions) {
          expect(p.replicas.sort()).toEqual([1, 2, 3]);
          expect(p.leader).toBeOneOf([1, 2, 3]);
        }
        // The same for the node kafkajs sends DescribeConfigs to (seen once: "This server does not
        // host this topic-partition" right after the leaders were known).
        const topicConfig = await waitFor(
          () =>
            admin.describeConfigs({
              includeSynonyms: false,
              resources: [{ type: ConfigResourceTypes.TOPIC, name: topic, configNames: ['min.insync.replicas'] }],
            }),
          { timeoutMs: 15_000, intervalMs: 250 },
        );
        expect(topicConfig.resources[0]?.configEntries[0]?.configValue).toBe('2');
        await admin.deleteTopics({ topics: [topic] });
      } finally {
        await admin.disconnect();
      }

      // The active controller, from the nodes' KRaft storage, is one of them.
      expect(await waitFor(() => activeController(), { timeoutMs: 10_000 })).toBeOneOf([1, 2, 3]);
    });

    it('keeps a topic writable with acks=all while a partition leader is killed, and the node catches up after a restart', async () => {
      const topic = randomName('cluster-failover');
      await ensureTopics(kafka, [{ topic, numPartitions: 3, replicationFactor: 3 }]);
      const p = await producer();
      let sent = 0;
      await send(p, topic, sent, 30);
      sent += 30;

      const victim = await partitionLeader(topic, 0);
      expect(victim).toBeOneOf([1, 2, 3]);
      const victimPid = clusterNodes().find((n) => n.id === victim)?.pid;
      const controllerBefore = activeController();
      log(
        `killing node ${victim} (pid ${victimPid}), leader of ${topic}-0; active controller: node ${controllerBefore}`,
      );
      const killedAt = Date.now();
      await killClusterNode(victim!);
      expect(runs(victimPid!)).toBe(false);
      expect(clusterNodes().find((n) => n.id === victim)?.pid).toBeUndefined();

      // Every partition, the killed node's included, takes writes that two replicas acknowledge.
      await send(p, topic, sent, 30);
      sent += 30;
      log(`first acks=all write after the kill accepted ${Date.now() - killedAt} ms after it`);

      // The controller fences the dead node: new leader for partition 0, the node leaves every ISR.
      const moved = await waitFor(
        async () => {
          const partitions = await partitionLeaders(topic);
          const ok = partitions.every((x) => x.leader !== undefined && x.leader !== victim && !x.isr.includes(victim!));
          return ok ? partitions : undefined;
        },
        { timeoutMs: 30_000, intervalMs: 250, message: `node ${victim} still leads or is in an ISR of ${topic}` },
      );
      log(`fenced: ${JSON.stringify(moved)}, ${Date.now() - killedAt} ms after the kill`);
      for (const x of moved) expect(x.isr.length).toBe(2);
      const controllerAfter = await waitFor(() => activeController(), { timeoutMs: 20_000 });
      expect(controllerAfter).not.toBe(victim);

      await send(p, topic, sent, 30);
      sent += 30;

      // Back on its own storage: registered, then in sync again on every partition.
      await restartClusterNode(victim!, log);
      expect(clusterNodes().find((n) => n.id === victim)?.pid).toBeTypeOf('number');
      await waitFor(async () => (await partitionLeaders(topic)).every((x) => x.isr.length === 3), {
        timeoutMs: 60_000,
        intervalMs: 500,
        message: `node ${victim} did not rejoin every ISR of ${topic}`,
      });
      await send(p, topic, sent, 30);
      sent += 30;

      // Every acknowledged message is in the topic: the partitions' end offsets add up to at least
      // what was sent (more if a send that timed out while the ISR still held the dead node was
      // written and then retried: the producer is not idempotent).
      const admin = kafka.admin();
      await admin.connect();
      try {
        const offsets = await admin.fetchTopicOffsets(topic);
        const written = offsets.reduce((sum, o) => sum + Number(o.high), 0);
        log(`${sent} messages acknowledged, ${written} in the topic`);
        expect(written).toBeGreaterThanOrEqual(sent);
        await admin.deleteTopics({ topics: [topic] });
      } finally {
        await admin.disconnect();
      }
    });

    // C09 on the cluster. Before kafkajsProducer replaced its kafkajs producer after a failed send,
    // 2 of 4 runs (and 1 of 4 again later) found 38-43 acknowledged records missing: the send that
    // failed when the leader was killed had been written, kafkajs took its sequence numbers back,
    // and a later batch of the same size was answered as its duplicate with its offset
    // (src/kafka/kafkajs/producer.ts says how). The same check for the @platformatic/kafka
    // producer (issue 18: the cluster cases on the maintained client), whatever
    // OUTBOXKIT_KAFKA_CLIENT says.
    const producerSettings = { retries: 12, retryInitialMs: 200, retryMaxMs: 3_000 };
    const adapters: [string, () => KafkaProducer][] = [
      // kafkajs 2.2.4 alone resolved such sends without writing a partition whose leader moved to a
      // broker that had already answered (see `send()` above); kafkajsProducer checks every answer,
      // and after a failed send it sends through a new producer id (C09).
      ['kafkajs', () => kafkajsProducer(kafka, producerSettings)],
      [
        '@platformatic/kafka',
        () => createPlatformaticClient({ clientId: randomName('cluster-adapter'), brokers }).producer(producerSettings),
      ],
    ];
    it.each(adapters)(
      "C09 outboxkit's %s producer: every record it reports acknowledged is in the topic across a leader kill (sends spanning partitions)",
      async (_client, makeAdapter) => {
        const topic = randomName('cluster-adapter');
        await ensureTopics(kafka, [{ topic, numPartitions: 6, replicationFactor: 3 }]);
        const adapter = makeAdapter();
        await adapter.connect();
        const acknowledged: string[] = [];
        let refused = 0;
        let next = 0;
        let stop = false;
        const sending = (async () => {
          while (!stop) {
            const ids = Array.from({ length: 60 }, () => `m${next++}`);
            const { outcomes } = await adapter.send(
              ids.map((id) => ({ topic, key: id, value: Buffer.from(id), headers: {} })),
            );
            outcomes.forEach((o, i) => (o.ok ? acknowledged.push(ids[i]!) : refused++));
          }
        })();
        try {
          await waitFor(() => acknowledged.length >= 600, { timeoutMs: 60_000 });
          // The node that leads most partitions of the topic.
          const leaders = (await partitionLeaders(topic)).map((x) => x.leader);
          const victim = [1, 2, 3].sort(
            (a, b) => leaders.filter((l) => l === b).length - leaders.filter((l) => l === a).length,
          )[0]!;
          log(
            `adapter: killing node ${victim}, leader of ${leaders.filter((l) => l === victim).length} of 6 partitions`,
          );
          await killClusterNode(victim);
          const atKill = acknowledged.length;
          await waitFor(() => acknowledged.length >= atKill + 600, {
            timeoutMs: 90_000,
            message: 'sends resumed after the kill',
          });
          await restartClusterNode(victim, log);
          await waitFor(async () => (await partitionLeaders(topic)).every((x) => x.isr.length === 3), {
            timeoutMs: 60_000,
            intervalMs: 500,
          });
        } finally {
          stop = true;
          await sending.catch(() => undefined);
          await adapter.disconnect();
        }
        // Read the whole topic back.
        const consumer = kafka.consumer({ groupId: randomName('cluster-adapter-read') });
        const seen = new Set<string>();
        await consumer.connect();
        try {
          await consumer.subscribe({ topic, fromBeginning: true });
          await consumer.run({ eachMessage: async ({ message }) => void seen.add(message.value!.toString()) });
          await waitFor(() => acknowledged.every((id) => seen.has(id)), {
            timeoutMs: 60_000,
            message: () => {
              const missing = acknowledged.filter((id) => !seen.has(id));
              return `${missing.length} of ${acknowledged.length} acknowledged records are not in the topic (read ${seen.size}; first: ${missing.slice(0, 8).join(', ')})`;
            },
          }).catch(async (err: Error) => {
            const admin = kafka.admin();
            await admin.connect();
            const offsets = await admin.fetchTopicOffsets(topic).finally(() => admin.disconnect());
            const held = offsets.reduce((sum, o) => sum + Number(o.high) - Number(o.low), 0);
            throw new Error(`${err.message}; the topic holds ${held} records, ${refused} were refused`);
          });
        } finally {
          await consumer.disconnect();
        }
        log(
          `adapter: ${acknowledged.length} acknowledged (all in the topic), ${refused} refused and left to the caller`,
        );
        const admin = kafka.admin();
        await admin.connect();
        await admin.deleteTopics({ topics: [topic] }).finally(() => admin.disconnect());
      },
    );

    it('stops every node (services:down): SIGTERM, SIGKILL after a bound', async () => {
      for (const p of producers.splice(0)) await p.disconnect();
      const pids = clusterNodes().map((n) => n.pid);
      expect(pids.every((pid) => typeof pid === 'number')).toBe(true);
      const resident = pids.map(
        (pid) => /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1],
      );
      log(`resident memory (MiB) per node: ${resident.map((kb) => Math.round(Number(kb) / 1024)).join(', ')}`);
      const started = Date.now();
      expect(await stopKafkaCluster(log)).toBe(true);
      log(`stopped in ${((Date.now() - started) / 1000).toFixed(1)} s`);
      for (const pid of pids) expect(runs(pid!), `pid ${pid} runs`).toBe(false);
      expect(clusterNodes().every((n) => n.pid === undefined)).toBe(true);
      expect(await stopKafkaCluster(log)).toBe(false);
    });
  },
);
