/**
 * The relay daemon's /readyz: ready only with a PostgreSQL connection AND a connected Kafka
 * producer AND the relay not standing down (it holds its share of the lanes or stands by),
 * checked against the real services (a broker and a database on closed ports for the not-ready
 * states). Also the metrics the ops dashboard relies on, after a real publish, and the stand-down
 * counter.
 */
import type { Server } from 'node:http';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import client from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Relay } from '../../relay/index.js';
import { relayMetrics, relayReadiness, serveMetrics } from '../../relay/metrics.js';
import { enqueue } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
const servers: Server[] = [];
beforeAll(async () => {
  db = await createTestDatabase();
});
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});
afterAll(async () => {
  await db.drop();
});

async function readyz(check: ReturnType<typeof relayReadiness>): Promise<{ status: number; body: string }> {
  const server = await serveMetrics(new client.Registry(), 0, check);
  servers.push(server);
  const port = (server.address() as { port: number }).port;
  const res = await fetch(`http://127.0.0.1:${port}/readyz`);
  return { status: res.status, body: await res.text() };
}

describe('/readyz', () => {
  it('not ready while the broker is unreachable (closed port), though PostgreSQL answers', async () => {
    const relay = new Relay({
      connectionString: db.url,
      kafka: new Kafka({
        clientId: 'readyz-closed',
        brokers: ['127.0.0.1:1'],
        logLevel: logLevel.NOTHING,
        retry: { retries: 0 },
      }),
      pollIntervalMs: 100,
      leaseMs: 2_000,
      brokerTimeoutMs: 1_500,
      retryMaxMs: 500,
    });
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    try {
      await relay.start();
      const check = relayReadiness(relay, pool);
      expect(await check()).toEqual({ ready: false, database: true, kafka: false, lanes: true, blockedPartitions: 0 });
      // Still not ready after a pass of the loop failed and tried to reconnect.
      await new Promise((resolve) => relay.once('relay:error', resolve));
      expect(relay.producerConnected).toBe(false);
      const r = await readyz(check);
      expect(r.status).toBe(503);
      expect(r.body).toBe('not ready: no connected Kafka producer\n');
    } finally {
      await relay.stop({ timeoutMs: 5_000 });
      await pool.end();
    }
  });

  it('not ready while standing down (lanes false), at every probe over two leases; the stand-down counter counts', async () => {
    const relay = new Relay({
      connectionString: db.url,
      kafka: new Kafka({
        clientId: 'readyz-standing-down',
        brokers: ['127.0.0.1:1'],
        logLevel: logLevel.NOTHING,
        retry: { retries: 0 },
      }),
      verifyTopics: false,
      pollIntervalMs: 100,
      leaseMs: 2_000,
      brokerTimeoutMs: 1_500,
      retryMaxMs: 500,
    });
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    const registry = new client.Registry();
    // Registered before start: the stand-down comes a lease after the first connect failed.
    relayMetrics(relay, pool, registry, { refreshMs: 0 });
    const standingDown = new Promise<{ failingMs: number }>((resolve) => relay.once('relay:standing-down', resolve));
    try {
      await relay.start();
      expect(relay.standingDown).toBe(false);
      const { failingMs } = await standingDown;
      expect(failingMs).toBeGreaterThan(2_000);
      expect(relay.standingDown).toBe(true);
      await waitFor(() => relay.heldLanes().length === 0);
      const check = relayReadiness(relay, pool, { refreshMs: 0 });
      expect(await check()).toEqual({ ready: false, database: true, kafka: false, lanes: false, blockedPartitions: 0 });
      expect(await readyz(check)).toEqual({
        status: 503,
        body: 'not ready: no connected Kafka producer, standing down (lanes released)\n',
      });
      // Two leases of probes while the relay keeps trying its producer at each maintenance tick:
      // every one answers 503 and names the stand-down.
      const bodies = new Set<string>();
      const until = performance.now() + 4_000;
      while (performance.now() < until) {
        const r = await readyz(check);
        bodies.add(`${r.status} ${r.body}`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect([...bodies]).toEqual(['503 not ready: no connected Kafka producer, standing down (lanes released)\n']);
      // It left the live relays (the others' fair share counts without it) and holds no lane.
      const { rows } = await db.pool.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM outboxkit.relay_instances WHERE relay_id = $1',
        [relay.relayId],
      );
      expect(rows[0]!.n).toBe(0);
      const metrics = await registry.metrics();
      expect(metrics).toMatch(/^outboxkit_relay_stand_downs_total 1$/m);
      expect(metrics).toMatch(/^outboxkit_relay_lanes_held 0$/m);
      expect(metrics).toMatch(/^outboxkit_relay_partitions_blocked 0$/m);
    } finally {
      await relay.stop({ timeoutMs: 5_000 });
      await pool.end();
    }
  }, 30_000);

  it('ready with PostgreSQL and the real broker; not ready once the database is unreachable or the relay stops', async () => {
    const relay = await startRelay(db.url);
    const pool = new pg.Pool({ connectionString: db.url, max: 1 });
    const closed = new pg.Pool({ connectionString: 'postgres://postgres@127.0.0.1:1/postgres', max: 1 });
    closed.on('error', () => {});
    try {
      const check = relayReadiness(relay, pool);
      expect(await check()).toEqual({ ready: true, database: true, kafka: true, lanes: true, blockedPartitions: 0 });
      expect(await readyz(check)).toEqual({ status: 200, body: 'ready\n' });

      const noDb = await readyz(relayReadiness(relay, closed));
      expect(noDb.status).toBe(503);
      expect(noDb.body).toBe('not ready: database unreachable\n');

      await relay.stopAndForget();
      expect(relay.producerConnected).toBe(false);
      expect((await readyz(check)).status).toBe(503);
    } finally {
      await pool.end();
      await closed.end();
    }
  });
});

describe('relay metrics', () => {
  it('publish latency, producer state and unowned lanes after a real publish', async () => {
    const [topic] = await createTopics(['readyz-metrics']);
    const c = await db.pool.connect();
    try {
      await c.query('BEGIN');
      await enqueue(c, [{ topic: topic!, key: 'a', type: 't', payload: { n: 1 } }]);
      await c.query('COMMIT');
    } finally {
      c.release();
    }
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    const registry = new client.Registry();
    const relay = await startRelay(db.url);
    try {
      // refreshMs 0: every scrape reads the database, so the stop below shows at the next one.
      relayMetrics(relay, pool, registry, { refreshMs: 0 });
      // relayMetrics subscribed after start: publish once more so a send is observed.
      const c2 = await db.pool.connect();
      await c2.query('BEGIN');
      await enqueue(c2, [{ topic: topic!, key: 'b', type: 't', payload: { n: 2 } }]);
      await c2.query('COMMIT');
      c2.release();
      const text = await waitFor(async () => {
        const t = await registry.metrics();
        // Both events published and marked, and at least one send observed.
        return (
          /outboxkit_relay_publish_duration_seconds_count [1-9]/.test(t) && /outboxkit_relay_backlog 0\n/.test(t) && t
        );
      });
      expect(text).toMatch(/outboxkit_relay_producer_connected 1\n/);
      expect(text).toMatch(/outboxkit_relay_lanes_unowned 0\n/);
      await relay.stopAndForget();
      // The stopped relay released its lanes: all 64 are unowned.
      expect(await registry.metrics()).toMatch(/outboxkit_relay_lanes_unowned 64\n/);
    } finally {
      await pool.end();
    }
  });
});
