/**
 * Authenticated Kafka: the relay (CLI daemon and embedded) against a private broker with a
 * SASL_PLAINTEXT listener (SCRAM-SHA-256 and PLAIN users). TLS is not covered here: it needs
 * certificates and a TLS listener (see docs/kafka.md, "What is tested").
 */
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import type { PoolClient } from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Relay } from '../../relay/index.js';
import { enqueue, kafkaConfigFromEnv } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName } from '../helpers/kafka.js';
import { kill, spawnRelay } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';
import { startSaslBroker, type SaslBroker } from './sasl-broker.js';

let broker: SaslBroker;
let db: TestDatabase;
const dir = mkdtempSync(path.join(tmpdir(), 'outboxkit-sasl-'));

beforeAll(async () => {
  // A random base port; the broker also uses port + 1 and port + 2.
  broker = await startSaslBroker(21_000 + Math.floor(Math.random() * 10_000));
  db = await createTestDatabase();
}, 150_000);
afterAll(async () => {
  await broker?.destroy();
  await db?.drop();
});

function scramKafka(): Kafka {
  return new Kafka({
    brokers: broker.brokers,
    clientId: 'sasl-test',
    sasl: { mechanism: 'scram-sha-256', ...broker.users.scram },
    logLevel: logLevel.NOTHING,
  });
}

async function createTopic(prefix: string): Promise<string> {
  const topic = randomName(prefix);
  const admin = scramKafka().admin();
  await admin.connect();
  try {
    await admin.createTopics({ topics: [{ topic, numPartitions: 2 }], waitForLeaders: true });
  } finally {
    await admin.disconnect();
  }
  return topic;
}

/** Messages written to `topic` (sum of high watermarks). */
async function messagesIn(topic: string): Promise<number> {
  const admin = scramKafka().admin();
  await admin.connect();
  try {
    const offsets = await admin.fetchTopicOffsets(topic);
    return offsets.reduce((n, p) => n + Number(p.high), 0);
  } finally {
    await admin.disconnect();
  }
}

async function enqueueEvents(topic: string, n: number): Promise<void> {
  const c: PoolClient = await db.pool.connect();
  try {
    await c.query('BEGIN');
    await enqueue(
      c,
      Array.from({ length: n }, (_, i) => ({ topic, key: `k-${i % 3}`, type: 'sasl.test', payload: { i } })),
    );
    await c.query('COMMIT');
  } finally {
    c.release();
  }
}

async function pending(topic: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL AND topic = $1',
    [topic],
  );
  return rows[0]!.n;
}

describe('relay over SASL', () => {
  it('the CLI relay publishes through SCRAM-SHA-256 set by --kafka-config and env; its logs never hold the password', async () => {
    const topic = await createTopic('sasl-scram');
    await enqueueEvents(topic, 5);
    const file = path.join(dir, 'scram.json');
    writeFileSync(
      file,
      JSON.stringify({
        brokers: broker.brokers,
        sasl: { mechanism: 'SCRAM-SHA-256', username: broker.users.scram.username },
        producer: { compression: 'gzip' },
      }),
    );
    const relay = spawnRelay(db.url, { KAFKA_SASL_PASSWORD: broker.users.scram.password, KAFKA_BROKERS: '' }, [
      '--kafka-config',
      file,
      '--log-level',
      'debug',
    ]);
    await waitFor(async () => (await pending(topic)) === 0, { timeoutMs: 30_000, message: relay.output.join('') });
    expect(await messagesIn(topic)).toBe(5);
    await kill(relay.proc, 'SIGTERM');
    const logs = relay.output.join('');
    expect(logs).toContain('"mechanism":"scram-sha-256"'); // the redacted settings are logged
    expect(logs).toContain('"compression":"gzip"');
    expect(logs).not.toContain(broker.users.scram.password);
  });

  it('wrong credentials: a clear authentication error in the logs, /readyz 503, nothing published, no password logged', async () => {
    const topic = await createTopic('sasl-denied');
    await enqueueEvents(topic, 1);
    const wrong = 'wrong-password-4f2a9c';
    const relay = spawnRelay(
      db.url,
      {
        KAFKA_BROKERS: broker.brokers.join(','),
        KAFKA_SASL_MECHANISM: 'scram-sha-256',
        KAFKA_SASL_USERNAME: broker.users.scram.username,
        KAFKA_SASL_PASSWORD: wrong,
        OUTBOXKIT_METRICS_PORT: '0',
      },
      ['--log-level', 'info'],
    );
    const line = await waitFor(() => relay.output.join('').match(/"port":(\d+)[^\n]*metrics and health endpoints/), {
      timeoutMs: 30_000,
      message: relay.output.join(''),
    });
    await waitFor(() => /SASL SCRAM SHA256 authentication failed/.test(relay.output.join('')), {
      timeoutMs: 30_000,
      message: relay.output.join(''),
    });
    const res = await fetch(`http://127.0.0.1:${line[1]}/readyz`);
    expect(res.status).toBe(503);
    expect(await res.text()).toMatch(/no connected Kafka producer/);
    expect(await pending(topic)).toBe(1);
    expect(await messagesIn(topic)).toBe(0);
    await kill(relay.proc, 'SIGTERM');
    expect(relay.output.join('')).not.toContain(wrong);
  });

  it('an embedded relay publishes through SASL PLAIN configured by kafkaConfigFromEnv()', async () => {
    const topic = await createTopic('sasl-plain');
    await enqueueEvents(topic, 4);
    const resolved = kafkaConfigFromEnv({
      env: {
        KAFKA_BROKERS: broker.brokers.join(','),
        KAFKA_SASL_MECHANISM: 'plain',
        KAFKA_SASL_USERNAME: broker.users.plain.username,
        KAFKA_SASL_PASSWORD: broker.users.plain.password,
      },
    });
    expect(resolved.warnings.join('\n')).toMatch(/clear text/); // PLAIN without TLS
    const relay = new Relay({
      connectionString: db.url,
      kafka: new Kafka({ ...resolved.kafkaConfig, logLevel: logLevel.NOTHING }),
      producerOptions: resolved.producer,
      pollIntervalMs: 100,
      leaseMs: 2_000,
    });
    await relay.start();
    try {
      await waitFor(async () => (await pending(topic)) === 0, { timeoutMs: 30_000 });
      expect(await messagesIn(topic)).toBe(4);
      expect(relay.producerConnected).toBe(true);
    } finally {
      await relay.stop();
    }
  });
});
