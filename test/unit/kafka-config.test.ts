import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { inspect } from 'node:util';
import type pg from 'pg';
import type { DedupConsumerOptions } from '../../consumer/options.js';
import type { RelayOptions } from '../../relay/relay.js';
import { describe, expect, it } from 'vitest';
import { isOutboxkitError, type InvalidKafkaConfigError } from '../../src/errors.js';
import { kafkaConfigFromEnv, resolveKafkaConfig, type ResolveKafkaConfigOptions } from '../../src/kafka/config.js';

const SECRET = 'S3cr3t-pa55word-never-shown';
const dir = mkdtempSync(path.join(tmpdir(), 'outboxkit-kafka-config-'));
function file(name: string, content: string): string {
  const p = path.join(dir, name);
  writeFileSync(p, content);
  return p;
}
const json = (name: string, value: unknown) => file(name, JSON.stringify(value));

/** The error `fn` throws, checked to be an InvalidKafkaConfigError that does not contain the secret. */
function errorOf(fn: () => unknown): InvalidKafkaConfigError {
  try {
    fn();
  } catch (err) {
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    expect((err as Error).message).not.toContain(SECRET);
    expect(inspect(err)).not.toContain(SECRET);
    return err as InvalidKafkaConfigError;
  }
  throw new Error('expected an error');
}

const resolve = (o: ResolveKafkaConfigOptions) => resolveKafkaConfig({ env: {}, ...o });

