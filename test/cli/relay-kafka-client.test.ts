/**
 * `outboxkit relay --kafka-client platformatic`: the daemon publishes on @platformatic/kafka with
 * the same Kafka settings, says which client it runs on, and drains on SIGTERM. An unknown name is
 * a usage error.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { enqueue, withPgTransaction } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, readTopic } from '../helpers/kafka.js';
import { spawnCli, spawnRelay } from '../helpers/processes.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

describe('outboxkit relay --kafka-client', () => {
  it('platformatic: publishes through @platformatic/kafka and drains on SIGTERM', async () => {
    const [topic] = await createTopics(['cli-platformatic']);
    await withPgTransaction(db.pool, (c) =>
      enqueue(c, { topic: topic!, key: 'k', type: 't', payload: { via: 'cli' } }),
    );
    const relay = spawnRelay(db.url, { OUTBOXKIT_KAFKA_CLIENT: 'kafkajs' }, [
      '--kafka-client',
      'platformatic',
      '--log-level',
      'info',
    ]);
    const got = await readTopic(
      topic!,
      (m) => m.value!.toString(),
      (all) => all.length >= 1,
    );
    expect(got).toEqual(['{"via":"cli"}']);
    relay.proc.kill('SIGTERM');
    const exit = await relay.exited;
    const output = relay.output.join('');
    expect(exit, output.slice(-2000)).toEqual({ code: 0, signal: null });
    // The flag beats the environment variable; the version is the loaded package's.
    expect(output).toMatch(/"kafkaClient":"@platformatic\/kafka [12]\.\d+\.\d+"/);
  });

  it('refuses a client it does not know', async () => {
    const cli = spawnCli(['relay', '--database-url', db.url, '--kafka-client', 'rdkafka']);
    const exit = await cli.exited;
    expect(exit.code).not.toBe(0);
    expect(cli.output.join('')).toContain("argument 'rdkafka' is invalid. Allowed choices are kafkajs, platformatic");
  });
});
