/**
 * Issue #5 spike: is a Kafka transaction per relay lane (one transactional id per lane) sound with
 * kafkajs 2.2.4? These tests are the evidence behind docs/relay-fencing.md. They run against the
 * real broker (and a private scratch broker for the restart case) and check what the broker and
 * kafkajs actually do:
 *
 * (a) a second producer with the same transactional id fences the first one (INVALID_PRODUCER_EPOCH
 *     for kafkajs' protocol versions) and its uncommitted records stay invisible to read_committed;
 * (b) a producer paused mid-transaction loses to the one that took over;
 * (c) recovery: the fenced kafkajs producer is unusable, a new one carries on; an abandoned
 *     transaction holds read_committed consumers of its partitions until transaction.timeout.ms;
 *     a broker restart mid-transaction.
 * And, for contrast, what the default relay (leases and fencing tokens, no transactions) does when
 * its owner pauses mid-pass: the late duplicate that transactions would remove.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Kafka, logLevel, type Producer, type Transaction } from 'kafkajs';
import pg from 'pg';
import { freePortBlock, startScratchBroker, type ScratchBroker } from '../../scripts/services.js';
import { kafkaErrorType } from '../../src/kafka/kafkajs/errors.js';
import { createKafkajsProducer, type RelayProducer } from '../../relay/index.js';
import { enqueue, HEADER_EVENT_ID, withPgTransaction } from '../../src/index.js';
import { laneOf } from '../../src/outbox/event.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, randomName, readTopic, testKafka } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

const producers = new Set<Producer>();
afterEach(async () => {
  const left = [...producers];
  producers.clear();
  await Promise.all(left.map((p) => p.disconnect().catch(() => undefined)));
});

/** A transactional producer as a relay lane would use it (idempotent, one request in flight). */
async function txnProducer(kafka: Kafka, transactionalId: string, transactionTimeout = 10_000): Promise<Producer> {
  const p = kafka.producer({
    transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
    transactionTimeout,
    retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 1_000 },
  });
  producers.add(p);
  await p.connect();
  return p;
}

async function sendIn(txn: Transaction, topic: string, values: string[]): Promise<void> {
  await txn.send({ topic, acks: -1, messages: values.map((value) => ({ key: 'k', value })) });
}

/** The kafkajs protocol error type of a rejection (walking wrapped causes), or 'no error'. */
async function failureType(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'no error';
  } catch (err) {
    return kafkaErrorType(err) ?? (err as Error).name;
  }
}

/**
 * Every value of `topic` (one partition), read from the beginning until `sentinel` is seen. With
 * `readUncommitted: false` (kafkajs' default, read_committed) aborted records are filtered out and
 * nothing past an open transaction is returned.
 */
async function readValues(
  kafka: Kafka,
  topic: string,
  sentinel: string,
  options: { readUncommitted?: boolean; timeoutMs?: number } = {},
): Promise<{ values: string[]; elapsedMs: number }> {
  const consumer = kafka.consumer({
    groupId: randomName('txn-reader'),
    readUncommitted: options.readUncommitted ?? false,
    maxWaitTimeInMs: 100,
  });
  const values: string[] = [];
  const began = performance.now();
  await consumer.connect();
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`readValues(${topic}): no ${sentinel} after ${values.join(',')}`)),
        options.timeoutMs ?? 30_000,
      );
      consumer
        .run({
          eachMessage: async ({ message }) => {
            const v = message.value?.toString() ?? '';
            values.push(v);
            if (v === sentinel) {
              clearTimeout(timer);
              resolve();
            }
          },
        })
        .catch(reject);
    });
  } finally {
    await consumer.disconnect();
  }
  return { values, elapsedMs: performance.now() - began };
}

/** Writes `sentinel` in a committed transaction of its own transactional id. */
async function commitSentinel(kafka: Kafka, topic: string, sentinel: string): Promise<void> {
  const p = await txnProducer(kafka, randomName('sentinel'));
  const t = await p.transaction();
  await sendIn(t, topic, [sentinel]);
  await t.commit();
}

/**
 * Case (a): A sends in a transaction, B initialises the same transactional id and commits; A's next
 * send and its commit are refused, and a read_committed consumer sees B's record only.
 */
