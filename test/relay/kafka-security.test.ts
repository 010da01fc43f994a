/**
 * Real-cluster connection settings against a private broker (test/relay/secure-broker.ts):
 * SASL_PLAINTEXT (SCRAM-SHA-256 and PLAIN), SASL_SSL (TLS with a test CA + SCRAM-SHA-256) and
 * mutual TLS, through the CLI daemon, the CLI commands and an embedded relay.
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
import { messagesIn as messagesInOn, randomName } from '../helpers/kafka.js';
import { kill, spawnCli, spawnRelay } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';
import { freePortBlock } from '../../scripts/services.js';
import { startSecureBroker, type SecureBroker } from './secure-broker.js';

let broker: SecureBroker;
let db: TestDatabase;
const dir = mkdtempSync(path.join(tmpdir(), 'outboxkit-sasl-'));

beforeAll(async () => {
  // Five free ports (the broker uses port to port + 4) from a random base: the machine's own
  // services hold some in this range (RabbitMQ's 25672 failed a CI run whose block held it).
  broker = await startSecureBroker(await freePortBlock(5, 21_000 + Math.floor(Math.random() * 10_000)));
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

const messagesIn = (topic: string) => messagesInOn(topic, scramKafka());

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
    const line = await waitFor(() => relay.output.join('').match(/"port":(\d+),[^\n]*metrics and health endpoints/), {
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
      brokerTimeoutMs: 1_500,
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

describe('CLI over SCRAM-SHA-512', () => {
  it('topics ensure authenticates with SCRAM-SHA-512 (mechanism in any case, password from a file)', async () => {
    const passwordFile = path.join(dir, 'scram512-password');
    writeFileSync(passwordFile, broker.users.scram512.password);
    const topic = randomName('scram512');
    const r = spawnCli(['topics', 'ensure', topic, '--json'], {
      KAFKA_BROKERS: broker.brokers.join(','),
      KAFKA_SASL_MECHANISM: 'SCRAM-SHA-512',
      KAFKA_SASL_USERNAME: broker.users.scram512.username,
      KAFKA_SASL_PASSWORD_FILE: passwordFile,
    });
    expect((await r.exited).code, r.output.join('')).toBe(0);
    expect(JSON.parse(r.stdout.join(''))).toMatchObject({ created: [topic], existing: [], partitions: { [topic]: 3 } });
    // The same user with the SHA-256 mechanism has no credentials: refused.
    const wrong = spawnCli(['topics', 'ensure', randomName('scram512-wrong'), '--json', '--kafka-retries', '0'], {
      KAFKA_BROKERS: broker.brokers.join(','),
      KAFKA_SASL_MECHANISM: 'scram-sha-256',
      KAFKA_SASL_USERNAME: broker.users.scram512.username,
      KAFKA_SASL_PASSWORD_FILE: passwordFile,
    });
    expect((await wrong.exited).code).toBe(1);
    expect(wrong.output.join('')).toMatch(/SASL SCRAM SHA256 authentication failed/);
  });
});

describe('relay and CLI over TLS', () => {
  it('the CLI relay publishes through SASL_SSL (CA file, SCRAM, password file) set by --kafka-config', async () => {
    const topic = await createTopic('sasl-ssl');
    await enqueueEvents(topic, 3);
    const passwordFile = path.join(dir, 'scram-password');
    writeFileSync(passwordFile, `${broker.users.scram.password}\n`);
    const file = path.join(dir, 'sasl-ssl.json');
    writeFileSync(
      file,
      JSON.stringify({
        brokers: broker.saslSslBrokers,
        ssl: { caFile: broker.tls.caFile },
        sasl: { mechanism: 'scram-sha-256', username: broker.users.scram.username, passwordFile },
      }),
    );
    const relay = spawnRelay(db.url, { KAFKA_BROKERS: '' }, ['--kafka-config', file, '--log-level', 'debug']);
    await waitFor(async () => (await pending(topic)) === 0, { timeoutMs: 30_000, message: relay.output.join('') });
    expect(await messagesIn(topic)).toBe(3);
    await kill(relay.proc, 'SIGTERM');
    const logs = relay.output.join('');
    expect(logs).toContain('"ssl":true');
    expect(logs).not.toContain(broker.users.scram.password);
  });

  it('TLS without the CA that signed the broker certificate fails with a clear certificate error', async () => {
    const r = spawnCli(['topics', 'ensure', randomName('untrusted'), '--json', '--kafka-ssl', '--kafka-retries', '0'], {
      KAFKA_BROKERS: broker.saslSslBrokers.join(','),
      KAFKA_SASL_MECHANISM: 'scram-sha-256',
      KAFKA_SASL_USERNAME: broker.users.scram.username,
      KAFKA_SASL_PASSWORD: broker.users.scram.password,
    });
    expect((await r.exited).code).toBe(1);
    const stderr = r.output.join('').replace(r.stdout.join(''), '');
    expect(JSON.parse(stderr).error.message).toMatch(/self[- ]signed certificate|unable to verify|certificate/i);
  });

  it('mutual TLS: a client certificate with an encrypted key and its passphrase file; refused without the certificate', async () => {
    const env = {
      KAFKA_BROKERS: broker.mtlsBrokers.join(','),
      KAFKA_SSL_CA_FILE: broker.tls.caFile,
    };
    const topic = randomName('mtls');
    const ok = spawnCli(['topics', 'ensure', topic, '--json'], {
      ...env,
      KAFKA_SSL_CERT_FILE: broker.tls.clientCertFile,
      KAFKA_SSL_KEY_FILE: broker.tls.clientKeyFile,
      KAFKA_SSL_KEY_PASSWORD_FILE: broker.tls.clientKeyPasswordFile,
    });
    expect((await ok.exited).code, ok.output.join('')).toBe(0);
    expect(JSON.parse(ok.stdout.join(''))).toMatchObject({
      created: [topic],
      existing: [],
      partitions: { [topic]: 3 },
    });
    const refused = spawnCli(['topics', 'ensure', randomName('mtls-no-cert'), '--json', '--kafka-retries', '0'], env);
    expect((await refused.exited).code).toBe(1);
  });
});
