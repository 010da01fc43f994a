/**
 * What every `outboxkit` command shares: option builders (flag > env > default), parsers, and a
 * short-lived pool for operator commands.
 */
import { isIP } from 'node:net';
import { InvalidArgumentError, Option, type Command } from 'commander';
import pg from 'pg';
import { validate as uuidValidate } from 'uuid';
import type { Queryable } from '../src/database.js';
import { InvalidOptionsError, isOutboxkitError, permissionDeniedOr, schemaMissingOr } from '../src/errors.js';
import { KAFKA_CONFIG_DEFAULTS, resolveKafkaConfig, type ResolvedKafkaConfig } from '../src/kafka/config.js';
import { createKafkajsClient, type KafkajsLogLevel } from '../src/kafka/kafkajs/client.js';
import { createPlatformaticClient } from '../src/kafka/platformatic/client.js';
import { loadPlatformaticKafka, readPackage } from '../src/kafka/platformatic/load.js';
import { KAFKA_CLIENT_NAMES } from '../relay/options.js';
import type { KafkaClient } from '../src/kafka/types.js';
import type { Logger } from '../src/logger.js';
import { KAFKA_TOPIC_NAME } from '../src/outbox/event.js';
import { checkReplicationName } from '../src/wal-publication.js';
import { printError } from './printable.js';

/**
 * Whether the command that ran is a daemon (`relay`): it returns from its action once started and
 * lives on, so the exit watchdog of `runCli` (cli/main.ts) must not end it.
 */
export const lifetime = { daemon: false };

export const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/postgres';

export function int(value: string): number {
  // Decimal digits only: Number() reads '' and ' ' as 0 (an empty variable of a deployment
  // template would silently become 0: no pacing, the shortest retention) and '0x10' as 16.
  if (!/^\s*[-+]?\d+\s*$/.test(value)) throw new InvalidArgumentError('Not an integer.');
  const n = Number(value);
  if (!Number.isSafeInteger(n)) throw new InvalidArgumentError(`Out of range: at most ${Number.MAX_SAFE_INTEGER}.`);
  return n;
}

/** An integer of 1 or more (partitions, limits). */
export function positiveInt(value: string): number {
  const n = int(value);
  if (n < 1) throw new InvalidArgumentError('Must be an integer of 1 or more.');
  return n;
}

/** A TCP port to listen on: 1-65535, 0 for a random free port, -1 for none. */
export function listenPort(value: string): number {
  const n = int(value);
  if (n < -1 || n > 65_535) {
    throw new InvalidArgumentError('Must be a port from 1 to 65535, 0 for a random port, or -1 for none.');
  }
  return n;
}

/** An IP address to listen on (IPv4 or IPv6; no host name, which would need a lookup). */
export function listenAddress(value: string): string {
  if (isIP(value) === 0) throw new InvalidArgumentError('Must be an IP address such as 127.0.0.1, 0.0.0.0 or ::.');
  return value;
}

/**
 * Collects a variadic argument of event ids (UUIDs, RFC 9562), so that a typo is a usage error
 * rather than PostgreSQL's "invalid input syntax for type uuid".
 */
export function eventIdList(value: string, previous: string[] | undefined): string[] {
  if (!uuidValidate(value))
    throw new InvalidArgumentError('Not an event id (a UUID such as 0190d9a5-7e6b-7c1a-9f0e-3b5a1c2d4e6f).');
  return [...(previous ?? []), value];
}

/**
 * Collects a variadic argument of Kafka topic names: 1-249 of `[a-zA-Z0-9._-]`, not `.` or `..`
 * (Kafka's rule, org.apache.kafka.common.internals.Topic).
 */
export function topicNameList(value: string, previous: string[] | undefined): string[] {
  if (!KAFKA_TOPIC_NAME.test(value) || value === '.' || value === '..') {
    throw new InvalidArgumentError(
      "Not a legal Kafka topic name: 1-249 letters, digits, '.', '_' or '-' (not '.' or '..').",
    );
  }
  return [...(previous ?? []), value];
}

/** A replication slot or publication name (`[a-z_][a-z0-9_]{0,62}`), as a usage error. */
export function replicationName(what: 'slot' | 'publication') {
  return (value: string): string => {
    try {
      return checkReplicationName(value, what);
    } catch (err) {
      throw new InvalidArgumentError((err as Error).message);
    }
  };
}

export function bool(value: string): boolean {
  if (/^(1|true|yes|on)$/i.test(value)) return true;
  if (/^(0|false|no|off)$/i.test(value)) return false;
  throw new InvalidArgumentError('Expected true or false.');
}