describe('resolveKafkaConfig: defaults and precedence', () => {
  it('defaults: local broker, no TLS, no SASL, safe producer defaults', () => {
    const r = resolve({});
    expect(r.kafkaConfig.brokers).toEqual(['127.0.0.1:9092']);
    expect(r.kafkaConfig.clientId).toBe('outboxkit');
    expect(r.kafkaConfig.ssl).toBe(false);
    expect(r.kafkaConfig.sasl).toBeUndefined();
    expect(r.kafkaConfig.connectionTimeout).toBe(3_000);
    expect(r.producer).toEqual({ compression: 'none', requestTimeoutMs: 30_000, retries: 5, metadataMaxAgeMs: 30_000 });
    expect(r.consumer).toEqual({});
    expect(r.warnings).toEqual([]);
  });

  it('program defaults apply below every source', () => {
    expect(resolve({ defaults: { clientId: 'outboxkit-relay' } }).kafkaConfig.clientId).toBe('outboxkit-relay');
  });

  it('flag > env > file > default, setting by setting', () => {
    const cfg = json('precedence.json', {
      brokers: ['file:1'],
      clientId: 'from-file',
      requestTimeoutMs: 1_111,
      producer: { compression: 'gzip' },
    });
    const env = { KAFKA_CONFIG_FILE: cfg, KAFKA_BROKERS: 'env:1,env:2', KAFKA_CLIENT_ID: 'from-env' };
    const r = resolve({ env, flags: { clientId: 'from-flag' } });
    expect(r.kafkaConfig.clientId).toBe('from-flag');
    expect(r.kafkaConfig.brokers).toEqual(['env:1', 'env:2']);
    expect(r.kafkaConfig.requestTimeout).toBe(1_111);
    expect(r.producer.compression).toBe('gzip');
    expect(r.description.configFile).toBe(cfg);
    // Without the env layer the file wins over the default.
    expect(resolve({ env: { KAFKA_CONFIG_FILE: cfg } }).kafkaConfig.brokers).toEqual(['file:1']);
  });

  it('metadata ages: the relay producer from a flag, variable or file (30 s by default); the consumer from a variable or file', () => {
    expect(resolve({}).producer.metadataMaxAgeMs).toBe(30_000);
    const env = { KAFKA_PRODUCER_METADATA_MAX_AGE_MS: '2000', KAFKA_CONSUMER_METADATA_MAX_AGE_MS: '3000' };
    const r = resolve({ env });
    expect(r.producer.metadataMaxAgeMs).toBe(2_000);
    expect(r.consumer).toEqual({ metadataMaxAgeMs: 3_000 });
    expect(resolve({ env, flags: { producerMetadataMaxAgeMs: '1000' } }).producer.metadataMaxAgeMs).toBe(1_000);
    const cfg = json('metadata-age.json', {
      producer: { metadataMaxAgeMs: 4_000 },
      consumer: { metadataMaxAgeMs: 5_000 },
    });
    const f = resolve({ flags: { kafkaConfig: cfg } });
    expect([f.producer.metadataMaxAgeMs, f.consumer.metadataMaxAgeMs]).toEqual([4_000, 5_000]);
    expect(() => resolve({ env: { KAFKA_PRODUCER_METADATA_MAX_AGE_MS: '50' } })).toThrow(
      /KAFKA_PRODUCER_METADATA_MAX_AGE_MS/,
    );
  });

  it('--kafka-config beats KAFKA_CONFIG_FILE, which beats the library configFile', () => {
    const a = json('a.json', { clientId: 'a' });
    const b = json('b.json', { clientId: 'b' });
    const c = json('c.json', { clientId: 'c' });
    expect(
      resolve({ flags: { kafkaConfig: a }, env: { KAFKA_CONFIG_FILE: b }, configFile: c }).kafkaConfig.clientId,
    ).toBe('a');
    expect(resolve({ env: { KAFKA_CONFIG_FILE: b }, configFile: c }).kafkaConfig.clientId).toBe('b');
    expect(resolve({ configFile: c }).kafkaConfig.clientId).toBe('c');
  });

  it('OUTBOXKIT_CLIENT_ID is an alias below KAFKA_CLIENT_ID', () => {
    expect(resolve({ env: { OUTBOXKIT_CLIENT_ID: 'old' } }).kafkaConfig.clientId).toBe('old');
    expect(resolve({ env: { OUTBOXKIT_CLIENT_ID: 'old', KAFKA_CLIENT_ID: 'new' } }).kafkaConfig.clientId).toBe('new');
  });

  it('the password and the password file are one setting: the higher source wins', () => {
    const pwFile = file('pw-precedence', `${SECRET}\n`);
    const env = {
      KAFKA_SASL_MECHANISM: 'SCRAM-SHA-512',
      KAFKA_SASL_USERNAME: 'alice',
      KAFKA_SASL_PASSWORD: 'env-password',
    };
    const r = resolve({ env, flags: { kafkaSaslPasswordFile: pwFile } });
    expect((r.kafkaConfig.sasl as { password: string }).password).toBe(SECRET); // newline dropped
    expect(r.kafkaConfig.sasl?.mechanism).toBe('scram-sha-512');
    expect((resolve({ env }).kafkaConfig.sasl as { password: string }).password).toBe('env-password');
  });

  it('consumer settings come from the file or the environment, ready to spread', () => {
    const cfg = json('consumer.json', { consumer: { sessionTimeoutMs: 45_000, heartbeatIntervalMs: 3_000 } });
    const r = resolve({ env: { KAFKA_CONFIG_FILE: cfg, KAFKA_CONSUMER_FETCH_MAX_WAIT_MS: '500' } });
    expect(r.consumer).toEqual({ sessionTimeoutMs: 45_000, heartbeatIntervalMs: 3_000, fetchMaxWaitMs: 500 });
  });

  it('the producer and consumer settings fit the relay and dedup consumer options (typechecked)', () => {
    const r = resolve({ env: { KAFKA_CONSUMER_SESSION_TIMEOUT_MS: '45000', KAFKA_PRODUCER_RETRIES: '7' } });
    const consumer: Partial<DedupConsumerOptions<pg.Pool>> = { ...r.consumer };
    const producer: RelayOptions['producerOptions'] = r.producer;
    expect(consumer.sessionTimeoutMs).toBe(45_000);
    expect(producer?.retries).toBe(7);
  });

  it('kafkaConfigFromEnv reads process.env-shaped input and ignores nothing', () => {
    const r = kafkaConfigFromEnv({ env: { KAFKA_BROKERS: 'b1:9093', KAFKA_SSL: 'true' } });
    expect(r.kafkaConfig.brokers).toEqual(['b1:9093']);
    expect(r.kafkaConfig.ssl).toBe(true);
  });
});

