/**
 * A `pg.Pool` without an 'error' listener of its own: when PostgreSQL terminates one of its idle
 * connections (pg_terminate_backend, a failover, an idle timeout on a proxy), the pool emits
 * 'error', and an 'error' event nobody listens to is thrown and kills the process. The dedup
 * consumer must never let that happen to the application: the test runs the consumer in a real
 * child process (fixtures/crash-consumer.ts, whose pool deliberately has no listener), terminates
 * the pool's idle connections while it runs, and checks that the process lives on and applies
 * later messages on new connections.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { randomName } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import {
  type ChildConsumer,
  committedAtLogEnd,
  ConsumerRegistry,
  createTopicsWithDlq,
  startChildConsumer,
  TestProducer,
} from './support.js';

describe('a pg.Pool without an error listener: terminated idle connections do not crash the consumer', () => {
  let db: TestDatabase;
  let admin: pg.Client;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  let child: ChildConsumer | undefined;

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL)');
    admin = new pg.Client({ connectionString: inject('databaseUrl') });
    await admin.connect();
  });
  afterEach(async () => {
    if (child?.alive()) {
      child.proc.kill('SIGKILL');
      await child.exited;
    }
    await consumers.stopAll();
  });
  afterAll(async () => {
    await admin?.end();
    await producer.close();
    await db?.drop();
  });

  /** Backend pids of the child's pool connections, by state. */
  async function childBackends(applicationName: string): Promise<{ pid: number; state: string }[]> {
    const { rows } = await admin.query<{ pid: number; state: string }>(
      'SELECT pid, state FROM pg_stat_activity WHERE application_name = $1',
      [applicationName],
    );
    return rows;
  }

  async function effectCount(ids: string[]): Promise<number> {
    const { rows } = await db.pool.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM effects WHERE event_id = ANY($1::uuid[])',
      [ids],
    );
    return rows[0]!.n;
  }

  it('survives pg_terminate_backend of its idle connections and applies the next messages', async () => {
    const [topic] = await createTopicsWithDlq(['pool-idle'], 1);
    const groupId = randomName('group');
    const applicationName = `outboxkit-idle-${randomBytes(4).toString('hex')}`;
    child = await startChildConsumer({
      TEST_DATABASE_URL: db.url,
      KAFKA_BROKERS: inject('kafkaBrokers').join(','),
      TEST_TOPIC: topic!,
      TEST_GROUP_ID: groupId,
      TEST_APPLICATION_NAME: applicationName,
    });
    const running = child;

    // Some work first, so the pool holds connections; then they sit idle in it.
    const first = (await producer.send(
      topic!,
      Array.from({ length: 3 }, (_, i) => ({ partition: 0, value: { i } })),
    )) as string[];
    await waitFor(() => running.committed().length === 3, { message: 'the first three events applied' });
    const idle = await waitFor(
      async () => {
        const backends = await childBackends(applicationName);
        return backends.length > 0 && backends.every((b) => b.state === 'idle') ? backends : undefined;
      },
      { message: "the child's pool connections are idle" },
    );

    // PostgreSQL ends them: each idle client gets a FATAL (57P01) and the pool emits 'error'.
    const { rows } = await admin.query<{ terminated: boolean }>(
      'SELECT pg_terminate_backend(pid) AS terminated FROM unnest($1::int[]) AS pid',
      [idle.map((b) => b.pid)],
    );
    expect(rows.filter((r) => r.terminated).length).toBeGreaterThan(0);
    await waitFor(
      async () => {
        const pids = new Set((await childBackends(applicationName)).map((b) => b.pid));
        return idle.every((b) => !pids.has(b.pid));
      },
      { message: 'the terminated backends are gone' },
    );

    // The process lives on: the next events are applied on new connections.
    const next = (await producer.send(
      topic!,
      Array.from({ length: 3 }, (_, i) => ({ partition: 0, value: { i: 3 + i } })),
    )) as string[];
    await waitFor(() => running.committed().length === 6 || !running.alive(), {
      timeoutMs: 20_000,
      message: 'the next three events applied',
    });
    expect(running.alive(), `the child consumer died: ${running.stderr()}`).toBe(true);
    expect(running.stderr()).not.toMatch(/Unhandled 'error' event|terminating connection/);
    expect(running.committed().map((c) => c.outcome)).toEqual(Array(6).fill('applied'));
    expect(await effectCount(first)).toBe(3);
    expect(await effectCount(next)).toBe(3);
    await waitFor(() => committedAtLogEnd(consumers.kafka, groupId, topic!), {
      timeoutMs: 20_000,
      message: 'offsets at the log end',
    });
    expect(running.alive()).toBe(true);
  });
});
