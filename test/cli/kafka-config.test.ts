/**
 * The CLI with Kafka settings from a `--kafka-config` file against the real broker (plaintext),
 * their precedence (flag > env > file), and `--json` errors as JSON on stderr.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, expect, inject, it } from 'vitest';
import { createTopics, randomName, topicExists } from '../helpers/kafka.js';
import { spawnCli, type Spawned } from '../helpers/processes.js';

const dir = mkdtempSync(path.join(tmpdir(), 'outboxkit-cli-kafka-'));
function configFile(name: string, value: unknown): string {
  const p = path.join(dir, name);
  writeFileSync(p, JSON.stringify(value));
  return p;
}

async function finished(s: Spawned): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const { code } = await s.exited;
  const stdout = s.stdout.join('');
  // output interleaves stdout and stderr; stderr is what is not stdout.
  const all = s.output.join('');
  return { code, stdout, stderr: all.replace(stdout, '') };
}

const CLOSED = '127.0.0.1:1';

describe('CLI Kafka settings', () => {
  it('topics ensure connects with the brokers of a --kafka-config file', async () => {
    const file = configFile('plain.json', { brokers: inject('kafkaBrokers'), clientId: 'cli-config-test' });
    const topic = randomName('cli-config');
    const r = await finished(spawnCli(['topics', 'ensure', topic, '--kafka-config', file], { KAFKA_BROKERS: '' }));
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`created: ${topic}`);
    expect(await topicExists(topic)).toBe(true);
  });

  it('a flag beats the environment, which beats the file', async () => {
    const wrong = configFile('wrong.json', { brokers: [CLOSED], connectionTimeoutMs: 500, retry: { retries: 0 } });
    const good = inject('kafkaBrokers').join(',');
    // env beats file
    const t1 = randomName('cli-env');
    const r1 = await finished(spawnCli(['topics', 'ensure', t1, '--kafka-config', wrong], { KAFKA_BROKERS: good }));
    expect(r1.code, r1.stderr).toBe(0);
    // flag beats env
    const t2 = randomName('cli-flag');
    const r2 = await finished(
      spawnCli(['topics', 'ensure', t2, '--kafka-config', wrong, '--brokers', good], { KAFKA_BROKERS: CLOSED }),
    );
    expect(r2.code, r2.stderr).toBe(0);
    expect(await topicExists(t1)).toBe(true);
    expect(await topicExists(t2)).toBe(true);
    // and the file alone is used (and fails on its closed port)
    const r3 = await finished(
      spawnCli(['topics', 'ensure', randomName('cli-file'), '--kafka-config', wrong, '--json'], { KAFKA_BROKERS: '' }),
    );
    expect(r3.code).toBe(1);
    expect(JSON.parse(r3.stderr).error.message).toMatch(/ECONNREFUSED|Connection error/);
  });

  it('dlq list reads through the file settings', async () => {
    const [topic] = await createTopics(['cli-dlq'], { partitions: 1 });
    const file = configFile('dlq.json', { brokers: inject('kafkaBrokers') });
    const r = await finished(
      spawnCli(['dlq', 'list', topic!, '--kafka-config', file, '--json', '--timeout-ms', '10000'], {
        KAFKA_BROKERS: '',
      }),
    );
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual([]);
  });
});

describe('--json errors', () => {
  it('an invalid Kafka setting: {"error":{code,message,field}} on stderr, nothing on stdout, exit 1', async () => {
    const file = configFile('locked.json', { producer: { acks: 1 } });
    const r = await finished(spawnCli(['dlq', 'list', 'x.dlq', '--kafka-config', file, '--json']));
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    const { error } = JSON.parse(r.stderr) as { error: { code: string; message: string; field: string } };
    expect(error.code).toBe('OUTBOXKIT_INVALID_OPTIONS');
    expect(error.field).toBe(`producer.acks in ${file}`);
    expect(error.message).toMatch(/cannot be changed/);
  });

  it('a database error and a usage error are JSON too', async () => {
    const db = await finished(
      spawnCli(['status', '--json', '--database-url', 'postgres://postgres@127.0.0.1:1/postgres']),
    );
    expect(db.code).toBe(1);
    expect(JSON.parse(db.stderr)).toEqual({ error: { code: 'ECONNREFUSED', message: expect.any(String) } });
    const usage = await finished(spawnCli(['parked', 'list', '--json', '--limit', 'many']));
    expect(usage.code).toBe(1);
    expect(JSON.parse(usage.stderr).error.code).toBe('commander.invalidArgument');
  });

  it('without --json the error stays one plain line', async () => {
    const r = await finished(spawnCli(['status', '--database-url', 'postgres://postgres@127.0.0.1:1/postgres']));
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^outboxkit: connect ECONNREFUSED/);
  });
});
