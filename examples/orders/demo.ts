/**
 * `npm run demo`: the whole pipeline on the real PostgreSQL and the real Kafka broker, under a
 * faulty load, then a report and PASS or FAIL.
 *
 *   orders service (HTTP, idempotency keys, outbox)  →  relay daemon  →  Kafka  →  shipping (dedup consumer)
 *
 * Each run uses a database and topics of its own (created here, dropped at the end unless
 * `--keep`), so it can run against any DATABASE_URL / KAFKA_BROKERS with the right to create them.
 *
 * `--source wal` runs it in WAL mode (docs/wal-source.md): the orders service writes with
 * `createOutbox({ source: 'wal' })` and the relays are `outboxkit relay --source wal`, on the
 * PostgreSQL at wal_level=logical (WAL_DATABASE_URL, else 127.0.0.1:5433). The relays share one
 * replication slot: one reads it under the slot's lease, the others stand by.
 */
import { randomBytes } from 'node:crypto';
import { Command, InvalidArgumentError, Option } from 'commander';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { ensureServices } from '../../scripts/services.js';
import { migrate } from '../../src/migrate.js';
import { ensureDemoSchema } from './db.js';
import { runLoad, type LoadStats } from './loadgen.js';
import {
  SCRIPTS,
  createRunDatabase,
  dropRelaySlot,
  slotReader,
  startChild,
  stopChild,
  waitUntil,
  type Child,
} from './processes.js';
import { ensureTopics } from '../../src/kafka/index.js';
import { OUTBOX_SOURCES, type OutboxSource } from '../../src/outbox/enqueue.js';

function int(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError('Expected a positive integer.');
  return n;
}

