/**
 * B2 relay drain and relay memory: N pending 256-byte events (default 200,000; BENCH_EVENTS).
 * - relay: the built `outboxkit relay` daemon (a child process, so its RSS is its own) drains them,
 *   timed from its first published event;
 * - raw: kafkajs producing the same messages with the same producer settings and batch size;
 * - null publisher: the relay's database work alone (a producer that acknowledges at once).
 * Ratio = relay / min(raw, null publisher): how close the relay comes to its slower half.
 */
import { randomUUID } from 'node:crypto';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import {
  B2_BATCH,
  B2_KEYS,
  B2_PARTITIONS,
  b2Ratio,
  builtCli,
  drainWithDaemon,
  drainWithNullPublisher,
  rawKafkajsProduce,
  seedB2,
} from './relay-support.js';
import { benchDatabase, machine } from './support.js';

const N = Number(process.env.BENCH_EVENTS ?? 200_000);

export async function run(): Promise<string> {
  builtCli();
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: 4 });
  const kafka = new Kafka({ clientId: 'bench', brokers: db.brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const topic = `bench-relay-${randomUUID().slice(0, 8)}`;
  await admin.createTopics({ waitForLeaders: true, topics: [{ topic, numPartitions: B2_PARTITIONS }] });

  // 1. The relay daemon, as a child process: the built CLI, as users run it (`outboxkit relay`).
  await seedB2(pool, topic, N);
  const { ms: relayMs, maxRssMb: maxRss } = await drainWithDaemon(pool, {
    databaseUrl: db.url,
    brokers: db.brokers,
    count: N,
  });

  // 2. Raw kafkajs with the relay's producer settings, same messages, batches of the same size.
  const rawMs = await rawKafkajsProduce(kafka, topic, N);

  // 3. The relay's database work alone.
  await pool.query('TRUNCATE outboxkit.outbox_events');
  await seedB2(pool, topic, N);
  const nullMs = await drainWithNullPublisher(pool);

  await admin.deleteTopics({ topics: [topic] });
  await admin.disconnect();
  await pool.end();
  await db.drop();

  const rate = (ms: number) => (N / (ms / 1000)).toFixed(0);
  return [
    `Machine: ${await machine()}; ${N} events of 256 bytes, ${B2_KEYS} keys, topic of ${B2_PARTITIONS} partitions, batch ${B2_BATCH}.`,
    '',
    '| run | events/s |',
    '| --- | --- |',
    `| relay daemon (child process) | ${rate(relayMs)} |`,
    `| raw kafkajs, same settings | ${rate(rawMs)} |`,
    `| relay with a null publisher | ${rate(nullMs)} |`,
    '',
    `B2 ratio relay / min(raw, null publisher) = **${b2Ratio({ relay: relayMs, raw: rawMs, nullPublisher: nullMs }).toFixed(3)}** (target ≥ 0.80)`,
    `Relay RSS while draining: max **${maxRss.toFixed(0)} MB** (target ≤ 120 MB)`,
  ].join('\n');
}
