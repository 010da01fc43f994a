import { Option, type Command } from 'commander';
import pg from 'pg';
import { pino } from 'pino';
import client from 'prom-client';
import { InvalidOptionsError } from '../../src/errors.js';
import { Relay, RELAY_DEFAULTS } from '../../relay/relay.js';
import { DEFAULT_METRICS_HOST, relayMetrics, relayReadiness, serveMetrics } from '../../relay/metrics.js';
import {
  addKafkaOptions,
  applicationName,
  bool,
  databaseOption,
  int,
  kafkaFromOptions,
  lifetime,
  listenAddress,
  listenPort,
  schemaOption,
} from '../shared.js';
import { printableJson } from '../printable.js';

/**
 * A SIGTERM/SIGINT within this many ms of the first is a repeat of it (a wrapper such as npm
 * forwarding the terminal's signal), not the operator's second signal that forces exit.
 */
const REPEATED_SIGNAL_MS = 1_000;

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
        /\b(batchSize|maxBatchBytes|pollIntervalMs|leaseMs|brokerTimeoutMs|maxAttempts|publishedRetentionMs|relayId|schema)\b(?: \(flag --[a-z-]+\))?/g,
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
    .addOption(schemaOption());
  addKafkaOptions(command, { producer: true, clientId: 'outboxkit-relay' })
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
    .action(async (opts: Record<string, string | number | boolean | undefined>) => {
      // Log lines carry text from outside (Kafka errors, topics, event types): JSON escapes the C0
      // controls, printableJson the rest a terminal would act on.
      const logger = pino({
        name: 'outboxkit-relay',
        level: String(opts.logLevel),
        hooks: { streamWrite: printableJson },
      });
      // Resolved (and validated) before anything connects; warnings and the redacted settings are logged.
      const { client: kafkaClient, resolved } = kafkaFromOptions(opts, {
        clientId: 'outboxkit-relay',
        logger,
        logLevel: 'warn',
      });
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
            logger,
          }),
      );
      logger.info({ kafka: resolved.description }, 'Kafka connection settings');
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
      // one forces exit. A repeat within REPEATED_SIGNAL_MS of the first is the same request, not a
      // second one: Ctrl-C under `npm run` reaches the relay twice within milliseconds (from the
      // terminal to the whole process group, then forwarded by npm). An unref'd watchdog forces
      // exit if draining hangs.
      let firstSignalAt: number | undefined;
      const onSignal = (signal: string) => {
        if (firstSignalAt !== undefined) {
          if (Date.now() - firstSignalAt < REPEATED_SIGNAL_MS) {
            logger.debug({ signal }, 'signal repeated at once (a wrapper forwarding it): still draining');
            return;
          }
          logger.warn({ signal }, 'second signal: exiting now');
          process.exit(130);
        }
        firstSignalAt = Date.now();
        logger.info({ signal }, 'draining');
        setTimeout(() => process.exit(1), 35_000).unref();
        void relay.stop({ timeoutMs: 30_000 }).then(async () => {
          await pool.end();
          process.exit(0);
        });
      };
      process.on('SIGTERM', onSignal);
      process.on('SIGINT', onSignal);
      lifetime.daemon = true;
      await relay.start();
    });
}