const DATABASE_URL_EXPECTED = 'Expected a PostgreSQL URL such as postgres://user@host:5432/db.';

/**
 * Checks a PostgreSQL connection string before anything connects: a `postgres://` or
 * `postgresql://` URL, or a Unix socket directory (`/var/run/postgresql [database]`, which pg
 * accepts too). Otherwise pg would read "notaurl" as a path under the host "base" (getaddrinfo
 * ENOTFOUND base), and a bad port would fail with a bare "Invalid URL".
 *
 * commander repeats a bad value in its usage error, so a value that may hold a password (a `@`,
 * or `password` in a query) is refused by an {@link InvalidOptionsError} that does not show it.
 * Commander applies this parser to the DATABASE_URL value too, not to the default.
 */
export function databaseUrl(value: string): string {
  if (value.startsWith('/')) return value;
  if (/^postgres(ql)?:\/\//i.test(value)) {
    // pg also accepts a URL without a host but with a user (`postgres://user@/db?host=/run/pg`),
    // which it parses with a placeholder host: so does this check.
    for (const candidate of [value, value.replace('@/', '@localhost/')]) {
      try {
        new URL(candidate);
        return value;
      } catch {
        // not a URL: refused below
      }
    }
  }
  if (value.includes('@') || /password/i.test(value)) {
    // The parser is not told where the value came from: the flag wins over the env var, so a value
    // equal to DATABASE_URL's is (or is the same as) the env var's.
    const fromEnv = process.env.DATABASE_URL === value;
    const source = fromEnv ? "value from env 'DATABASE_URL'" : "option '--database-url <url>' argument";
    throw Object.assign(
      new InvalidOptionsError(`${source} is invalid (not shown: it may hold a password). ${DATABASE_URL_EXPECTED}`),
      { field: fromEnv ? 'DATABASE_URL' : '--database-url' },
    );
  }
  throw new InvalidArgumentError(DATABASE_URL_EXPECTED);
}

export const databaseOption = () =>
  new Option('--database-url <url>', 'PostgreSQL connection string (session mode)')
    .env('DATABASE_URL')
    .argParser(databaseUrl)
    .default(DEFAULT_DATABASE_URL);
export const schemaOption = () =>
  new Option('--schema <name>', "schema of outboxkit's tables").env('OUTBOXKIT_SCHEMA').default('outboxkit');

/**
 * Adds the Kafka connection options (docs/kafka.md) to `cmd`. They carry no commander default or
 * env binding: {@link kafkaFromOptions} resolves flag > environment > `--kafka-config` file >
 * default per setting, which commander alone cannot do (its defaults would hide the file).
 *
 * @param options.producer - also add the relay's producer settings.
 */
