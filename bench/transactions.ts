/**
 * Issue #5 spike: the cost of a Kafka transaction per relay lane with kafkajs, against the relay's
 * current producer (idempotent, acks=all, one request in flight), on the same broker in one run.
 *
 * One operation = one relay pass: 500 records of 256 bytes over 1,000 keys (the relay's default
 * batch size), to a 6-partition topic.
 * - idempotent: `createKafkajsProducer()` sends the pass (the baseline);
 * - txn, one id: the whole pass in one transaction of one producer (a lower bound of the cost;
 *   it does not fence per lane);
 * - txn per lane, serial: the pass split by `laneOf(key)` into one transaction per lane, each on
 *   its lane's producer (transactional id per lane), one after another;
 * - txn per lane, parallel: the same, all lanes' transactions at once;
 * - txn per lane, full passes: 8 lanes' transactions of 500 records each at once, against 8
 *   idempotent passes (the kindest case: a deep backlog read lane by lane).
 * Also: back-to-back one-record transactions on one producer (kafkajs issue #304), the time to
 * initialise 64 lane producers (what a relay pays when it takes all lanes), and the TCP
 * connections to the broker they hold.
 *
 * Run: `npx tsx bench/transactions.ts` (KAFKA_BROKERS, default 127.0.0.1:9092; BENCH_ROUNDS, 5;
 * BENCH_ROUND_MS, 3000). Figures are ratios of interleaved rounds (bench/lib.ts).
 */
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { Kafka, logLevel, Partitioners, type Producer } from 'kafkajs';
import { laneOf } from '../src/outbox/event.js';
import { OUTBOX_LANES } from '../src/schema.js';
import { createKafkajsProducer } from '../src/kafka/kafkajs/producer.js';
import type { OutboundRecord } from '../src/kafka/types.js';
import { compare, formatComparisons, throughput, type Comparison } from './lib.js';

const BROKERS = (process.env.KAFKA_BROKERS ?? '127.0.0.1:9092').split(',');
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const ROUND_MS = Number(process.env.BENCH_ROUND_MS ?? 3_000);
const BATCH = 500;
const KEYS = 1_000;

