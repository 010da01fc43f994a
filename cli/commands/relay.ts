import { Option, type Command } from 'commander';
import pg from 'pg';
import { pino } from 'pino';
import client from 'prom-client';
import { InvalidOptionsError } from '../../src/errors.js';
import { WAL_SLOT_READER_DEFAULTS } from '../../relay/wal/defaults.js';
import { Relay, RELAY_DEFAULTS } from '../../relay/relay.js';
import { DEFAULT_METRICS_HOST, relayMetrics, relayReadiness, serveMetrics } from '../../relay/metrics.js';
import {
  addKafkaOptions,
  applicationName,
  bool,
  chosenKafkaClient,
  databaseOption,
  drainOnSignals,
  int,
  kafkaClientOption,
  kafkaFromOptions,
  lifetime,
  listenAddress,
  listenPort,
  replicationName,
  schemaOption,
  withSchemaHint,
} from '../shared.js';
import { printableJson } from '../printable.js';

/** Where the relay reads the outbox from (`--source`). */
export const RELAY_SOURCES = ['table', 'wal'] as const;

/**
 * Options (commander attribute names) of the table relay alone: refused with `--source wal`. The
 * retention flags (`--published-retention-ms`, `--cleanup-rows-per-second`) serve both sources.
 */
const TABLE_ONLY = ['pollIntervalMs', 'leaseMs', 'maxAttempts', 'listen'] as const;

/** Options of the WAL relay alone: refused with `--source table`. */
const WAL_ONLY = ['walSlot', 'walPublication', 'walStatusIntervalMs', 'walLeaseMs'] as const;

/**
 * Refuses the options of the other source that were given (by flag or environment variable):
 * they would be ignored, silently.
 *
 * @throws {@link InvalidOptionsError} naming each such flag (and its variable, when set there).
 */
function refuseOtherSourceOptions(command: Command, source: (typeof RELAY_SOURCES)[number]): void {
  const other = source === 'wal' ? TABLE_ONLY : WAL_ONLY;
  const given: string[] = [];
  for (const name of other) {
    const from = command.getOptionValueSource(name);
    if (from !== 'cli' && from !== 'env') continue;
    const option = command.options.find((o) => o.attributeName() === name)!;
    given.push(from === 'env' ? `${option.long} (set by ${option.envVar})` : option.long!);
  }
  if (given.length === 0) return;
  const otherSource = source === 'wal' ? 'table' : 'wal';
  throw new InvalidOptionsError(
    `${given.join(', ')} ${given.length === 1 ? 'applies' : 'apply'} only to --source ${otherSource}, ` +
      `not to --source ${source}: remove ${given.length === 1 ? 'it' : 'them'}.`,
  );
}

/**
 * Builds the relay, its options checked before anything connects or is logged; an invalid one is
 * named by its flag (`--batch-size`), not by its option name (`batchSize`).
 *
 * @throws {@link InvalidOptionsError} as the relay's validation says, with flag names.
 */
function relayOrFlagError(pool: pg.Pool, build: () => Relay): Relay {
  try {
    return build();
  } catch (err) {
    void pool.end();
    if (!(err instanceof InvalidOptionsError)) throw err;
    // The operator gave flags, not createRelay()'s options: named by flag, without the function
    // (a rule between options names each as `leaseMs (flag --lease-ms)`: the flag alone here).
    const flagged = err.message
      .replace(/^createRelay: /, '')
      .replace(
        /\b(batchSize|maxBatchBytes|pollIntervalMs|leaseMs|brokerTimeoutMs|maxAttempts|publishedRetentionMs|cleanupRowsPerSecond|relayId|schema)\b(?: \(flag --[a-z-]+\))?/g,
        (_match, name: string) => `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`,
      );
    throw new InvalidOptionsError(flagged, { cause: err });
  }
}

