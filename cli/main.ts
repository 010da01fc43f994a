/**
 * The `outboxkit` command line: migrations, the relay daemon, and operator commands.
 * Every option reads: flag > environment variable > default (listed in `--help`).
 */
import { Command, InvalidArgumentError, Option } from 'commander';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { pino } from 'pino';
import client from 'prom-client';
import { migrate } from '../src/migrate.js';
import { isOutboxkitError } from '../src/errors.js';
import { quoteSchema } from '../src/schema-name.js';
import { Relay, RELAY_DEFAULTS } from '../relay/relay.js';
import { relayMetrics, serveMetrics } from '../relay/metrics.js';
import { backlog, laneOwners, listParked, releaseOwner, retryParked, skipParked } from '../relay/sql.js';

const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/postgres';
const DEFAULT_BROKERS = '127.0.0.1:9092';

function int(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n)) throw new InvalidArgumentError('Not an integer.');
  return n;
}

function bool(value: string): boolean {
  if (/^(1|true|yes|on)$/i.test(value)) return true;
  if (/^(0|false|no|off)$/i.test(value)) return false;
  throw new InvalidArgumentError('Expected true or false.');
}

const databaseOption = () =>
  new Option('--database-url <url>', 'PostgreSQL connection string (session mode)')
    .env('DATABASE_URL')
    .default(DEFAULT_DATABASE_URL);
const schemaOption = () =>
  new Option('--schema <name>', "schema of outboxkit's tables").env('OUTBOXKIT_SCHEMA').default('outboxkit');
const brokersOption = () =>
  new Option('--brokers <list>', 'Kafka brokers, comma-separated host:port')
    .env('KAFKA_BROKERS')
    .default(DEFAULT_BROKERS);

async function withPool(url: string, fn: (pool: pg.Pool) => Promise<void>): Promise<void> {
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  try {
    await fn(pool);
  } finally {
    await pool.end();
  }
}

function q(pool: pg.Pool) {
  return {
    query: async <R>(text: string, values?: readonly unknown[]) => {
      const r = await pool.query(text, values as unknown[]);
      return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
    },
  };
}

const program = new Command('outboxkit')
  .description('Safe retries across PostgreSQL and Apache Kafka: outbox relay, migrations and operator commands.')
  .showHelpAfterError();

program
  .command('migrate')
  .description("create or upgrade outboxkit's tables (safe to run from several processes at once)")
  .addOption(databaseOption())
  .addOption(schemaOption())
  .action(async (opts: { databaseUrl: string; schema: string }) => {
    const logger = pino({ name: 'outboxkit' });
    const { applied } = await migrate({ connectionString: opts.databaseUrl, schema: opts.schema, logger });
    logger.info({ applied }, applied.length ? 'migrations applied' : 'schema is up to date');
  });