async function fencingCase(kafka: Kafka, topic: string): Promise<void> {
  const tid = randomName('lane');
  const a = await txnProducer(kafka, tid);
  const ta = await a.transaction(); // InitProducerId happens here (epoch e)
  await sendIn(ta, topic, ['a1']); // acknowledged, uncommitted
  const b = await txnProducer(kafka, tid);
  const tb = await b.transaction(); // InitProducerId again: epoch e+1, A's transaction is aborted
  await sendIn(tb, topic, ['b1']);
  await tb.commit();
  // A's next send and its commit are refused by the broker.
  expect(await failureType(sendIn(ta, topic, ['a2']))).toBe('INVALID_PRODUCER_EPOCH');
  expect(await failureType(ta.commit())).toBe('INVALID_PRODUCER_EPOCH');
  await commitSentinel(kafka, topic, 'end');
  const committed = await readValues(kafka, topic, 'end');
  expect(committed.values).toEqual(['b1', 'end']);
  // The test can fail: A's record was written to the log, only the abort marker hides it.
  const raw = await readValues(kafka, topic, 'end', { readUncommitted: true });
  expect(raw.values).toEqual(['a1', 'b1', 'end']);
}

describe('Kafka transactions with kafkajs (issue #5)', () => {
  const kafka = testKafka('outboxkit-txn-spike');

  it('(a) a second producer with the same transactional id fences the first; its uncommitted records stay invisible', async () => {
    const [topic] = await createTopics(['txn-fence'], { partitions: 1 });
    await fencingCase(kafka, topic!);
  });

  it('(b) a producer paused mid-transaction loses to the one that took over: its commit fails, only the new owner is read', async () => {
    const [topic] = await createTopics(['txn-pause'], { partitions: 1 });
    const tid = randomName('lane');
    const a = await txnProducer(kafka, tid);
    const ta = await a.transaction();
    await sendIn(ta, topic!, ['a1', 'a2']);
    // A "pauses" here; B takes over the lane.
    const b = await txnProducer(kafka, tid);
    const tb = await b.transaction();
    await sendIn(tb, topic!, ['a1', 'a2']); // the new owner publishes the same rows again
    await tb.commit();
    // A wakes up and commits what it had sent before the pause.
    expect(await failureType(ta.commit())).toBe('INVALID_PRODUCER_EPOCH');
    await commitSentinel(kafka, topic!, 'end');
    expect((await readValues(kafka, topic!, 'end')).values).toEqual(['a1', 'a2', 'end']);
    expect((await readValues(kafka, topic!, 'end', { readUncommitted: true })).values).toEqual([
      'a1',
      'a2',
      'a1',
      'a2',
      'end',
    ]);
  });

  it('(b) a zombie that began its transaction before the takeover and sends after it writes nothing', async () => {
    const [topic] = await createTopics(['txn-zombie'], { partitions: 1 });
    const tid = randomName('lane');
    const a = await txnProducer(kafka, tid);
    const ta = await a.transaction(); // initialised before the takeover, nothing sent yet
    const b = await txnProducer(kafka, tid);
    const tb = await b.transaction();
    await sendIn(tb, topic!, ['b1']);
    await tb.commit();
    // The relay's late duplicate: rows read before the pause, sent after it.
    expect(await failureType(sendIn(ta, topic!, ['late']))).toBe('INVALID_PRODUCER_EPOCH');
    await commitSentinel(kafka, topic!, 'end');
    expect((await readValues(kafka, topic!, 'end', { readUncommitted: true })).values).toEqual(['b1', 'end']);
  });

  it('(c) the fenced kafkajs producer is unusable afterwards; a new producer with the same id carries on', async () => {
    const [topic] = await createTopics(['txn-recover'], { partitions: 1 });
    const tid = randomName('lane');
    const a = await txnProducer(kafka, tid);
    const ta = await a.transaction();
    await sendIn(ta, topic!, ['a1']);
    const b = await txnProducer(kafka, tid);
    const tb = await b.transaction();
    await tb.commit(); // empty: kafkajs sends no EndTxn, the fencing came from InitProducerId
    expect(await failureType(ta.commit())).toBe('INVALID_PRODUCER_EPOCH');
    // kafkajs leaves its transaction state machine in COMMITTING and never re-initialises: every
    // later transaction() of this producer fails locally, and abort() is refused too.
    expect(await failureType(ta.abort())).toBe('KafkaJSNonRetriableError');
    await expect(a.transaction()).rejects.toThrow(/Cannot call "beginTransaction" in state "COMMITTING"/);
    // A new producer object with the same id initialises a new epoch and works (it fences B).
    const c = await txnProducer(kafka, tid);
    const tc = await c.transaction();
    await sendIn(tc, topic!, ['c1']);
    await tc.commit();
    const tb2 = await b.transaction();
    expect(await failureType(sendIn(tb2, topic!, ['b2']))).toBe('INVALID_PRODUCER_EPOCH');
    await commitSentinel(kafka, topic!, 'end');
    expect((await readValues(kafka, topic!, 'end')).values).toEqual(['c1', 'end']);
  });

  it('(c) an abandoned transaction holds read_committed consumers of its partition until transaction.timeout.ms', async () => {
    const [topic] = await createTopics(['txn-timeout'], { partitions: 1 });
    const timeoutMs = 2_000;
    const a = await txnProducer(kafka, randomName('lane'), timeoutMs);
    const ta = await a.transaction();
    await sendIn(ta, topic!, ['a1']); // A dies here (no takeover of its transactional id)
    const began = performance.now();
    // Another lane's committed record behind it, on the same partition.
    await commitSentinel(kafka, topic!, 'other-lane');
    const read = await readValues(kafka, topic!, 'other-lane', { timeoutMs: 40_000 });
    const heldMs = performance.now() - began;
    expect(read.values).toEqual(['other-lane']);
    // Held at least the transaction timeout (the coordinator's abort runs every
    // transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by default).
    expect(heldMs).toBeGreaterThan(timeoutMs);
    console.log(
      `[txn-spike] an abandoned transaction (timeout ${timeoutMs} ms) held read_committed for ${heldMs.toFixed(0)} ms`,
    );
    // A was fenced by the coordinator's timeout abort (epoch bump).
    expect(await failureType(ta.commit())).toBe('INVALID_PRODUCER_EPOCH');
  });
});