export function addKafkaOptions(cmd: Command, options: { producer?: boolean; clientId?: string } = {}): Command {
  const d = KAFKA_CONFIG_DEFAULTS;
  const opt = (flags: string, description: string, env?: string) =>
    cmd.addOption(new Option(flags, env ? `${description} [env: ${env}]` : description));
  opt(
    '--brokers <list>',
    `Kafka brokers, comma-separated host:port (default: ${d.brokers.join(',')})`,
    'KAFKA_BROKERS',
  );
  opt('--client-id <id>', `Kafka client id (default: ${options.clientId ?? 'outboxkit-cli'})`, 'KAFKA_CLIENT_ID');
  opt('--kafka-config <file>', 'JSON file of Kafka settings, below flags and env (docs/kafka.md)', 'KAFKA_CONFIG_FILE');
  opt('--kafka-ssl', 'connect with TLS (implied by any --kafka-ssl-* file)', 'KAFKA_SSL');
  opt('--no-kafka-ssl', 'connect without TLS');
  opt('--kafka-ssl-ca-file <file>', 'PEM file of the CA certificates to trust', 'KAFKA_SSL_CA_FILE');
  opt('--kafka-ssl-cert-file <file>', 'PEM client certificate (mutual TLS)', 'KAFKA_SSL_CERT_FILE');
  opt('--kafka-ssl-key-file <file>', 'PEM private key of the client certificate', 'KAFKA_SSL_KEY_FILE');
  opt('--kafka-ssl-key-password-file <file>', 'file holding the private key passphrase', 'KAFKA_SSL_KEY_PASSWORD_FILE');
  opt(
    '--kafka-ssl-reject-unauthorized <bool>',
    "verify the brokers' certificates (default: true)",
    'KAFKA_SSL_REJECT_UNAUTHORIZED',
  );
  opt('--kafka-ssl-servername <name>', 'TLS server name (SNI) to verify', 'KAFKA_SSL_SERVERNAME');
  opt('--kafka-sasl-mechanism <name>', 'SASL mechanism: plain, scram-sha-256, scram-sha-512', 'KAFKA_SASL_MECHANISM');
  opt('--kafka-sasl-username <name>', 'SASL username', 'KAFKA_SASL_USERNAME');
  opt('--kafka-sasl-password-file <file>', 'file holding the SASL password (preferred)', 'KAFKA_SASL_PASSWORD_FILE');
  opt(
    '--kafka-sasl-password <password>',
    'SASL password (discouraged: visible in ps; use the file or the env var)',
    'KAFKA_SASL_PASSWORD',
  );
  opt(
    '--kafka-connection-timeout-ms <ms>',
    `TCP/TLS connect timeout (default: ${d.connectionTimeoutMs})`,
    'KAFKA_CONNECTION_TIMEOUT_MS',
  );
  opt(
    '--kafka-authentication-timeout-ms <ms>',
    `SASL authentication timeout (default: ${d.authenticationTimeoutMs})`,
    'KAFKA_AUTHENTICATION_TIMEOUT_MS',
  );
  opt(
    '--kafka-request-timeout-ms <ms>',
    `request timeout (default: ${d.requestTimeoutMs})`,
    'KAFKA_REQUEST_TIMEOUT_MS',
  );
  opt('--kafka-retries <n>', `client retries (default: ${d.retries})`, 'KAFKA_RETRIES');
  opt('--kafka-retry-initial-ms <ms>', `first retry delay (default: ${d.retryInitialMs})`, 'KAFKA_RETRY_INITIAL_MS');
  opt('--kafka-retry-max-ms <ms>', `largest retry delay (default: ${d.retryMaxMs})`, 'KAFKA_RETRY_MAX_MS');
  if (options.producer) {
    opt(
      '--producer-compression <codec>',
      'record batch compression: none, gzip (default: none)',
      'KAFKA_PRODUCER_COMPRESSION',
    );
    opt(
      '--producer-request-timeout-ms <ms>',
      `broker acknowledgement timeout of one send (default: ${d.producerRequestTimeoutMs})`,
      'KAFKA_PRODUCER_REQUEST_TIMEOUT_MS',
    );
    opt('--producer-retries <n>', `retries inside one send (default: ${d.producerRetries})`, 'KAFKA_PRODUCER_RETRIES');
    opt(
      '--producer-metadata-max-age-ms <ms>',
      `refresh of the topics' partitions, so new ones get events (default: ${d.producerMetadataMaxAgeMs})`,
      'KAFKA_PRODUCER_METADATA_MAX_AGE_MS',
    );
  }
  return cmd;
}

/**
 * `--kafka-client <name>` / `OUTBOXKIT_KAFKA_CLIENT`: the Kafka client library a command runs on,
 * `kafkajs` (the default) or `platformatic` (@platformatic/kafka, an optional peer dependency;
 * docs/kafka.md, "Choosing a client"). Another name is a usage error. Read by
 * {@link chosenKafkaClient}.
 */
export const kafkaClientOption = () =>
  new Option(
    '--kafka-client <name>',
    'Kafka client library: kafkajs, or platformatic (@platformatic/kafka, installed separately; docs/kafka.md)',
  )
    .choices(KAFKA_CLIENT_NAMES)
    .env('OUTBOXKIT_KAFKA_CLIENT')
    .default('kafkajs');

/**
 * The Kafka client that `--kafka-client` ({@link kafkaClientOption}) chose, with the settings
 * `resolved` (brokers, TLS, SASL, timeouts: the same on either library), and the library's name as
 * logged (`kafkajs`, `@platformatic/kafka 1.35.0`). `kafkajs` is the client {@link kafkaFromOptions}
 * made.
 *
 * @throws KafkaClientUnavailableError when `platformatic` is chosen and @platformatic/kafka is not
 *   installed, of an unsupported version, or needs a newer Node.js: before anything connects.
 */
export async function chosenKafkaClient(
  opts: Record<string, unknown>,
  kafkajs: KafkaClient,
  resolved: ResolvedKafkaConfig,
): Promise<{ client: KafkaClient; library: string }> {
  if (opts.kafkaClient !== 'platformatic') return { client: kafkajs, library: 'kafkajs' };
  await loadPlatformaticKafka();
  return {
    client: createPlatformaticClient(resolved.kafkaConfig),
    library: `@platformatic/kafka ${readPackage().version}`,
  };
}

