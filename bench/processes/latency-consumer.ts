/**
 * The receiving end of bench/latency.ts, in a process of its own: a plain kafkajs consumer of the
 * given topics that prints, for each message, its `event-id` header and the wall-clock time of its
 * receipt (`performance.timeOrigin + performance.now()`, ms), as lines `r <id> <time>`, flushed
 * every 20 ms. Prints `ready` once the group is joined. Stops on SIGTERM.
 *
 * Usage: node --import tsx bench/processes/latency-consumer.ts <brokers> <topic> [<topic> ...]
 */
import { randomUUID } from 'node:crypto';
import { Kafka, logLevel } from 'kafkajs';

const [brokers, ...topics] = process.argv.slice(2);
if (!brokers || topics.length === 0) throw new Error('usage: latency-consumer.ts <brokers> <topic> [<topic> ...]');

const kafka = new Kafka({
  clientId: 'bench-latency-consumer',
  brokers: brokers.split(','),
  logLevel: logLevel.NOTHING,
});
// maxWaitTimeInMs bounds an empty fetch only: a fetch returns as soon as a record arrives.
const consumer = kafka.consumer({ groupId: `bench-latency-${randomUUID()}`, maxWaitTimeInMs: 100 });
let out: string[] = [];
const flush = setInterval(() => {
  if (out.length === 0) return;
  process.stdout.write(out.join(''));
  out = [];
}, 20);

consumer.on(consumer.events.GROUP_JOIN, () => process.stdout.write('ready\n'));
await consumer.connect();
for (const topic of topics) await consumer.subscribe({ topic, fromBeginning: true });
await consumer.run({
  eachMessage: async ({ message }) => {
    const at = performance.timeOrigin + performance.now();
    out.push(`r ${message.headers?.['event-id']?.toString() ?? '-'} ${at.toFixed(3)}\n`);
  },
});

process.once('SIGTERM', () => {
  clearInterval(flush);
  if (out.length > 0) process.stdout.write(out.join(''));
  void consumer.disconnect().finally(() => process.exit(0));
});
