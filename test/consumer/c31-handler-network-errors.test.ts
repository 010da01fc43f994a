/**
 * C31: a handler's own network errors (a socket reset by the service it calls, undici's connect
 * timeout) are handler failures: counted, retried with backoff, dead-lettered after maxAttempts,
 * and the partition moves on. Only a failure of the consumer's own database connection is an
 * outage (test/consumer/database-outage.test.ts).
 */
import http from 'node:http';
import net from 'node:net';
import pg from 'pg';
import { Agent, fetch } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import client from 'prom-client';
import { consumerMetrics, RetryLaterError, type DedupConsumerEvents } from '../../consumer/index.js';
import { isOutboxkitError } from '../../src/errors.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { readTopic } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { committedAtLogEnd, ConsumerRegistry, createTopicsWithDlq, record, TestProducer } from './support.js';

/** POSTs to `url` with node's http.request; resolves with the status, rejects with the socket's error. */
function post(url: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end('{}');
  });
}

describe('C31 · the handler’s own network errors', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();
  /** Answers 204, except on /reset, where it destroys the socket before answering (ECONNRESET). */
  let service: http.Server;
  let serviceUrl: string;
  /** Accepts TCP connections and never answers: a TLS handshake with it never completes. */
  let silent: net.Server;
  const silentSockets = new Set<net.Socket>();
  let silentUrl: string;
  /** undici with a 200 ms connect timeout (TCP connect and TLS handshake): UND_ERR_CONNECT_TIMEOUT. */
  const agent = new Agent({ connect: { timeout: 200 } });

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL, step text NOT NULL)');
    service = http.createServer((req, res) => {
      if (req.url === '/reset') {
        req.socket.destroy();
        return;
      }
      res.writeHead(204).end();
    });
    await new Promise<void>((resolve) => service.listen(0, '127.0.0.1', resolve));
    serviceUrl = `http://127.0.0.1:${(service.address() as net.AddressInfo).port}`;
    silent = net.createServer((socket) => {
      silentSockets.add(socket);
      socket.on('error', () => {});
      socket.on('close', () => silentSockets.delete(socket));
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    silentUrl = `https://127.0.0.1:${(silent.address() as net.AddressInfo).port}/quote`;
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await agent.close();
    for (const socket of silentSockets) socket.destroy();
    await new Promise((resolve) => silent?.close(resolve));
    service?.closeAllConnections();
    await new Promise((resolve) => service?.close(resolve));
    await producer.close();
    await db?.drop();
  });

  it('C31 ECONNRESET from http.request and UND_ERR_CONNECT_TIMEOUT from undici count as attempts: retried with backoff, dead-lettered after 4 with the error as reason; the messages behind them are applied', async () => {
    const [topic] = await createTopicsWithDlq(['c31'], 2);
    const maxAttempts = 4;
    const retryInitialMs = 50;
    const retryMaxMs = 200;
    const runs = new Map<string, number>();
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      maxAttempts,
      retryInitialMs,
      retryMaxMs,
      handler: async ({ tx, event }) => {
        const { step } = event.json() as { step: string };
        runs.set(step, (runs.get(step) ?? 0) + 1);
        if (step === 'x1') await post(`${serviceUrl}/reset`);
        else if (step === 'x2') await fetch(silentUrl, { dispatcher: agent });
        else await post(`${serviceUrl}/ok`);
        await tx.query('INSERT INTO effects (event_id, step) VALUES ($1, $2)', [event.id, step]);
      },
    });
    const seen = record(consumer);
    await consumer.start();

    const [resetId, , , timeoutId] = await producer.send(topic!, [
      { partition: 0, value: { step: 'x1' } },
      { partition: 0, value: { step: 'ok-0a' } },
      { partition: 0, value: { step: 'ok-0b' } },
      { partition: 1, value: { step: 'x2' } },
      { partition: 1, value: { step: 'ok-1a' } },
      { partition: 1, value: { step: 'ok-1b' } },
    ]);

    await waitFor(() => seen.deadLettered.length === 2 && seen.applied.length === 4, {
      timeoutMs: 60_000,
      message: 'both failing messages dead-lettered and the four behind them applied',
    });
    await waitFor(() => committedAtLogEnd(consumers.kafka, consumer.groupId, topic!), {
      message: 'offsets committed to the log end',
    });

    // Neither was taken for a database outage: every failure counted as an attempt.
    expect(seen.errors).toHaveLength(0);
    expect(runs.get('x1')).toBe(maxAttempts);
    expect(runs.get('x2')).toBe(maxAttempts);
    for (const [id, code] of [
      [resetId, 'ECONNRESET'],
      [timeoutId, 'UND_ERR_CONNECT_TIMEOUT'],
    ] as const) {
      const retries = seen.retries.filter((r) => r.event.id === id);
      // Retried with backoff: attempts 1-3 each waited a jittered delay below its exponential cap.
      expect(retries.map((r) => r.attempt)).toEqual([1, 2, 3]);
      for (const r of retries) {
        expect(r.delayMs).toBeLessThan(Math.min(retryMaxMs, retryInitialMs * 2 ** (r.attempt - 1)));
      }
      expect(JSON.stringify(causeCodes(retries[0]!.error))).toContain(code);
      const letter = seen.deadLettered.find((d) => d.eventId === id);
      expect(letter).toMatchObject({ attempts: maxAttempts });
      expect(letter!.reason).toContain(code);
    }
    expect(seen.deadLettered.find((d) => d.eventId === resetId)!.reason).toMatch(/^Error: socket hang up/);
    expect(seen.deadLettered.find((d) => d.eventId === timeoutId)!.reason).toMatch(
      /^TypeError: fetch failed; cause: ConnectTimeoutError: Connect Timeout Error/,
    );

    // The messages behind them, in their partitions, were applied after their dead letters.
    const { rows } = await db.pool.query<{ step: string }>('SELECT step FROM effects ORDER BY step');
    expect(rows.map((r) => r.step)).toEqual(['ok-0a', 'ok-0b', 'ok-1a', 'ok-1b']);
    const letters = await readTopic(
      `${topic}.dlq`,
      (m) => ({ partition: m.headers['dlq-original-partition'], attempts: m.headers['dlq-attempts'] }),
      (all) => all.length >= 2,
    );
    expect(letters.sort((a, b) => String(a.partition).localeCompare(String(b.partition)))).toEqual([
      { partition: '0', attempts: '4' },
      { partition: '1', attempts: '4' },
    ]);
  });

  it('C31 a handler’s query on another pg pool whose connection is terminated (57P01) is the handler’s failure, not an outage', async () => {
    const [topic] = await createTopicsWithDlq(['c31-other-pool'], 1);
    // The handler's own pool, to the same server: its connections are not the consumer's.
    const other = new pg.Pool({ connectionString: db.url, max: 1 });
    other.on('error', () => {});
    try {
      const consumer = consumers.create({
        topics: [topic!],
        database: db.pool,
        maxAttempts: 2,
        handler: async ({ tx, event }) => {
          const { step } = event.json() as { step: string };
          // The other pool's session ends itself: SQLSTATE 57P01 (admin_shutdown), like a failover of that database.
          if (step === 'x3') await other.query('SELECT pg_terminate_backend(pg_backend_pid())');
          await tx.query('INSERT INTO effects (event_id, step) VALUES ($1, $2)', [event.id, step]);
        },
      });
      const seen = record(consumer);
      await consumer.start();
      const [id] = await producer.send(topic!, [
        { partition: 0, value: { step: 'x3' } },
        { partition: 0, value: { step: 'after-x3' } },
      ]);
      await waitFor(() => seen.deadLettered.length === 1 && seen.applied.length === 1, {
        timeoutMs: 60_000,
        message: 'dead-lettered after 2 attempts, the next message applied',
      });
      expect(seen.errors).toHaveLength(0);
      expect(seen.retries.map((r) => r.attempt)).toEqual([1]);
      expect(seen.deadLettered[0]).toMatchObject({ eventId: id, attempts: 2 });
      expect(seen.deadLettered[0]!.reason).toMatch(/terminating connection due to administrator command \[57P01\]/);
    } finally {
      await other.end();
    }
  });
});