/** A one-partition topic on a freshly started private broker. */
async function createPrivateTopic(kafka: Kafka): Promise<string> {
  const topic = randomName('txn-private');
  const admin = kafka.admin();
  await admin.connect();
  try {
    // Just after the start, a waitForLeaders create can fail with UNKNOWN_TOPIC_OR_PARTITION: poll.
    await admin.createTopics({ waitForLeaders: false, topics: [{ topic, numPartitions: 1 }] });
    await waitFor(async () => {
      const { topics } = await admin.fetchTopicMetadata({ topics: [topic] });
      return (topics[0]?.partitions[0]?.leader ?? -1) >= 0;
    });
  } finally {
    await admin.disconnect();
  }
  return topic;
}

describe('Kafka transactions across a broker restart (private broker)', () => {
  let broker: ScratchBroker;
  let kafka: Kafka;
  beforeAll(async () => {
    // A free pair of ports (broker, controller), from a base of this file's own.
    broker = await startScratchBroker(await freePortBlock(2, 21_092 + Number(process.pid % 50) * 2));
    kafka = new Kafka({
      clientId: 'txn-restart',
      brokers: broker.brokers,
      logLevel: logLevel.NOTHING,
      retry: { retries: 5 },
    });
  }, 120_000);
  afterAll(async () => {
    await broker?.destroy();
  });

  it('(a) on the private broker (its Kafka line: OUTBOXKIT_KAFKA_VERSION=4 runs it on 4.x)', async () => {
    const topic = await createPrivateTopic(kafka);
    await fencingCase(kafka, topic);
  });

  it('(c) kill -9 and restart mid-transaction: the open transaction is lost or committed whole, never half; a new producer recovers', async () => {
    const topic = await createPrivateTopic(kafka);
    const tid = randomName('lane');
    const a = await txnProducer(kafka, tid, 10_000);
    const ta = await a.transaction();
    await sendIn(ta, topic, ['a1', 'a2']);
    await broker.kill('SIGKILL');
    await broker.restart();
    const commit = await failureType(ta.commit());
    console.log(`[txn-spike] commit after a broker restart: ${commit}`);
    // Whatever happened to A, a new producer with the lane's id takes over and publishes.
    const b = await txnProducer(kafka, tid, 10_000);
    const tb = await b.transaction();
    await sendIn(tb, topic, ['b1']);
    await tb.commit();
    await commitSentinel(kafka, topic, 'end');
    const { values } = await readValues(kafka, topic, 'end', { timeoutMs: 40_000 });
    // A's two records are all or nothing.
    expect([
      ['b1', 'end'],
      ['a1', 'a2', 'b1', 'end'],
    ]).toContainEqual(values);
    console.log(`[txn-spike] read_committed after the restart: ${values.join(',')}`);
  }, 120_000);
});

