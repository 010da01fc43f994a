/**
 * A broker outage, noticed within a lease: on a private broker killed (SIGKILL) or frozen
 * (SIGSTOP: its connections stay open and nothing answers, like a host cut off the network), a
 * relay with the daemon's default settings (lease 10 s, brokerTimeoutMs 5 s, the CLI's Kafka
 * client settings) reports not ready on /readyz and `outboxkit_relay_producer_connected 0` within
 * brokerTimeoutMs, stands down (releases its lanes) a lease into the outage, and publishes
 * everything, keys in order, once the broker is back. Before brokerTimeoutMs, a frozen broker kept
 * the relay ready for minutes (kafkajs waits 30 s per request and retries), an idle relay stayed
 * ready until it had something to send, and a killed broker freed the lanes only 14-25 s in (a
 * lease after kafkajs reported the first failure, at the next maintenance tick).
 */
import type { Server } from 'node:http';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import client from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { relayMetrics, relayReadiness, serveMetrics } from '../../relay/metrics.js';
import { freePortBlock, startScratchBroker, type ScratchBroker } from '../../scripts/services.js';
import { enqueue, HEADER_EVENT_ID, resolveKafkaConfig, withPgTransaction } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopicsOn, randomName } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
let broker: ScratchBroker;
// A port per Kafka line, away from broker-restart.test.ts's.
// Its broker's port and controller port: a free pair, from a base of this file's own.
const PORT = await freePortBlock(2, 19_300 + Number(process.pid % 50) * 2);
const servers: Server[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
  broker = await startScratchBroker(PORT);
}, 120_000);
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
  // A frozen broker must not stay frozen for the next test.
  if (broker) {
    try {
      process.kill(broker.pid, 'SIGCONT');
    } catch {
      // not running
    }
  }
});
afterAll(async () => {
  await broker?.destroy();
  await db?.drop();
});

/** The daemon's Kafka client: the CLI's defaults (kafkaFromOptions), on the scratch broker. */
function daemonKafka(): { kafka: Kafka; producerOptions: ReturnType<typeof resolveKafkaConfig>['producer'] } {
  const resolved = resolveKafkaConfig({
    flags: { brokers: broker.brokers.join(',') },
    env: {},
    defaults: { clientId: 'outboxkit-relay' },
  });
  return {
    kafka: new Kafka({ ...resolved.kafkaConfig, logLevel: logLevel.NOTHING }),
    producerOptions: resolved.producer,
  };
}

async function pending(): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL',
  );
  return rows[0]!.n;
}

async function published(topic: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE topic = $1 AND published_at IS NOT NULL',
    [topic],
  );
  return rows[0]!.n;
}

async function lanesOf(owner: string): Promise<number> {
  const { rows } = await db.pool.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM outboxkit.relay_lanes WHERE owner_id = $1 AND lease_expires_at > now()',
    [owner],
  );
  return rows[0]!.n;
}

/**
 * Runs a relay (daemon defaults) with its /readyz and /metrics served, writes a trickle of events
 * (unless `idle`), takes the broker down with `outage`, and checks when the relay notices.
 */
