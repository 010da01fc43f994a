/**
 * Same key, same partition, whatever the client: 10,000 keys produced through outboxkit's kafkajs
 * producer, through its @platformatic/kafka producer and through Kafka's own Java producer (the
 * kafka-clients jar of the broker's version, test/kafka/fixtures/KeyProducer.java) to one
 * 6-partition topic land on the same partition, as the broker reports it when the records are
 * read back. Switching the relay from one client to the other therefore keeps each key's events on
 * one partition (docs/kafka.md, "Choosing a client").
 *
 * The same keys through @platformatic/kafka's default partitioner (`murmur2 >>> 0`, which does not
 * clear the sign bit as Java's `toPositive` does) land elsewhere for about half of them: the test
 * measures that share, so it shows the check can fail.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Producer, stringSerializers } from '@platformatic/kafka';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { resolveKafkaJars, resolveKafkaVersion } from '../../scripts/services.js';
import { createKafkajsClient } from '../../src/kafka/kafkajs/client.js';
import { throwIfFailed } from '../../src/kafka/outcomes.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import type { KafkaClient, ProducerRecord } from '../../src/kafka/types.js';
import { createTopics, readTopic, testKafka } from '../helpers/kafka.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const PARTITIONS = 6;
const KEYS = 10_000;

/**
 * Keys of every length from 0 to 40 bytes and beyond (murmur2 reads 4 bytes at a time and mixes a
 * 1-3 byte tail), ASCII and multi-byte UTF-8, the shapes outbox keys take (UUIDs, aggregate ids).
 * No line breaks: the Java producer reads one key per line.
 */
function testKeys(): string[] {
  const keys = new Set<string>();
  for (let i = 0; keys.size < KEYS; i++) {
    switch (i % 5) {
      case 0:
        keys.add(randomUUID());
        break;
      case 1:
        keys.add(`order-${i}`);
        break;
      case 2:
        keys.add('k'.repeat(i % 41) + String(i));
        break;
      case 3:
        keys.add(`clé-${i}-€-${'日本'.repeat(i % 4)}-🙂`);
        break;
      default:
        keys.add(String(i % 1_000_003));
    }
  }
  return [...keys];
}

let classes: string;
let lib: string;

beforeAll(async () => {
  const version = resolveKafkaVersion();
  await resolveKafkaJars(version);
  lib = path.join(ROOT, '.services', `kafka-${version}`, 'lib');
  classes = fs.mkdtempSync(path.join(os.tmpdir(), 'outboxkit-keyproducer-'));
  const clients = fs.readdirSync(lib).find((f) => /^kafka-clients-.*\.jar$/.test(f));
  if (!clients) throw new Error(`no kafka-clients jar in ${lib}`);
  await run('javac', [
    '-cp',
    path.join(lib, clients),
    '-d',
    classes,
    path.join(ROOT, 'test/kafka/fixtures/KeyProducer.java'),
  ]);
});

afterAll(() => {
  if (classes) fs.rmSync(classes, { recursive: true, force: true });
});

/** Runs a command to its end; rejects with its output when it fails. */
function run(cmd: string, args: string[], stdin?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const proc = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
    proc.stderr.on('data', (d: Buffer) => (out += d.toString()));
    proc.on('error', reject);
    proc.on('close', (code) =>
      code === 0 ? resolve(out) : reject(new Error(`${cmd} exited with ${code}:\n${out.slice(-3_000)}`)),
    );
    proc.stdin.end(stdin ?? '');
  });
}

/** Produces each key once through outboxkit's producer of `client`, valued `label`, in sends of 500. */
async function produceThrough(
  client: KafkaClient,
  topic: string,
  keys: readonly string[],
  label: string,
): Promise<void> {
  const producer = client.producer();
  await producer.connect();
  try {
    for (let i = 0; i < keys.length; i += 500) {
      const records: ProducerRecord[] = keys
        .slice(i, i + 500)
        .map((key) => ({ topic, key, value: Buffer.from(label) }));
      throwIfFailed(await producer.send(records));
    }
  } finally {
    await producer.disconnect();
  }
}

describe('murmur2 partitioning across Kafka clients', () => {
  it('puts 10,000 keys on the same partitions through kafkajs, @platformatic/kafka and the Java client', async () => {
    const brokers = inject('kafkaBrokers');
    const [topic] = await createTopics(['partitioner'], { partitions: PARTITIONS });
    const keys = testKeys();

    await produceThrough(createKafkajsClient(testKafka('outboxkit-test-kafkajs')), topic!, keys, 'kafkajs');
    await produceThrough(
      createPlatformaticClient({ clientId: 'outboxkit-test-platformatic', brokers }),
      topic!,
      keys,
      'platformatic',
    );
    const javaOut = await run(
      'java',
      ['-cp', `${classes}${path.delimiter}${path.join(lib, '*')}`, 'KeyProducer', brokers.join(','), topic!, 'java'],
      keys.join('\n') + '\n',
    );
    expect(javaOut).toContain(`sent ${KEYS}`);
    // The client's own default partitioner, for the share it puts elsewhere.
    const plain = new Producer({
      clientId: 'outboxkit-test-default',
      bootstrapBrokers: brokers,
      serializers: stringSerializers,
    });
    try {
      for (let i = 0; i < keys.length; i += 500) {
        await plain.send({ messages: keys.slice(i, i + 500).map((key) => ({ topic: topic!, key, value: 'default' })) });
      }
    } finally {
      await plain.close();
    }

    const read = await readTopic(
      topic!,
      (m) => ({ key: m.key, label: m.value?.toString() ?? '', partition: m.partition }),
      (all) => all.length >= 4 * KEYS,
      120_000,
    );
    const byLabel = new Map<string, Map<string | null, number>>();
    for (const r of read) {
      let m = byLabel.get(r.label);
      if (!m) byLabel.set(r.label, (m = new Map()));
      m.set(r.key, r.partition);
    }
    const java = byLabel.get('java')!;
    expect(java.size).toBe(KEYS);
    const differing = (label: string) => keys.filter((k) => byLabel.get(label)?.get(k) !== java.get(k));
    expect(differing('kafkajs')).toEqual([]);
    expect(differing('platformatic')).toEqual([]);
    // outboxkit's own view (the relay's partition gate) agrees with the broker's.
    const client = createPlatformaticClient({ clientId: 'unused', brokers });
    expect(keys.filter((k) => client.partitionForKey(k, PARTITIONS) !== java.get(k))).toEqual([]);
    // Every partition was used (a constant partitioner would also "agree" with itself).
    expect(new Set(java.values()).size).toBe(PARTITIONS);

    const share = differing('default').length / KEYS;
    console.log(
      `@platformatic/kafka's default partitioner: ${(share * 100).toFixed(1)} % of ${KEYS} keys on another partition`,
    );
    expect(share).toBeGreaterThan(0.4);
    expect(share).toBeLessThan(0.6);
  });
});