describe('resolveKafkaConfig: validation names the field, never the secret', () => {
  it('an unknown mechanism names the variable', () => {
    const e = errorOf(() => resolve({ env: { KAFKA_SASL_MECHANISM: 'gssapi', KAFKA_SASL_USERNAME: 'a' } }));
    expect(e.field).toBe('KAFKA_SASL_MECHANISM');
    expect(e.message).toMatch(/plain, scram-sha-256, scram-sha-512/);
  });

  it('a malformed number names the flag', () => {
    const e = errorOf(() => resolve({ flags: { kafkaRequestTimeoutMs: '30s' } }));
    expect(e.field).toBe('--kafka-request-timeout-ms');
  });

  it('a malformed broker names the source', () => {
    expect(errorOf(() => resolve({ env: { KAFKA_BROKERS: 'host-without-port' } })).field).toBe('KAFKA_BROKERS');
    expect(errorOf(() => resolve({ flags: { brokers: 'h:70000' } })).message).toMatch(/1-65535/);
  });

  it('an unknown key of the file is named with the file', () => {
    const cfg = json('typo.json', { sasl: { mechanism: 'plain', usename: 'alice' } });
    const e = errorOf(() => resolve({ flags: { kafkaConfig: cfg } }));
    expect(e.field).toBe(`sasl.usename in ${cfg}`);
  });

  it('a file that is not JSON is named without quoting its text', () => {
    const cfg = file('broken.json', `{ "sasl": { "password": "${SECRET}" `);
    expect(errorOf(() => resolve({ flags: { kafkaConfig: cfg } })).field).toBe('--kafka-config');
  });

  it('a missing file is named', () => {
    const e = errorOf(() =>
      resolve({
        env: { KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_USERNAME: 'a', KAFKA_SASL_PASSWORD_FILE: '/nonexistent/pw' },
      }),
    );
    expect(e.field).toBe('KAFKA_SASL_PASSWORD_FILE');
    expect(e.message).toMatch(/ENOENT/);
  });

  it('SASL needs a mechanism, a username and a password', () => {
    expect(errorOf(() => resolve({ env: { KAFKA_SASL_USERNAME: 'a', KAFKA_SASL_PASSWORD: SECRET } })).message).toMatch(
      /mechanism/,
    );
    expect(
      errorOf(() => resolve({ env: { KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_PASSWORD: SECRET } })).message,
    ).toMatch(/username/);
    expect(
      errorOf(() => resolve({ env: { KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_USERNAME: 'a' } })).message,
    ).toMatch(/password/);
  });

  it('both forms of the password in one source are refused', () => {
    const pw = file('pw-both', SECRET);
    const cfg = json('both.json', { sasl: { mechanism: 'plain', username: 'a', password: SECRET, passwordFile: pw } });
    expect(errorOf(() => resolve({ flags: { kafkaConfig: cfg } })).message).toMatch(/not both/);
  });

  it('an empty password file is refused', () => {
    const pw = file('pw-empty', '\n');
    const e = errorOf(() =>
      resolve({ env: { KAFKA_SASL_MECHANISM: 'plain', KAFKA_SASL_USERNAME: 'a', KAFKA_SASL_PASSWORD_FILE: pw } }),
    );
    expect(e.message).toMatch(/empty/);
  });

  it('TLS files read into the kafkajs ssl options; a certificate needs its key', () => {
    const ca = file('ca.pem', 'CA-PEM');
    const cert = file('cert.pem', 'CERT-PEM');
    const key = file('key.pem', `KEY-PEM-${SECRET}`);
    const r = resolve({ env: { KAFKA_SSL_CA_FILE: ca, KAFKA_SSL_CERT_FILE: cert, KAFKA_SSL_KEY_FILE: key } });
    expect(r.kafkaConfig.ssl).toMatchObject({ ca: ['CA-PEM'], cert: 'CERT-PEM', key: `KEY-PEM-${SECRET}` });
    expect(r.description.ssl).toBe(true);
    expect(JSON.stringify(r.kafkaConfig)).not.toContain(SECRET);
    expect(inspect(r.kafkaConfig.ssl, { depth: 5 })).not.toContain(SECRET);
    expect(errorOf(() => resolve({ env: { KAFKA_SSL_CERT_FILE: cert } })).field).toBe('KAFKA_SSL_CERT_FILE');
    expect(errorOf(() => resolve({ env: { KAFKA_SSL: 'false', KAFKA_SSL_CA_FILE: ca } })).message).toMatch(
      /turned off/,
    );
  });

  it('consumer heartbeat must be below the session timeout', () => {
    const e = errorOf(() =>
      resolve({ env: { KAFKA_CONSUMER_SESSION_TIMEOUT_MS: '3000', KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS: '3000' } }),
    );
    expect(e.field).toBe('KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS');
  });

  it('compression codecs kafkajs does not ship are refused with the reason', () => {
    expect(errorOf(() => resolve({ flags: { producerCompression: 'zstd' } })).message).toMatch(/codec/);
  });
});