interface DemoOptions {
  source: OutboxSource;
  orders: number;
  concurrency: number;
  relays: number;
  keep: boolean;
  drainTimeoutMs: number;
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

/**
 * In WAL mode: what the WAL relays did (the relay that held the slot's lease when the load began
 * and at the end), for the report; undefined in table mode.
 */
interface WalRun {
  relays: string[];
  readerAtStart: string | null;
  readerAtEnd: string | null;
}

/** The WAL relays' line of the report: who read the slot, who stood by. */
function walRelaysLine(wal: WalRun): string {
  const { relays, readerAtStart: start, readerAtEnd: end } = wal;
  const reader =
    start === end ? `${start ?? 'none'} read the slot` : `${start ?? 'none'} then ${end ?? 'none'} read the slot`;
  const standbys = relays.filter((r) => r !== start && r !== end);
  return standbys.length === 0 ? reader : `${reader}; ${standbys.join(', ')} stood by (one reader per slot)`;
}

async function report(
  pool: pg.Pool,
  load: LoadStats,
  duplicatesAbsorbed: number | undefined,
  wal: WalRun | undefined,
): Promise<boolean> {
  const one = async (text: string) => Number((await pool.query<{ n: string }>(text)).rows[0]!.n);
  const orders = await one('SELECT count(*) AS n FROM orders_demo.orders');
  const shipments = await one('SELECT count(*) AS n FROM orders_demo.shipments');
  // The WAL relay deletes each row once Kafka acknowledged its event (it marks nothing): each
  // committed order wrote one event in its transaction, so the rows left are the unpublished ones.
  const rowsLeft = await one('SELECT count(*) AS n FROM outboxkit.outbox_events');
  const published =
    wal === undefined
      ? await one('SELECT count(*) AS n FROM outboxkit.outbox_events WHERE published_at IS NOT NULL')
      : orders - rowsLeft;
  const events = wal === undefined ? rowsLeft : orders;
  const orphanShipments = await one(
    'SELECT count(*) AS n FROM orders_demo.shipments s LEFT JOIN orders_demo.orders o ON o.id = s.order_id WHERE o.id IS NULL',
  );
  // In WAL mode a published event's row is gone: its shipment shows it existed.
  const ordersWithoutEvent = await one(
    `SELECT count(*) AS n FROM orders_demo.orders o
      WHERE NOT EXISTS (SELECT 1 FROM outboxkit.outbox_events e WHERE e.aggregate_id = o.id::text)${
        wal === undefined
          ? ''
          : '\n        AND NOT EXISTS (SELECT 1 FROM orders_demo.shipments s WHERE s.order_id = o.id)'
      }`,
  );
  const stuckKeys = await one(`SELECT count(*) AS n FROM outboxkit.idempotency_keys WHERE state = 'processing'`);
  const latencies = (
    await pool.query<{ ms: number }>(
      `SELECT extract(epoch FROM s.created_at - o.created_at) * 1000 AS ms
         FROM orders_demo.shipments s JOIN orders_demo.orders o ON o.id = s.order_id ORDER BY 1`,
    )
  ).rows.map((r) => Number(r.ms));
  const accepted = load.accepted.size;
  const acceptedIds = new Set(load.accepted.values());

  const rows: [string, string | number][] = [
    ...(wal === undefined
      ? []
      : ([
          ['source', `wal (${wal.relays.length} WAL relays on one replication slot)`],
          ['  relays', walRelaysLine(wal)],
        ] as [string, string][])),
    ['requests sent', load.requests],
    ['  created (201)', load.created],
    ['  replayed (201, Idempotent-Replayed)', load.replays],
    ['  in progress (409)', load.conflicts409],
    ['  key reused with another body (422)', load.mismatches422],
    ['  aborted by the client before the answer', load.aborted],
    ['  other errors', load.otherErrors],
    ['accepted keys', accepted],
    ['unique orders', orders],
    [wal === undefined ? 'events published' : 'events published (rows deleted)', `${published} of ${events}`],
    ['duplicates absorbed by the consumer', duplicatesAbsorbed ?? 'n/a'],
    ['shipments', shipments],
    ['commit → shipment p50', `${percentile(latencies, 50).toFixed(1)} ms`],
    ['commit → shipment p99', `${percentile(latencies, 99).toFixed(1)} ms`],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  console.log('\n── outboxkit demo report ──────────────────────────────');
  for (const [k, v] of rows) console.log(`${k.padEnd(width)}  ${v}`);

  const checks: [string, boolean][] = [
    ['shipments = orders = accepted keys', shipments === orders && orders === accepted],
    [
      'every accepted order id exists',
      (await one(
        `SELECT count(*) AS n FROM orders_demo.orders WHERE id = ANY('{${[...acceptedIds].join(',')}}'::uuid[])`,
      )) === acceptedIds.size,
    ],
    ['no shipment without its order', orphanShipments === 0],
    ['no order without its event', ordersWithoutEvent === 0],
    ['every event published', published === events],
    ['no idempotency record left processing', stuckKeys === 0],
    ['client saw no contract violation', load.violations.length === 0],
  ];
  console.log('');
  for (const [name, ok] of checks) console.log(`${ok ? 'ok  ' : 'FAIL'}  ${name}`);
  for (const v of load.violations.slice(0, 10)) console.log(`      ${v}`);
  const pass = checks.every(([, ok]) => ok);
  console.log(pass ? 'PASS' : 'FAIL');
  return pass;
}

async function main(): Promise<void> {
  const opts = new Command('demo')
    .description('Run the orders pipeline under a faulty load and check its invariants.')
    .addOption(
      new Option('--source <source>', "the outbox's source: table (the table relay) or wal (the WAL relay)")
        .choices(OUTBOX_SOURCES)
        .default('table'),
    )
    .option('--orders <n>', 'logical orders to send', int, 2_000)
    .option('--concurrency <n>', 'concurrent clients', int, 32)
    .option('--relays <n>', 'relay instances', int, 2)
    .option('--drain-timeout-ms <ms>', 'how long to wait for the pipeline to drain', int, 120_000)
    .option('--keep', 'keep the database and topics after the run', false)
    .parse()
    .opts<DemoOptions>();

  const log = (m: string) => console.log(`[demo] ${m}`);
  const services = await ensureServices(log);
  const runId = randomBytes(4).toString('hex');
  const wal = opts.source === 'wal';
  if (wal && services.walDatabaseError !== undefined) throw new Error(services.walDatabaseError);
  const database = await createRunDatabase(
    wal ? services.walDatabaseUrl : services.databaseUrl,
    `outboxkit_demo_${runId}`,
  );
  const databaseUrl = database.url;
  const topic = `demo.orders.${runId}`;
  // A slot of the run's own: slot names are unique in the whole PostgreSQL cluster, and another
  // run (or another application) may use the default `outboxkit_relay`.
  const slot = `outboxkit_demo_${runId}`;
  const kafka = new Kafka({ clientId: 'outboxkit-demo', brokers: services.kafkaBrokers, logLevel: logLevel.NOTHING });
  const kadmin = kafka.admin();
  await kadmin.connect();
  const children: Child[] = [];
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
  let pass = false;
  const relayIds = Array.from({ length: opts.relays }, (_, i) => `relay-${i + 1}`);
  let readerAtStart: string | null = null;
  try {
    // WAL mode: the publication of the outbox's inserts too (the relays create their slot).
    await migrate({ connectionString: databaseUrl, walPublication: wal });
    await ensureDemoSchema(pool);
    await ensureTopics(
      kafka,
      [topic, `${topic}.dlq`].map((t) => ({ topic: t, numPartitions: 3, replicationFactor: 1 })),
    );
    log(`database ${database.name}, topic ${topic}`);

    const env = {
      DATABASE_URL: databaseUrl,
      KAFKA_BROKERS: services.kafkaBrokers.join(','),
      ORDERS_TOPIC: topic,
      SHIPPING_GROUP: `shipping-${runId}`,
      OUTBOXKIT_LOG_LEVEL: 'warn',
      OUTBOXKIT_METRICS_PORT: '-1',
      ORDERS_OUTBOX_SOURCE: opts.source,
      ...(wal ? { OUTBOXKIT_WAL_SLOT: slot } : {}),
      PORT: '0',
    };
    const server = startChild('orders', SCRIPTS.orders, [], env);
    children.push(server);
    for (const id of relayIds) {
      const args = wal ? ['relay', '--source', 'wal', '--relay-id', id] : ['relay'];
      children.push(startChild(id, SCRIPTS.cli, args, env));
    }
    const shipping = startChild('shipping', SCRIPTS.shipping, [], env);
    children.push(shipping);

    let baseUrl = '';
    await waitUntil(
      'the orders service',
      async () => {
        const line = server.lines.find((l) => l.includes('ORDERS_LISTENING '));
        if (line) baseUrl = line.split('ORDERS_LISTENING ')[1]!.trim();
        return baseUrl !== '';
      },
      60_000,
      () => children,
    );
    await waitUntil(
      'the shipping consumer',
      async () => shipping.lines.some((l) => l.includes('SHIPPING_READY')),
      60_000,
      () => children,
    );
    if (wal) {
      await waitUntil(
        'a WAL relay reading the slot',
        async () => (readerAtStart = await slotReader(pool, slot)) !== null,
        60_000,
        () => children,
      );
    }
    log(
      `orders service at ${baseUrl}; sending ${opts.orders} orders with ${opts.concurrency} clients and ${opts.relays} ${wal ? 'WAL ' : ''}relay(s)`,
    );

    const started = Date.now();
    const load = await runLoad({
      baseUrl,
      orders: opts.orders,
      concurrency: opts.concurrency,
      tenants: ['tenant-a', 'tenant-b', 'tenant-c'],
      abortRate: 0.1,
      duplicateRate: 0.05,
      reuseRate: 0.02,
      deadlineMs: 60_000,
    });
    log(`load done in ${((Date.now() - started) / 1000).toFixed(1)} s; waiting for the pipeline to drain`);
    await waitUntil(
      'the pipeline to drain',
      async () => {
        const r = await pool.query<{ pending: string; orders: string; shipments: string }>(
          `SELECT (SELECT count(*) FROM outboxkit.outbox_events WHERE published_at IS NULL) AS pending,
                (SELECT count(*) FROM orders_demo.orders) AS orders,
                (SELECT count(*) FROM orders_demo.shipments) AS shipments`,
        );
        const row = r.rows[0]!;
        return row.pending === '0' && row.orders === row.shipments;
      },
      opts.drainTimeoutMs,
      () => children,
    ).catch((err: Error) => log(err.message));

    const walRun = wal ? { relays: relayIds, readerAtStart, readerAtEnd: await slotReader(pool, slot) } : undefined;
    await stopChild(shipping);
    const stats = shipping.lines.find((l) => l.startsWith('SHIPPING_STATS '));
    const duplicates = stats
      ? (JSON.parse(stats.slice('SHIPPING_STATS '.length)) as { duplicates: number }).duplicates
      : undefined;
    pass = await report(pool, load, duplicates, walRun);
  } finally {
    await Promise.all(children.map((c) => stopChild(c)));
    // A replication slot keeps WAL, and its database from being dropped, until it is dropped.
    if (wal && !opts.keep)
      await dropRelaySlot(pool, slot).catch((err: Error) => log(`the slot was not dropped: ${err.message}`));
    if (wal && opts.keep)
      log(`kept the slot too: drop it with outboxkit wal drop-slot --wal-slot ${slot} --database-url ${databaseUrl}`);
    await pool.end();
    if (!opts.keep) {
      await kadmin.deleteTopics({ topics: [topic, `${topic}.dlq`] }).catch(() => undefined);
      await database.drop();
    }
    await kadmin.disconnect();
  }
  process.exitCode = pass ? 0 : 1;
}

main().catch((err: unknown) => {
  console.error(err);
  console.log('FAIL');
  process.exitCode = 1;
});