program
  .command('relay')
  .description('run the relay daemon: publish committed outbox events to Kafka')
  .addOption(databaseOption())
  .addOption(schemaOption())
  .addOption(brokersOption())
  .addOption(new Option('--client-id <id>', 'Kafka client id').env('OUTBOXKIT_CLIENT_ID').default('outboxkit-relay'))
  .addOption(new Option('--relay-id <id>', 'this instance id (default: host-pid-random)').env('OUTBOXKIT_RELAY_ID'))
  .addOption(
    new Option('--batch-size <rows>', 'most rows per pass')
      .env('OUTBOXKIT_BATCH_SIZE')
      .argParser(int)
      .default(RELAY_DEFAULTS.batchSize),
  )
  .addOption(
    new Option('--max-batch-bytes <bytes>', 'most payload bytes per pass')
      .env('OUTBOXKIT_MAX_BATCH_BYTES')
      .argParser(int)
      .default(RELAY_DEFAULTS.maxBatchBytes),
  )
  .addOption(
    new Option('--poll-interval-ms <ms>', 'poll interval without notifications')
      .env('OUTBOXKIT_POLL_INTERVAL_MS')
      .argParser(int)
      .default(RELAY_DEFAULTS.pollIntervalMs),
  )
  .addOption(
    new Option('--lease-ms <ms>', 'lane lease length')
      .env('OUTBOXKIT_LEASE_MS')
      .argParser(int)
      .default(RELAY_DEFAULTS.leaseMs),
  )
  .addOption(
    new Option('--max-attempts <n>', 'failed publish attempts of one event before it is parked')
      .env('OUTBOXKIT_MAX_ATTEMPTS')
      .argParser(int)
      .default(RELAY_DEFAULTS.maxAttempts),
  )
  .addOption(
    new Option('--hold-key-behind-failure <bool>', 'later events of a key wait behind a failed one (strict order)')
      .env('OUTBOXKIT_HOLD_KEY_BEHIND_FAILURE')
      .argParser(bool)
      .default(true),
  )
  .addOption(
    new Option('--published-retention-ms <ms>', 'how long published rows are kept')
      .env('OUTBOXKIT_PUBLISHED_RETENTION_MS')
      .argParser(int)
      .default(RELAY_DEFAULTS.publishedRetentionMs),
  )
  .addOption(new Option('--listen <bool>', 'wake on NOTIFY').env('OUTBOXKIT_LISTEN').argParser(bool).default(true))
  .addOption(
    new Option('--metrics-port <port>', 'port of /metrics, /healthz, /readyz (0: random, -1: off)')
      .env('OUTBOXKIT_METRICS_PORT')
      .argParser(int)
      .default(9464),
  )
  .addOption(new Option('--log-level <level>', 'pino log level').env('OUTBOXKIT_LOG_LEVEL').default('info'))
  .action(async (opts: Record<string, string | number | boolean | undefined>) => {
    const logger = pino({ name: 'outboxkit-relay', level: String(opts.logLevel) });
    const pool = new pg.Pool({ connectionString: String(opts.databaseUrl), max: 4, keepAlive: true });
    const kafka = new Kafka({
      clientId: String(opts.clientId),
      brokers: String(opts.brokers)
        .split(',')
        .map((b) => b.trim())
        .filter(Boolean),
      logLevel: logLevel.WARN,
    });
    const relay = new Relay({
      pool,
      kafka,
      schema: String(opts.schema),
      relayId: opts.relayId === undefined ? undefined : String(opts.relayId),
      batchSize: Number(opts.batchSize),
      maxBatchBytes: Number(opts.maxBatchBytes),
      pollIntervalMs: Number(opts.pollIntervalMs),
      leaseMs: Number(opts.leaseMs),
      listen: Boolean(opts.listen),
      maxAttempts: Number(opts.maxAttempts),
      holdKeyBehindFailure: Boolean(opts.holdKeyBehindFailure),
      publishedRetentionMs: Number(opts.publishedRetentionMs),
      logger,
    });
    const registry = new client.Registry();
    client.collectDefaultMetrics({ register: registry });
    relayMetrics(relay, pool, registry);
    const port = Number(opts.metricsPort);
    if (port >= 0) {
      const server = await serveMetrics(registry, port, async () => {
        await pool.query('SELECT 1');
        return true;
      });
      const address = server.address();
      logger.info(
        { port: typeof address === 'object' && address ? address.port : port },
        'metrics and health endpoints listening',
      );
    }
    // First SIGTERM/SIGINT drains (the pass in flight finishes, lanes are released); a second
    // one forces exit. An unref'd watchdog forces exit if draining hangs.
    let signals = 0;
    const onSignal = (signal: string) => {
      signals++;
      if (signals > 1) {
        logger.warn({ signal }, 'second signal: exiting now');
        process.exit(130);
      }
      logger.info({ signal }, 'draining');
      setTimeout(() => process.exit(1), 35_000).unref();
      void relay.stop({ timeoutMs: 30_000 }).then(async () => {
        await pool.end();
        process.exit(0);
      });
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    await relay.start();
  });

program
  .command('status')
  .description('print the backlog, parked events and lane owners')
  .addOption(databaseOption())
  .addOption(schemaOption())
  .option('--json', 'print JSON')
  .action(async (opts: { databaseUrl: string; schema: string; json?: boolean }) => {
    await withPool(opts.databaseUrl, async (pool) => {
      const schema = quoteSchema(opts.schema);
      const status = { backlog: await backlog(q(pool), schema), lanes: await laneOwners(q(pool), schema) };
      if (opts.json) {
        console.log(JSON.stringify(status, null, 2));
      } else {
        console.log(
          `pending: ${status.backlog.pending}  parked: ${status.backlog.parked}  oldest pending: ${Math.round(status.backlog.oldestPendingMs)} ms`,
        );
        for (const l of status.lanes)
          console.log(
            `  ${l.owner_id ?? '(free)'}: ${l.lanes} lanes${l.owner_id && !l.live ? ' (lease expired)' : ''}`,
          );
      }
    });
  });

const lanes = program.command('lanes').description('relay lane operations');
lanes
  .command('release')
  .description('free every lane of a relay (for example a dead one) so live relays take them at once')
  .argument('<relay-id>', 'the owner shown by `outboxkit status`')
  .addOption(databaseOption())
  .addOption(schemaOption())
  .action(async (relayId: string, opts: { databaseUrl: string; schema: string }) => {
    await withPool(opts.databaseUrl, async (pool) => {
      const n = await releaseOwner(q(pool), quoteSchema(opts.schema), relayId);
      console.log(`released ${n} lanes of ${relayId}`);
    });
  });

const parked = program.command('parked').description('events the relay parked after repeated failures');
parked
  .command('list')
  .description('list parked events with their error and attempts')
  .addOption(databaseOption())
  .addOption(schemaOption())
  .option('--limit <n>', 'most rows', int, 100)
  .option('--json', 'print JSON')
  .action(async (opts: { databaseUrl: string; schema: string; limit: number; json?: boolean }) => {
    await withPool(opts.databaseUrl, async (pool) => {
      const rows = await listParked(q(pool), quoteSchema(opts.schema), opts.limit);
      if (opts.json) return console.log(JSON.stringify(rows, null, 2));
      if (rows.length === 0) return console.log('no parked events');
      for (const r of rows) {
        console.log(
          `${r.event_id}  ${r.topic}  key=${r.key ?? '-'}  ${r.type}  ${r.bytes} B  attempts=${r.attempts}  parked ${r.parked_at.toISOString()}\n    ${r.last_error ?? ''}`,
        );
      }
    });
  });
parked
  .command('retry')
  .description('put parked events back in line (attempts reset)')
  .argument('[event-ids...]', 'event ids (or --all)')
  .option('--all', 'every parked event')
  .addOption(databaseOption())
  .addOption(schemaOption())
  .action(async (ids: string[], opts: { databaseUrl: string; schema: string; all?: boolean }) => {
    if (!opts.all && ids.length === 0) throw new InvalidArgumentError('Give event ids or --all.');
    await withPool(opts.databaseUrl, async (pool) => {
      console.log(`requeued ${await retryParked(q(pool), quoteSchema(opts.schema), opts.all ? 'all' : ids)} events`);
    });
  });
parked
  .command('skip')
  .description('give up on parked events (marked published without being sent), so their keys go on')
  .argument('<event-ids...>', 'event ids')
  .addOption(databaseOption())
  .addOption(schemaOption())
  .action(async (ids: string[], opts: { databaseUrl: string; schema: string }) => {
    await withPool(opts.databaseUrl, async (pool) => {
      console.log(`skipped ${await skipParked(q(pool), quoteSchema(opts.schema), ids)} events`);
    });
  });

const topics = program.command('topics').description('Kafka topic operations');
topics
  .command('ensure')
  .description('create the given topics if they do not exist')
  .argument('<topics...>', 'topic names')
  .addOption(brokersOption())
  .addOption(new Option('--partitions <n>', 'partitions of new topics').argParser(int).default(3))
  .addOption(new Option('--replication-factor <n>', 'replication factor of new topics').argParser(int).default(1))
  .action(async (names: string[], opts: { brokers: string; partitions: number; replicationFactor: number }) => {
    const kafka = new Kafka({
      clientId: 'outboxkit-cli',
      brokers: opts.brokers.split(','),
      logLevel: logLevel.NOTHING,
    });
    const admin = kafka.admin();
    await admin.connect();
    try {
      const existing = new Set(await admin.listTopics());
      const missing = names.filter((t) => !existing.has(t));
      if (missing.length > 0) {
        await admin.createTopics({
          waitForLeaders: true,
          topics: missing.map((topic) => ({
            topic,
            numPartitions: opts.partitions,
            replicationFactor: opts.replicationFactor,
          })),
        });
      }
      console.log(missing.length ? `created: ${missing.join(', ')}` : 'all topics exist');
    } finally {
      await admin.disconnect();
    }
  });

/** Runs the CLI with `argv` (process.argv by default). */
export async function main(argv: string[] = process.argv): Promise<void> {
  try {
    await program.parseAsync(argv);
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    const hint = code === '42P01' ? " (outboxkit's tables are missing: run `outboxkit migrate`)" : '';
    const message = isOutboxkitError(err)
      ? `${err.code}: ${err.message}`
      : `${(err as Error).message ?? String(err)}${hint}`;
    console.error(`outboxkit: ${message}`);
    process.exitCode = 1;
  }
}

// Run when executed directly (tsx cli/main.ts, or bin/outboxkit.js importing the build).
if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  void main();
}
