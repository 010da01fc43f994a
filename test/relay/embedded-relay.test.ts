/**
 * examples/embedded-relay.ts: a relay started and stopped inside the test process on the
 * application's own pool, against the real PostgreSQL and broker.
 */
import { Writable } from 'node:stream';
import { pino } from 'pino';
import client from 'prom-client';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { startEmbeddedRelay } from '../../examples/embedded-relay.js';
import { laneOwners } from '../../relay/index.js';
import { enqueue } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, readTopic } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

describe('embedded relay (examples/embedded-relay.ts)', () => {
  it('starts on the application pool, publishes, reports ready and metrics, and stops cleanly leaving the pool open', async () => {
    const [topic] = await createTopics(['embedded']);
    const lines: string[] = [];
    const logger = pino(
      { level: 'debug' },
      new Writable({
        write(chunk: Buffer, _enc, done) {
          lines.push(chunk.toString());
          done();
        },
      }),
    );
    const registry = new client.Registry();
    const embedded = await startEmbeddedRelay({
      pool: db.pool,
      registry,
      logger,
      env: { KAFKA_BROKERS: inject('kafkaBrokers').join(','), KAFKA_CLIENT_ID: 'embedded-test' },
    });
    let stopped = false;
    try {
      expect(await embedded.ready()).toEqual({
        ready: true,
        database: true,
        kafka: true,
        lanes: true,
        blockedPartitions: 0,
      });
      const c = await db.pool.connect();
      try {
        await c.query('BEGIN');
        await enqueue(c, { topic: topic!, key: 'k', type: 'embedded.test', payload: { ok: true } });
        await c.query('COMMIT');
      } finally {
        c.release();
      }
      const got = await readTopic(
        topic!,
        (m) => m.value?.toString(),
        (all) => all.length >= 1,
      );
      expect(got).toEqual(['{"ok":true}']);
      await waitFor(async () => /outboxkit_relay_published_total 1\n/.test(await registry.metrics()));
      expect(lines.join('')).toContain('"clientId":"embedded-test"');

      const first = embedded.stop();
      expect(embedded.stop()).toBe(first); // idempotent, memoised
      await first;
      stopped = true;
      expect(embedded.relay.producerConnected).toBe(false);
      expect((await embedded.ready()).ready).toBe(false);
      // Lanes were released for other relays, and the application's pool is still usable.
      const owners = await laneOwners(
        {
          query: async <R>(text: string) => {
            const r = await db.pool.query(text);
            return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
          },
        },
        '"outboxkit"',
      );
      expect(owners).toEqual([{ owner_id: null, lanes: 64, live: false }]);
    } finally {
      if (!stopped) await embedded.stop();
    }
  });
});
