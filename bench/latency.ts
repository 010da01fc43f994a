/**
 * B3 relay latency at a steady rate (default 1,000 events/s for 10 s; BENCH_RATE, BENCH_SECONDS)
 * in LISTEN/NOTIFY mode: commit → consumer receipt through the relay, against raw produce →
 * consumer receipt with the same producer settings, in the same process. Reports the latency the
 * relay adds at p50 and p99.
 */
import { randomUUID } from 'node:crypto';
import { Kafka, logLevel, type Consumer } from 'kafkajs';
import pg from 'pg';
import { enqueue } from '../src/index.js';
import { Relay } from '../relay/index.js';
import { benchDatabase, machine } from './support.js';

const RATE = Number(process.env.BENCH_RATE ?? 1_000);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 10);

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] ?? NaN;
}

/** Calls `tick(i)` RATE times a second for SECONDS, up to `concurrency` in flight. */
async function paced(tick: (i: number) => Promise<void>, concurrency = 16): Promise<void> {
  const total = RATE * SECONDS;
  const start = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < total; i = next++) {
        const due = start + (i * 1000) / RATE;
        const wait = due - performance.now();
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        await tick(i);
      }
    }),
  );
}

async function until(done: () => boolean, status: () => string, timeoutMs = 60_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!done()) {
    if (performance.now() > deadline) throw new Error(`timed out: ${status()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function listen(kafka: Kafka, topic: string, onMessage: (id: string) => void): Promise<Consumer> {
  const consumer = kafka.consumer({ groupId: `bench-${randomUUID()}`, maxWaitTimeInMs: 100 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let ready!: () => void;
  const joined = new Promise<void>((r) => (ready = r));
  consumer.on(consumer.events.GROUP_JOIN, () => ready());
  await consumer.run({ eachMessage: async ({ message }) => onMessage(message.headers!['event-id']!.toString()) });
  await joined;
  return consumer;
}

export async function run(): Promise<string> {
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: 20 });
  const kafka = new Kafka({ clientId: 'bench-latency', brokers: db.brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const rawTopic = `bench-raw-${randomUUID().slice(0, 8)}`;
  const relayTopic = `bench-relay-${randomUUID().slice(0, 8)}`;
  await admin.createTopics({
    waitForLeaders: true,
    topics: [rawTopic, relayTopic].map((topic) => ({ topic, numPartitions: 3 })),
  });

  // Raw: produce → consume.
  const sentAt = new Map<string, number>();
  const raw: number[] = [];
  const rawConsumer = await listen(kafka, rawTopic, (id) => raw.push(performance.now() - sentAt.get(id)!));
  // The floor: a plain kafkajs producer (acks=all) sending each message as it comes, concurrently.
  // (The relay's own producer sends one request at a time and batches what accumulated meanwhile;
  // one message per serialised send cannot reach 1,000/s here.)
  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  await paced(async (i) => {
    const id = randomUUID();
    sentAt.set(id, performance.now());
    await producer.send({
      topic: rawTopic,
      acks: -1,
      messages: [{ key: `k${i % 100}`, value: Buffer.from('{"n":1}'), headers: { 'event-id': id } }],
    });
  });
  await until(
    () => raw.length >= RATE * SECONDS,
    () => `raw: ${raw.length} of ${RATE * SECONDS} received`,
  );
  await rawConsumer.disconnect();
  await producer.disconnect();

  // Through the outbox and the relay: commit → consume.
  const committedAt = new Map<string, number>();
  const viaRelay: number[] = [];
  const relayConsumer = await listen(kafka, relayTopic, (id) => {
    const t = committedAt.get(id);
    if (t !== undefined && viaRelay.length < RATE * SECONDS) viaRelay.push(performance.now() - t);
  });
  const relay = new Relay({ pool, kafka, pollIntervalMs: 1_000 });
  await relay.start();
  await paced(async (i) => {
    // The time COMMIT is sent: the relay can see the row before the COMMIT reply is processed
    // here, so a time taken after it could come later than the message's receipt.
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      const [e] = await enqueue(c, { topic: relayTopic, key: `k${i % 100}`, type: 't', payload: { n: 1 } });
      committedAt.set(e!.eventId, performance.now());
      await c.query('COMMIT');
    } finally {
      c.release();
    }
  });
  await until(
    () => viaRelay.length >= RATE * SECONDS,
    () => `relay: ${viaRelay.length} of ${RATE * SECONDS} received`,
  );
  await relay.stop();
  await relayConsumer.disconnect();

  await admin.deleteTopics({ topics: [rawTopic, relayTopic] });
  await admin.disconnect();
  await pool.end();
  await db.drop();
  const row = (name: string, xs: number[]) => `| ${name} | ${pct(xs, 50).toFixed(1)} | ${pct(xs, 99).toFixed(1)} |`;
  return [
    `Machine: ${await machine()}; ${RATE} events/s for ${SECONDS} s, 100 keys, 3 partitions, NOTIFY on.`,
    '',
    '| path | p50 ms | p99 ms |',
    '| --- | --- | --- |',
    row('raw produce → consume', raw),
    row('commit → relay → consume', viaRelay),
    '',
    `Added by the relay: p50 **${(pct(viaRelay, 50) - pct(raw, 50)).toFixed(1)} ms** (target ≤ 2), p99 **${(pct(viaRelay, 99) - pct(raw, 99)).toFixed(1)} ms** (target ≤ 10).`,
  ].join('\n');
}