/** TCP connections this process holds to `port` (from /proc: Linux only). */
function connectionsTo(port: number): number {
  const inodes = new Set<string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/self/fd/${fd}`));
      if (m) inodes.add(m[1]!);
    } catch {
      // fd closed meanwhile
    }
  }
  let n = 0;
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    for (const line of readFileSync(table, 'utf8').split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f.length < 10) continue;
      const remotePort = parseInt(f[2]!.split(':')[1]!, 16);
      if (remotePort === port && f[3] === '01' && inodes.has(f[9]!)) n++;
    }
  }
  return n;
}

function txnProducer(kafka: Kafka, transactionalId: string): Producer {
  return kafka.producer({
    transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
    allowAutoTopicCreation: false,
    transactionTimeout: 10_000,
    createPartitioner: Partitioners.DefaultPartitioner,
    retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 2_000 },
  });
}

async function inTransaction(p: Producer, topic: string, records: readonly OutboundRecord[]): Promise<void> {
  const t = await p.transaction();
  try {
    await t.send({
      topic,
      acks: -1,
      messages: records.map((r) => ({ key: r.key, value: r.value, headers: r.headers })),
    });
    await t.commit();
  } catch (err) {
    await t.abort().catch(() => undefined);
    throw err;
  }
}

async function main(): Promise<void> {
  const kafka = new Kafka({ clientId: 'bench-txn', brokers: BROKERS, logLevel: logLevel.NOTHING });
  const port = Number(BROKERS[0]!.split(':')[1]);
  const admin = kafka.admin();
  await admin.connect();
  const topic = `bench-txn-${randomUUID().slice(0, 8)}`;
  await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: 6 }] });
  const payload = Buffer.alloc(256, 'x');
  let n = 0;
  const pass = (): OutboundRecord[] =>
    Array.from({ length: BATCH }, () => ({
      topic,
      key: `key-${n++ % KEYS}`,
      value: payload,
      headers: { 'event-id': randomUUID(), 'event-type': 'bench' },
    }));
  const byLane = (records: OutboundRecord[]): Map<number, OutboundRecord[]> => {
    const m = new Map<number, OutboundRecord[]>();
    for (const r of records) {
      const lane = laneOf(r.key!);
      let list = m.get(lane);
      if (!list) m.set(lane, (list = []));
      list.push(r);
    }
    return m;
  };

  const before = connectionsTo(port);
  const idempotent = createKafkajsProducer(kafka);
  await idempotent.connect();
  const afterIdempotent = connectionsTo(port);

  const prefix = `bench-${randomUUID().slice(0, 8)}`;
  const one = txnProducer(kafka, `${prefix}-one`);
  await one.connect();
  await inTransaction(one, topic, pass().slice(0, 1)); // InitProducerId outside the measurement

  // A relay that takes all 64 lanes: connect and InitProducerId for each lane's producer.
  const lanes: Producer[] = [];
  const initBegan = performance.now();
  for (let lane = 0; lane < OUTBOX_LANES; lane++) lanes.push(txnProducer(kafka, `${prefix}-lane-${lane}`));
  await Promise.all(lanes.map((p) => p.connect()));
  await Promise.all(lanes.map((p) => p.transaction().then((t) => t.commit()))); // init, empty commit
  const initMs = performance.now() - initBegan;
  const afterLanes = connectionsTo(port);
  const rssMb = process.memoryUsage().rss / 1024 / 1024;

  const rows: Comparison[] = [];
  const baseline = () => idempotent.send(pass());
  rows.push(
    await compare(
      'txn, one id (pass in one transaction)',
      () => inTransaction(one, topic, pass()),
      'idempotent',
      baseline,
      {
        rounds: ROUNDS,
        roundMs: ROUND_MS,
      },
    ),
  );
  rows.push(
    await compare(
      'txn per lane, serial',
      async () => {
        for (const [lane, records] of byLane(pass())) await inTransaction(lanes[lane]!, topic, records);
      },
      'idempotent',
      baseline,
      { rounds: ROUNDS, roundMs: ROUND_MS },
    ),
  );
  rows.push(
    await compare(
      'txn per lane, parallel',
      () => Promise.all([...byLane(pass())].map(([lane, records]) => inTransaction(lanes[lane]!, topic, records))),
      'idempotent',
      baseline,
      { rounds: ROUNDS, roundMs: ROUND_MS },
    ),
  );
  // The kindest case for transactions: a deep backlog read lane by lane, so that each lane's
  // transaction carries a full pass, 8 lanes at once (a pass design the relay does not have).
  rows.push(
    await compare(
      'txn per lane, full passes, 8 lanes at once',
      () => Promise.all(lanes.slice(0, 8).map((p) => inTransaction(p, topic, pass()))),
      'idempotent, 8 passes',
      async () => {
        for (let i = 0; i < 8; i++) await idempotent.send(pass());
      },
      { rounds: ROUNDS, roundMs: ROUND_MS },
    ),
  );
  // kafkajs issue #304: the next transaction's AddPartitionsToTxn meets CONCURRENT_TRANSACTIONS
  // until the previous commit's markers are written, and kafkajs retries after its backoff.
  const oneRecord = pass().slice(0, 1);
  const backToBack = await throughput(() => inTransaction(one, topic, oneRecord), ROUND_MS);
  const singleSends = await throughput(() => idempotent.send(oneRecord), ROUND_MS);

  console.log(`## Kafka transactions per lane (issue #5), kafkajs 2.2.4, broker ${BROKERS.join(',')}\n`);
  console.log(
    `One op = one pass of ${BATCH} records × 256 B, ${KEYS} keys, 6 partitions; ${ROUNDS} rounds of ${ROUND_MS} ms.\n`,
  );
  console.log(formatComparisons(rows));
  console.log('');
  console.log(
    `- records/s: idempotent ≈ ${(rows[0]!.baselineOpsPerSec * BATCH).toFixed(0)}; ` +
      rows
        .map((r) => `${r.name} ≈ ${(r.candidateOpsPerSec * BATCH * (r.name.includes('8 lanes') ? 8 : 1)).toFixed(0)}`)
        .join('; '),
  );
  console.log(
    `- back-to-back one-record transactions on one producer: ${backToBack.toFixed(1)}/s ` +
      `(${(1000 / backToBack).toFixed(0)} ms each) vs one-record idempotent sends ${singleSends.toFixed(1)}/s`,
  );
  console.log(`- ${OUTBOX_LANES} lane producers: connect + InitProducerId in ${initMs.toFixed(0)} ms`);
  console.log(
    `- TCP connections to the broker: ${before} before, ${afterIdempotent} with the idempotent producer, ` +
      `${afterLanes} with ${OUTBOX_LANES} lane producers + 1 more (one broker); process RSS ${rssMb.toFixed(0)} MB`,
  );

  await Promise.all([...lanes, one].map((p) => p.disconnect()));
  await idempotent.disconnect();
  await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
  await admin.disconnect();
}

await main();