/**
 * A Kafka client (kafkajs, through `createKafkajsClient()`) from the options
 * {@link addKafkaOptions} added, resolved by `resolveKafkaConfig()` (flag > env > file > default).
 * Warnings (password given as a flag, PLAIN without TLS, verification off) go to `logger`, or to
 * stderr; so do kafkajs's own log entries at `logLevel` and above, with a `logger`.
 *
 * @throws InvalidKafkaConfigError naming the flag, variable or file key at fault.
 */
export function kafkaFromOptions(
  opts: Record<string, unknown>,
  options: { clientId: string; logger?: Logger; logLevel?: KafkajsLogLevel },
): { client: KafkaClient; resolved: ResolvedKafkaConfig } {
  const resolved = resolveKafkaConfig({
    flags: opts as Record<string, string | boolean | undefined>,
    defaults: { clientId: options.clientId },
  });
  for (const warning of resolved.warnings) {
    if (options.logger) options.logger.warn({}, warning);
    else printError(`outboxkit: warning: ${warning}`);
  }
  const client = createKafkajsClient(resolved.kafkaConfig, {
    logLevel: options.logLevel ?? 'nothing',
    ...(options.logger ? { logger: options.logger } : {}),
  });
  return { client, resolved };
}

/**
 * The `application_name` of the CLI's PostgreSQL connections, so that `pg_stat_activity` names
 * them: `outboxkit-relay` for the daemon's pool (its LISTEN connection is
 * `outboxkit-relay-listener`), `outboxkit-<command>` for operator commands. Given as
 * `fallback_application_name` (PostgreSQL's libpq parameter): an `application_name` in the
 * connection string or `PGAPPNAME` wins.
 */
export function applicationName(command: string): string {
  return `outboxkit-${command}`;
}

/**
 * Runs `fn` with a pool of one connection on `url`, named `outboxkit-<command>` in
 * `pg_stat_activity` (see {@link applicationName}), and ends the pool.
 *
 * `schema` is the command's `--schema` (every command with a pool reads outboxkit's tables): an
 * error of `fn` saying that the schema or a table does not exist becomes `OUTBOXKIT_SCHEMA_MISSING`
 * with the hint `outboxkit migrate --schema <schema>`, and one saying that the role may not use
 * them `OUTBOXKIT_PERMISSION_DENIED` naming the grants (see {@link withSchemaHint}).
 */
export async function withPool(
  url: string,
  command: string,
  schema: string,
  fn: (pool: pg.Pool) => Promise<void>,
): Promise<void> {
  const pool = new pg.Pool({ connectionString: url, max: 1, fallback_application_name: applicationName(command) });
  try {
    await fn(pool);
  } catch (err) {
    throw withSchemaHint(err, schema);
  } finally {
    await pool.end();
  }
}

/**
 * A missing schema or table as `SchemaMissingError` naming `schema`, whichever way it came: a raw
 * PostgreSQL error (SQLSTATE 42P01 or 3F000), or a `SchemaMissingError` made without the schema
 * (its hint then said `outboxkit migrate` alone). A raw "permission denied" (42501) as
 * `PermissionDeniedError` naming the grants on `schema` and its tables: the commands' statements
 * that reach here read or change outboxkit's tables (`outboxkit relay --source wal` types the
 * other 42501 it can meet, creating the publication, before). Any other error is returned unchanged.
 */
export function withSchemaHint(err: unknown, schema: string): unknown {
  const pgError = isOutboxkitError(err, 'OUTBOXKIT_SCHEMA_MISSING') ? err.cause : err;
  const typed = permissionDeniedOr(schemaMissingOr(pgError, schema), schema);
  return typed === pgError ? err : typed;
}

/** A {@link Queryable} over a pool (autocommit statements). */
export function q(pool: pg.Pool): Queryable {
  return {
    query: async <R>(text: string, values?: readonly unknown[]) => {
      const r = await pool.query(text, values as unknown[]);
      return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
    },
  };
}

/**
 * A SIGTERM/SIGINT within this many ms of the first is a repeat of it (a wrapper such as npm
 * forwarding the terminal's signal), not the operator's second signal that forces exit.
 */
const REPEATED_SIGNAL_MS = 1_000;

/**
 * Runs `stop` on the first SIGTERM/SIGINT, then exits with 0 (1 after `forceAfterMs` without an
 * end); a second signal exits at once with 130. A repeat within {@link REPEATED_SIGNAL_MS} of the
 * first is the same request, not a second one: Ctrl-C under `npm run` reaches the relay twice
 * within milliseconds (from the terminal to the whole process group, then forwarded by npm).
 */
export function drainOnSignals(logger: Logger, stop: () => Promise<void>, forceAfterMs = 35_000): void {
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
    setTimeout(() => process.exit(1), forceAfterMs).unref();
    void stop().then(() => process.exit(0));
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}