describe('C31 · RetryLaterError: a handler that knows its downstream is down', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();
  const producer = new TestProducer();

  beforeAll(async () => {
    db = await createTestDatabase();
    await db.pool.query('CREATE TABLE effects (event_id uuid NOT NULL, step text NOT NULL)');
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await producer.close();
    await db?.drop();
  });

  it('C31 defers without counting attempts: more deferrals than maxAttempts, then applied, nothing dead-lettered', async () => {
    const [topic] = await createTopicsWithDlq(['c31-later'], 1);
    let runs = 0;
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      maxAttempts: 2,
      handler: async ({ tx, event, attempt }) => {
        const { step } = event.json() as { step: string };
        if (step === 'x4') {
          runs += 1;
          // The downstream is back on the 7th call; before, it asks for 20 ms (a Retry-After).
          if (runs <= 6) throw new RetryLaterError(`downstream unavailable (attempt ${attempt})`, { delayMs: 20 });
        }
        await tx.query('INSERT INTO effects (event_id, step) VALUES ($1, $2)', [event.id, step]);
      },
    });
    const seen = record(consumer);
    const later: DedupConsumerEvents['consumer:retry-later'][] = [];
    consumer.on('consumer:retry-later', (e) => later.push(e));
    await consumer.start();
    const [id] = await producer.send(topic!, [
      { partition: 0, value: { step: 'x4' } },
      { partition: 0, value: { step: 'after-x4' } },
    ]);
    await waitFor(() => seen.applied.length === 2, { message: 'applied after six deferrals' });
    expect(runs).toBe(7);
    expect(seen.retries).toHaveLength(0);
    expect(seen.deadLettered).toHaveLength(0);
    expect(seen.errors).toHaveLength(0);
    expect(later.map((e) => [e.deferrals, e.counted, e.delayMs, e.attempt])).toEqual(
      [1, 2, 3, 4, 5, 6].map((n) => [n, false, 20, 1]),
    );
    expect(later.every((e) => e.event.id === id && isOutboxkitError(e.error, 'OUTBOXKIT_RETRY_LATER'))).toBe(true);
    expect(seen.applied.map((a) => [a.event.offset, a.attempt])).toEqual([
      ['0', 1],
      ['1', 1],
    ]);
  });

  it('C31 holds maxRetryLaterMs: past it, a RetryLaterError counts, the message is dead-lettered after maxAttempts and the partition moves on; metrics show both', async () => {
    const [topic] = await createTopicsWithDlq(['c31-later-bound'], 1);
    const maxRetryLaterMs = 1_500;
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      maxAttempts: 2,
      maxRetryLaterMs,
      handler: async ({ tx, event }) => {
        const { step } = event.json() as { step: string };
        if (step === 'x5') throw new RetryLaterError('downstream down', { delayMs: 200 });
        await tx.query('INSERT INTO effects (event_id, step) VALUES ($1, $2)', [event.id, step]);
      },
    });
    const registry = new client.Registry();
    const stopMetrics = consumerMetrics(consumer, registry);
    const seen = record(consumer);
    const later: (DedupConsumerEvents['consumer:retry-later'] & { at: number })[] = [];
    let deadLetteredAt = 0;
    consumer.on('consumer:retry-later', (e) => later.push({ ...e, at: performance.now() }));
    consumer.on('consumer:dead-lettered', () => (deadLetteredAt = performance.now()));
    try {
      await consumer.start();
      const [id] = await producer.send(topic!, [
        { partition: 0, value: { step: 'x5' } },
        { partition: 0, value: { step: 'after-x5' } },
      ]);
      await waitFor(() => seen.deadLettered.length === 1 && seen.applied.length === 1, {
        timeoutMs: 30_000,
        message: 'dead-lettered after the bound, the next message applied',
      });
      const deferred = later.filter((e) => !e.counted);
      const counted = later.filter((e) => e.counted);
      // Deferred for the whole bound (200 ms each, at least until the next fetch), never longer.
      expect(deferred.length).toBeGreaterThanOrEqual(1);
      for (const e of deferred) expect(e.delayMs).toBeLessThanOrEqual(200);
      expect(deadLetteredAt - later[0]!.at).toBeGreaterThanOrEqual(maxRetryLaterMs - 50);
      // Then counted like any error: attempt 1 (a retry), attempt 2 (dead-lettered).
      expect(counted.map((e) => e.attempt)).toEqual([1, 2]);
      for (const e of counted) expect(e.deferredMs).toBeGreaterThanOrEqual(maxRetryLaterMs);
      expect(seen.retries.map((r) => r.attempt)).toEqual([1]);
      expect(seen.deadLettered[0]).toMatchObject({
        eventId: id,
        attempts: 2,
        reason: 'RetryLaterError: downstream down',
      });
      expect(seen.applied[0]!.event.offset).toBe('1');
      const text = await registry.metrics();
      expect(text).toContain(
        `outboxkit_consumer_retry_later_total{group="${consumer.groupId}",topic="${topic}"} ${deferred.length}`,
      );
      expect(text).toContain(
        `outboxkit_consumer_retry_later_exhausted_total{group="${consumer.groupId}",topic="${topic}"} 2`,
      );
    } finally {
      stopMetrics();
    }
  });
});

/** The `code` of each error along a `cause` chain. */
function causeCodes(err: unknown): unknown[] {
  const codes: unknown[] = [];
  for (let e = err, depth = 0; typeof e === 'object' && e !== null && depth < 8; depth++) {
    codes.push((e as { code?: unknown }).code);
    e = (e as { cause?: unknown }).cause;
  }
  return codes;
}