describe('the default relay (no transactions): an owner paused mid-pass', () => {
  let db: TestDatabase;
  beforeAll(async () => {
    db = await createTestDatabase();
  });
  afterAll(async () => {
    await db?.drop();
  });

  it('emits a late duplicate after the new owner published newer events of the key (what G4 absorbs)', async () => {
    const [topic] = await createTopics(['paused-owner'], { partitions: 1 });
    const key = 'order-1';
    // A whole-process pause of relay A, emulated in-process: from its send of the paused pass on,
    // every query of A (lease renewals, marks) waits on the gate, and that send on its own gate.
    // A's timers still run here: its send deadline (brokerTimeoutMs 1.5 s, below the 2 s lease)
    // ends the paused pass and A reconnects its producer, but the send it began is not cancelled.
    let pauseAtNextSend = false;
    let gate: Promise<void> | undefined;
    let resume: () => void = () => undefined;
    let resumeSend: () => void = () => undefined;
    let onPaused: () => void = () => undefined;
    const paused = new Promise<void>((r) => (onPaused = r));
    const pool = new pg.Pool({ connectionString: db.url, max: 3 });
    // The relay runs each statement on a client it takes from its pool: gate the query() of every
    // client the pool opens.
    pool.on('connect', (client) => {
      const query = client.query.bind(client) as (...args: unknown[]) => Promise<pg.QueryResult>;
      (client as unknown as { query: typeof query }).query = (...args) =>
        gate ? gate.then(() => query(...args)) : query(...args);
    });
    const inner = createKafkajsProducer(testKafka('paused-owner'));
    const producer: RelayProducer = {
      connect: () => inner.connect(),
      disconnect: () => inner.disconnect(),
      async send(records) {
        if (pauseAtNextSend) {
          pauseAtNextSend = false;
          gate = new Promise<void>((r) => (resume = r));
          const sendGate = new Promise<void>((r) => (resumeSend = r));
          onPaused();
          await sendGate;
        }
        return inner.send(records);
      },
    };
    const ids: string[] = [];
    const write = async (v: number) => {
      const [e] = await withPgTransaction(db.pool, (c) => enqueue(c, { topic: topic!, key, type: 'v', payload: v }));
      ids.push(e!.eventId);
      return e!.eventId;
    };
    const published = async (eventId: string) => {
      const { rows } = await db.pool.query<{ by: string | null }>(
        'SELECT published_at IS NOT NULL AS by FROM outboxkit.outbox_events WHERE event_id = $1',
        [eventId],
      );
      return rows[0]?.by;
    };
    const a = await startRelay(db.url, { pool, producer, listen: false, relayId: 'relay-a' });
    let seen: string[] = [];
    try {
      await waitFor(() => a.heldLanes().includes(laneOf(key)), { message: 'relay A holds the lane' });
      pauseAtNextSend = true;
      await write(1); // A reads it, passes its ownership check, and pauses before the send
      await paused;
      // A's lease runs out (2 s); B takes the lane over and publishes v1, then v2.
      const b = await startRelay(db.url, { relayId: 'relay-b' });
      await waitFor(() => b.heldLanes().includes(laneOf(key)), { timeoutMs: 20_000 });
      await waitFor(() => published(ids[0]!), { timeoutMs: 20_000 });
      const v2 = await write(2);
      await waitFor(() => published(v2), { timeoutMs: 20_000 });
      // A wakes up: the send it began goes through (its pass had already ended at the deadline, so
      // it marks nothing; a mark would be refused by the fencing token). Its queries wait until the
      // copy is in the topic: A's stand-down, due a lease after that send began, would otherwise
      // reconnect its producer during it.
      resumeSend();
      seen = await readTopic(
        topic!,
        (m) => m.headers[HEADER_EVENT_ID]!,
        (all) => all.length >= 3,
      );
    } finally {
      resumeSend();
      resume();
    }
    // v1 (B), v2 (B), then A's late copy of v1 after the newer v2.
    expect(seen).toEqual([ids[0], ids[1], ids[0]]);
    await a.stopAndForget();
    await pool.end();
  });
});