/** `outboxkit relay`: the relay daemon. */
export function registerRelay(program: Command): void {
  const command = program
    .command('relay')
    .description('run the relay daemon: publish committed outbox events to Kafka')
    .addOption(databaseOption())
    .addOption(schemaOption())
    .addOption(
      new Option(
        '--source <source>',
        'where the outbox is read: table (lanes and leases), or wal (a logical replication slot; docs/wal-source.md)',
      )
        .choices(RELAY_SOURCES)
        .env('OUTBOXKIT_RELAY_SOURCE')
        .default('table'),
    )
    .addOption(
      new Option(
        '--wal-slot <name>',
        'with --source wal: the replication slot, created if missing (default: <schema>_relay; unique per cluster)',
      )
        .env('OUTBOXKIT_WAL_SLOT')
        .argParser(replicationName('slot')),
    )
    .addOption(
      new Option(
        '--wal-publication <name>',
        "with --source wal: the publication of the outbox's inserts, created if missing (default: <schema>_outbox_events)",
      )
        .env('OUTBOXKIT_WAL_PUBLICATION')
        .argParser(replicationName('publication')),
    )
    .addOption(
      new Option(
        '--wal-status-interval-ms <ms>',
        "with --source wal: the replication connection's status update interval (well below wal_sender_timeout)",
      )
        .env('OUTBOXKIT_WAL_STATUS_INTERVAL_MS')
        .argParser(int)
        .default(WAL_SLOT_READER_DEFAULTS.statusIntervalMs),
    )
    .addOption(
      new Option(
        '--wal-lease-ms <ms>',
        "with --source wal: the slot's reader lease (database clock); standbys take over a relay that has not renewed it for this long",
      )
        .env('OUTBOXKIT_WAL_LEASE_MS')
        .argParser(int)
        .default(RELAY_DEFAULTS.leaseMs),
    );
  addKafkaOptions(command, { producer: true, clientId: 'outboxkit-relay' })
    .addOption(kafkaClientOption())
    .addOption(
      new Option('--relay-id <id>', 'this instance id: lanes and slot lease owner (default: host-pid-random)').env(
        'OUTBOXKIT_RELAY_ID',
      ),
    )
    .addOption(
      new Option('--batch-size <rows>', 'most rows per pass (--source wal: most events per send)')
        .env('OUTBOXKIT_BATCH_SIZE')
        .argParser(int)
        .default(RELAY_DEFAULTS.batchSize),
    )
    .addOption(
      new Option('--max-batch-bytes <bytes>', 'most payload bytes per pass (--source wal: per send)')
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
      new Option('--lease-ms <ms>', 'lane lease length (above --broker-timeout-ms)')
        .env('OUTBOXKIT_LEASE_MS')
        .argParser(int)
        .default(RELAY_DEFAULTS.leaseMs),
    )
    .addOption(
      new Option(
        '--broker-timeout-ms <ms>',
        'longest wait for a send, a producer connect or a probe of Kafka (below --lease-ms)',
      )
        .env('OUTBOXKIT_BROKER_TIMEOUT_MS')
        .argParser(int)
        .default(RELAY_DEFAULTS.brokerTimeoutMs),
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
    .addOption(
      new Option(
        '--cleanup-rows-per-second <n>',
        'pace of the retention cleanup: published rows deleted per second at most (0: unpaced)',
      )
        .env('OUTBOXKIT_CLEANUP_ROWS_PER_SECOND')
        .argParser(int)
        .default(RELAY_DEFAULTS.cleanupRowsPerSecond),
    )
    .addOption(new Option('--listen <bool>', 'wake on NOTIFY').env('OUTBOXKIT_LISTEN').argParser(bool).default(true))
    .addOption(
      new Option('--metrics-port <port>', 'port of /metrics, /healthz, /readyz (0: random, -1: off)')
        .env('OUTBOXKIT_METRICS_PORT')
        .argParser(listenPort)
        .default(9464),
    )
    .addOption(
      new Option(
        '--metrics-host <address>',
        'IP address of /metrics, /healthz, /readyz (0.0.0.0 or :: for every interface, as in a container)',
      )
        .env('OUTBOXKIT_METRICS_HOST')
        .argParser(listenAddress)
        .default(DEFAULT_METRICS_HOST),
    )
    .addOption(
      // pino's levels: any other value would make pino() throw at start-up instead of a usage error.
      new Option('--log-level <level>', 'pino log level')
        .choices(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'])
        .env('OUTBOXKIT_LOG_LEVEL')
        .default('info'),
    )
    .action(async (opts: Record<string, string | number | boolean | undefined>, self: Command) => {
      const source = opts.source === 'wal' ? 'wal' : 'table';
      // Before anything is logged or connects: a flag of the other source would be ignored.
      refuseOtherSourceOptions(self, source);
      // Log lines carry text from outside (Kafka errors, topics, event types): JSON escapes the C0
      // controls, printableJson the rest a terminal would act on.
      const logger = pino({
        name: 'outboxkit-relay',
        level: String(opts.logLevel),
        hooks: { streamWrite: printableJson },
      });
      // Resolved (and validated) before anything connects; warnings and the redacted settings are logged.
      const { client: kafkajsClient, resolved } = kafkaFromOptions(opts, {
        clientId: 'outboxkit-relay',
        logger,
        logLevel: 'warn',
      });
      // The same settings (brokers, TLS, SASL, timeouts) on the chosen library. A missing or
      // unsupported @platformatic/kafka is a setup error: reported before anything connects.
      const { client: kafkaClient, library } = await chosenKafkaClient(opts, kafkajsClient, resolved);
      if (source === 'wal') {
        // Loaded only for this source: the table relay never loads the replication client.
        const { runWalRelay } = await import('./relay-wal.js');
        await runWalRelay({ opts, logger, kafka: kafkaClient, resolved, library });
        return;
      }
      const pool = new pg.Pool({
        connectionString: String(opts.databaseUrl),
        max: 4,
        keepAlive: true,
        // Named in pg_stat_activity unless the URL or PGAPPNAME names it; the LISTEN connection,
        // built from these options, is named outboxkit-relay-listener by the relay.
        fallback_application_name: applicationName('relay'),
      });
      const relay = relayOrFlagError(
        pool,
        () =>
          new Relay({
            pool,
            kafka: kafkaClient,
            producerOptions: resolved.producer,
            schema: String(opts.schema),
            relayId: opts.relayId === undefined ? undefined : String(opts.relayId),
            batchSize: Number(opts.batchSize),
            maxBatchBytes: Number(opts.maxBatchBytes),
            pollIntervalMs: Number(opts.pollIntervalMs),
            leaseMs: Number(opts.leaseMs),
            brokerTimeoutMs: Number(opts.brokerTimeoutMs),
            listen: Boolean(opts.listen),
            maxAttempts: Number(opts.maxAttempts),
            holdKeyBehindFailure: Boolean(opts.holdKeyBehindFailure),
            publishedRetentionMs: Number(opts.publishedRetentionMs),
            cleanupRowsPerSecond: Number(opts.cleanupRowsPerSecond),
            logger,
          }),
      );
      logger.info({ kafka: resolved.description, kafkaClient: library }, 'Kafka connection settings');
      const registry = new client.Registry();
      client.collectDefaultMetrics({ register: registry });
      relayMetrics(relay, pool, registry);
      const port = Number(opts.metricsPort);
      if (port >= 0) {
        const server = await serveMetrics(registry, port, relayReadiness(relay, pool), {
          host: String(opts.metricsHost),
        });
        const address = server.address();
        logger.info(
          typeof address === 'object' && address ? { host: address.address, port: address.port } : { port },
          'metrics and health endpoints listening',
        );
      }
      // First SIGTERM/SIGINT drains (the pass in flight finishes, lanes are released); a second
      // one forces exit. An unref'd watchdog forces exit if draining hangs.
      drainOnSignals(logger, async () => {
        await relay.stop({ timeoutMs: 30_000 });
        await pool.end();
      });
      lifetime.daemon = true;
      // A role that may not use the schema: the grants it needs, not a bare 42501.
      await relay.start().catch((err: unknown) => {
        throw withSchemaHint(err, String(opts.schema));
      });
    });
}