async function outage(options: { outage: 'kill' | 'freeze'; idle: boolean }) {
  const topic = randomName('outage');
  const { kafka, producerOptions } = daemonKafka();
  await createTopicsOn(kafka, [{ topic, numPartitions: 3 }], { retries: 20 });
  const relayId = randomName('outage-relay');
  const relay = await startRelay(db.url, {
    kafka,
    producerOptions,
    relayId,
    leaseMs: 10_000,
    brokerTimeoutMs: 5_000,
    pollIntervalMs: 1_000,
  });
  const pool = new pg.Pool({ connectionString: db.url, max: 2 });
  const registry = new client.Registry();
  relayMetrics(relay, pool, registry);
  const server = await serveMetrics(registry, 0, relayReadiness(relay, pool));
  servers.push(server);
  const base = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  const readyz = async () => (await fetch(`${base}/readyz`)).status;
  const producerConnected = async () =>
    /outboxkit_relay_producer_connected 1\n/.test(await (await fetch(`${base}/metrics`)).text());

  const expected = new Map<string, string[]>();
  let i = 0;
  const write = async () => {
    const key = `k${i % 5}`;
    const [e] = await withPgTransaction(db.pool, (c) => enqueue(c, { topic, key, type: 't', payload: i++ }));
    expected.set(key, [...(expected.get(key) ?? []), e!.eventId]);
  };
  // The first write completes before the trickle starts: two writes of one key in flight at once
  // commit in an order their callers cannot tell (each sees its own COMMIT reply, in any order), so
  // `expected` is only the commit order when the writes of a key are serial.
  await write();
  let writing = !options.idle;
  const writer = (async () => {
    while (writing) {
      await write();
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  try {
    await waitFor(async () => (await published(topic)) >= 1 + (options.idle ? 0 : 10), {
      timeoutMs: 30_000,
      message: 'the relay publishes',
    });
    expect(await readyz()).toBe(200);
    expect(await producerConnected()).toBe(true);
    expect(await lanesOf(relayId)).toBe(64);
    // An idle relay: the broker has not answered it for a while before the outage begins.
    if (options.idle) await new Promise((r) => setTimeout(r, 4_000));

    const downAt = Date.now();
    if (options.outage === 'kill') await broker.kill('SIGKILL');
    else process.kill(broker.pid, 'SIGSTOP');
    let standingDownAt = 0;
    relay.once('relay:standing-down', () => (standingDownAt = Date.now()));

    await waitFor(async () => (await readyz()) === 503 && !(await producerConnected()), {
      timeoutMs: 30_000,
      intervalMs: 100,
      message: 'the relay reports the outage',
    });
    const notReadyMs = Date.now() - downAt;
    await waitFor(async () => standingDownAt > 0 && (await lanesOf(relayId)) === 0, {
      timeoutMs: 40_000,
      intervalMs: 100,
      message: 'the relay stands down',
    });
    const lanesFreeMs = Date.now() - downAt;
    console.info(
      `outage (${options.outage}, ${options.idle ? 'idle' : 'busy'}): not ready after ${notReadyMs} ms, ` +
        `standing down after ${standingDownAt - downAt} ms, lanes free after ${lanesFreeMs} ms`,
    );
    // brokerTimeoutMs (5 s), plus a probe tick (a third of a lease) for an idle relay.
    expect(notReadyMs).toBeLessThan(options.idle ? 10_000 : 7_000);
    // A lease from the first send (or probe, every third of a lease) that got no answer. Before,
    // a lease from the first failure kafkajs reported, plus up to a third of a lease: 14-25 s.
    expect(lanesFreeMs).toBeLessThan(options.idle ? 16_000 : 13_000);

    if (options.outage === 'kill') await broker.restart();
    else process.kill(broker.pid, 'SIGCONT');
    writing = false;
    await writer;
    await write(); // after the broker is back
    await waitFor(async () => (await pending()) === 0, { timeoutMs: 60_000, message: 'the backlog drains' });
    await waitFor(async () => (await readyz()) === 200 && (await producerConnected()), { timeoutMs: 20_000 });
    await waitFor(async () => (await lanesOf(relayId)) === 64, { timeoutMs: 20_000, message: 'the relay rejoins' });

    // At least once, and the first occurrences of each key in commit order.
    const consumer = kafka.consumer({ groupId: randomName('outage-reader') });
    const seen: { key: string; id: string }[] = [];
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      eachMessage: async ({ message }) => {
        seen.push({ key: message.key!.toString(), id: message.headers![HEADER_EVENT_ID]!.toString() });
      },
    });
    await waitFor(() => new Set(seen.map((s) => s.id)).size >= i, { timeoutMs: 60_000 });
    await consumer.disconnect();
    for (const [key, ids] of expected) {
      const firsts: string[] = [];
      for (const s of seen) if (s.key === key && !firsts.includes(s.id)) firsts.push(s.id);
      expect(firsts, key).toEqual(ids);
    }
  } finally {
    writing = false;
    await writer;
    await relay.stopAndForget();
    await pool.end();
  }
}

describe('broker outage', () => {
  it('killed mid-stream (SIGKILL): not ready within brokerTimeoutMs, lanes released about a lease in, clean recovery', async () => {
    await outage({ outage: 'kill', idle: false });
  }, 180_000);

  it('frozen mid-stream (SIGSTOP, no answer on open connections): the same', async () => {
    await outage({ outage: 'freeze', idle: false });
  }, 180_000);

  it('idle relay, broker frozen: a probe notices it without a send', async () => {
    await outage({ outage: 'freeze', idle: true });
  }, 180_000);
});