describe("resolveKafkaConfig: the relay's producer safety settings cannot be weakened", () => {
  it.each([
    ['acks', 1],
    ['idempotent', false],
    ['maxInFlightRequests', 5],
    ['allowAutoTopicCreation', true],
    ['transactionalId', 'tx-1'],
  ])('producer.%s = %j in the file is refused', (key, value) => {
    const cfg = json(`locked-${key}.json`, { producer: { [key]: value } });
    const e = errorOf(() => resolve({ flags: { kafkaConfig: cfg } }));
    expect(e.field).toBe(`producer.${key} in ${cfg}`);
    expect(e.message).toMatch(/cannot be changed/);
  });

  it('the safe values themselves are accepted (nothing changes)', () => {
    const cfg = json('locked-safe.json', { producer: { acks: 'all', idempotent: true, maxInFlightRequests: 1 } });
    expect(resolve({ flags: { kafkaConfig: cfg } }).producer.retries).toBe(5);
  });

  it('environment variables that try are refused, not ignored', () => {
    expect(errorOf(() => resolve({ env: { KAFKA_PRODUCER_ACKS: '1' } })).field).toBe('KAFKA_PRODUCER_ACKS');
    expect(errorOf(() => resolve({ env: { KAFKA_PRODUCER_MAX_IN_FLIGHT_REQUESTS: '5' } })).field).toBe(
      'KAFKA_PRODUCER_MAX_IN_FLIGHT_REQUESTS',
    );
  });
});

describe('resolveKafkaConfig: redaction and warnings', () => {
  const env = { KAFKA_SASL_MECHANISM: 'scram-sha-256', KAFKA_SASL_USERNAME: 'alice', KAFKA_SASL_PASSWORD: SECRET };

  it('kafkajs reads the password; JSON, pino-style serialisation and inspect never show it', () => {
    const r = resolve({ env: { ...env, KAFKA_SSL: 'true' } });
    expect((r.kafkaConfig.sasl as { password: string }).password).toBe(SECRET);
    expect(r.description).toEqual({
      brokers: ['127.0.0.1:9092'],
      clientId: 'outboxkit',
      ssl: true,
      sasl: { mechanism: 'scram-sha-256', username: 'alice' },
      connectionTimeoutMs: 3_000,
      requestTimeoutMs: 30_000,
      producer: { compression: 'none', requestTimeoutMs: 30_000, retries: 5, metadataMaxAgeMs: 30_000 },
    });
    for (const shown of [
      JSON.stringify(r),
      JSON.stringify(r.kafkaConfig),
      JSON.stringify({ ...r.kafkaConfig }),
      JSON.stringify(r.kafkaConfig.sasl),
      inspect(r, { depth: 10 }),
      inspect({ ...r.kafkaConfig }, { depth: 10 }),
      r.warnings.join('\n'),
    ]) {
      expect(shown).not.toContain(SECRET);
    }
  });

  it('a password given as a flag is accepted with a warning (ps shows it)', () => {
    const r = resolve({
      flags: { kafkaSaslMechanism: 'scram-sha-256', kafkaSaslUsername: 'a', kafkaSaslPassword: SECRET },
    });
    expect(r.warnings.join('\n')).toMatch(/ps/);
    expect(resolve({ env }).warnings).toEqual([]);
  });

  it('PLAIN without TLS and verification turned off are warned about', () => {
    expect(resolve({ env: { ...env, KAFKA_SASL_MECHANISM: 'plain' } }).warnings.join('\n')).toMatch(/clear text/);
    const r = resolve({ env: { KAFKA_SSL: 'true', KAFKA_SSL_REJECT_UNAUTHORIZED: 'false' } });
    expect(r.warnings.join('\n')).toMatch(/verification is off/);
    expect(r.kafkaConfig.ssl).toMatchObject({ rejectUnauthorized: false });
    expect(r.description.sslRejectUnauthorized).toBe(false);
  });
});
