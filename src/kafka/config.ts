/**
 * Kafka connection settings for real clusters: brokers, client id, TLS, SASL (PLAIN,
 * SCRAM-SHA-256, SCRAM-SHA-512), timeouts and retries, plus the producer and consumer settings
 * users tune, read from CLI flags, environment variables and an optional JSON file, validated once
 * and turned into a kafkajs `KafkaConfig`.
 *
 * Precedence, per setting: flag > environment variable > config file > default. The SASL password
 * and the password file count as one setting: the highest source that gives either wins.
 *
 * Secrets (the SASL password, the TLS private key and its passphrase) are never part of an error
 * message, a warning or {@link ResolvedKafkaConfig.description}, and the returned `kafkaConfig`
 * serialises (JSON, pino, `util.inspect`) to that redacted description. Prefer the `*_FILE` /
 * `passwordFile` forms: a password given as a flag shows in `ps` (a warning says so).
 *
 * Sources: kafkajs 2.2 client configuration (https://kafka.js.org/docs/configuration), Kafka's
 * SASL/SCRAM and SASL/PLAIN documentation (https://kafka.apache.org/documentation/#security_sasl).
 * The option table is in docs/kafka.md.
 */
import { readFileSync } from 'node:fs';
import { inspect } from 'node:util';
import { z } from 'zod';
import { InvalidKafkaConfigError } from '../errors.js';
// Types only (erased): this module loads no kafkajs, so the package root can re-export it.
import type { KafkaConfig, SASLOptions } from './kafkajs/client.js';

/** SASL mechanisms outboxkit configures (kafkajs names, lower case). */
export const KAFKA_SASL_MECHANISMS = ['plain', 'scram-sha-256', 'scram-sha-512'] as const;
export type KafkaSaslMechanism = (typeof KAFKA_SASL_MECHANISMS)[number];

/**
 * Producer compression codecs available without extra packages (kafkajs ships gzip only; snappy,
 * lz4 and zstd need codec packages outboxkit does not install).
 */
export const KAFKA_COMPRESSIONS = ['none', 'gzip'] as const;
export type KafkaCompression = (typeof KAFKA_COMPRESSIONS)[number];

/** Defaults of every setting that has one. */
export const KAFKA_CONFIG_DEFAULTS = Object.freeze({
  brokers: Object.freeze(['127.0.0.1:9092']),
  clientId: 'outboxkit',
  /** TCP (and TLS) connect timeout, in ms. kafkajs' own 1_000 is short for a remote TLS cluster. */
  connectionTimeoutMs: 3_000,
  /** SASL handshake timeout, in ms (kafkajs default). */
  authenticationTimeoutMs: 10_000,
  /** Timeout of one request to a broker, in ms (kafkajs default). */
  requestTimeoutMs: 30_000,
  /** Client-level retries (metadata, admin, consumer), kafkajs backoff. */
  retries: 5,
  retryInitialMs: 300,
  retryMaxMs: 30_000,
  producerCompression: 'none' as KafkaCompression,
  /** Broker-side acknowledgement timeout of one produce request, in ms. */
  producerRequestTimeoutMs: 30_000,
  /** kafkajs retries inside one relay send before it fails (the relay then backs off). */
  producerRetries: 5,
  /** Longest age of the relay producer's metadata, in ms: how soon it writes to partitions added to a topic. */
  producerMetadataMaxAgeMs: 30_000,
});

/**
 * Producer settings the relay's guarantees rest on (see `SAFE_PRODUCER_CONFIG` in
 * src/kafka/kafkajs/producer.ts): they cannot be changed, and a file key or environment variable
 * that tries is rejected rather than silently ignored. The listed value is the only one accepted.
 */
const LOCKED_PRODUCER_SETTINGS = {
  idempotent: { env: 'KAFKA_PRODUCER_IDEMPOTENT', safe: [true, 'true'], shown: 'true' },
  acks: { env: 'KAFKA_PRODUCER_ACKS', safe: [-1, '-1', 'all'], shown: 'all (-1)' },
  maxInFlightRequests: { env: 'KAFKA_PRODUCER_MAX_IN_FLIGHT_REQUESTS', safe: [1, '1'], shown: '1' },
  allowAutoTopicCreation: { env: 'KAFKA_PRODUCER_ALLOW_AUTO_TOPIC_CREATION', safe: [false, 'false'], shown: 'false' },
  transactionalId: { env: 'KAFKA_PRODUCER_TRANSACTIONAL_ID', safe: [], shown: 'unset' },
} as const;

type FieldType = 'string' | 'list' | 'bool' | 'int';

interface FieldSpec {
  /** Key path in the config file, also the setting's name in errors and docs. */
  path: string;
  /** Commander attribute of the CLI flag (camelCase), if the setting has a flag. */
  flag?: string;
  /** Environment variables, the first set one wins (later ones are aliases). */
  env: readonly string[];
  type: FieldType;
  schema: z.ZodType;
  secret?: boolean;
}

const ms = (max = 3_600_000) => z.number().int().min(1).max(max);
const count = (max: number) => z.number().int().min(0).max(max);
const nonEmpty = z.string().trim().min(1, 'must not be empty');
// host:port, host a name, IPv4 or bracketed IPv6; port 1-65535.
const broker = z
  .string()
  .trim()
  .regex(/^(\[[0-9a-fA-F:.]+\]|[^\s:,[\]]+):\d{1,5}$/, 'must be host:port')
  .refine((b) => {
    const port = Number(b.slice(b.lastIndexOf(':') + 1));
    return port >= 1 && port <= 65_535;
  }, 'port must be 1-65535');
const mechanism = z
  .string()
  .transform((s) => s.trim().toLowerCase())
  .pipe(z.enum(KAFKA_SASL_MECHANISMS, { error: `must be one of ${KAFKA_SASL_MECHANISMS.join(', ')}` }));
const compression = z
  .string()
  .transform((s) => s.trim().toLowerCase())
  .pipe(
    z.enum(KAFKA_COMPRESSIONS, {
      error: `must be one of ${KAFKA_COMPRESSIONS.join(', ')} (snappy, lz4 and zstd need codec packages kafkajs does not ship)`,
    }),
  );

const FIELDS: readonly FieldSpec[] = [
  { path: 'brokers', flag: 'brokers', env: ['KAFKA_BROKERS'], type: 'list', schema: z.array(broker).min(1) },
  {
    path: 'clientId',
    flag: 'clientId',
    env: ['KAFKA_CLIENT_ID', 'OUTBOXKIT_CLIENT_ID'],
    type: 'string',
    schema: nonEmpty.max(255),
  },
  { path: 'ssl.enabled', flag: 'kafkaSsl', env: ['KAFKA_SSL'], type: 'bool', schema: z.boolean() },
  { path: 'ssl.caFile', flag: 'kafkaSslCaFile', env: ['KAFKA_SSL_CA_FILE'], type: 'string', schema: nonEmpty },
  { path: 'ssl.certFile', flag: 'kafkaSslCertFile', env: ['KAFKA_SSL_CERT_FILE'], type: 'string', schema: nonEmpty },
  { path: 'ssl.keyFile', flag: 'kafkaSslKeyFile', env: ['KAFKA_SSL_KEY_FILE'], type: 'string', schema: nonEmpty },
  {
    path: 'ssl.keyPasswordFile',
    flag: 'kafkaSslKeyPasswordFile',
    env: ['KAFKA_SSL_KEY_PASSWORD_FILE'],
    type: 'string',
    schema: nonEmpty,
  },
  {
    path: 'ssl.rejectUnauthorized',
    flag: 'kafkaSslRejectUnauthorized',
    env: ['KAFKA_SSL_REJECT_UNAUTHORIZED'],
    type: 'bool',
    schema: z.boolean(),
  },
  {
    path: 'ssl.servername',
    flag: 'kafkaSslServername',
    env: ['KAFKA_SSL_SERVERNAME'],
    type: 'string',
    schema: nonEmpty,
  },
  {
    path: 'sasl.mechanism',
    flag: 'kafkaSaslMechanism',
    env: ['KAFKA_SASL_MECHANISM'],
    type: 'string',
    schema: mechanism,
  },
  { path: 'sasl.username', flag: 'kafkaSaslUsername', env: ['KAFKA_SASL_USERNAME'], type: 'string', schema: nonEmpty },
  {
    path: 'sasl.password',
    flag: 'kafkaSaslPassword',
    env: ['KAFKA_SASL_PASSWORD'],
    type: 'string',
    schema: z.string().min(1, 'must not be empty'),
    secret: true,
  },
  {
    path: 'sasl.passwordFile',
    flag: 'kafkaSaslPasswordFile',
    env: ['KAFKA_SASL_PASSWORD_FILE'],
    type: 'string',
    schema: nonEmpty,
  },
  {
    path: 'connectionTimeoutMs',
    flag: 'kafkaConnectionTimeoutMs',
    env: ['KAFKA_CONNECTION_TIMEOUT_MS'],
    type: 'int',
    schema: ms(),
  },
  {
    path: 'authenticationTimeoutMs',
    flag: 'kafkaAuthenticationTimeoutMs',
    env: ['KAFKA_AUTHENTICATION_TIMEOUT_MS'],
    type: 'int',
    schema: ms(),
  },
  {
    path: 'requestTimeoutMs',
    flag: 'kafkaRequestTimeoutMs',
    env: ['KAFKA_REQUEST_TIMEOUT_MS'],
    type: 'int',
    schema: ms(),
  },
  { path: 'retry.retries', flag: 'kafkaRetries', env: ['KAFKA_RETRIES'], type: 'int', schema: count(100) },
  {
    path: 'retry.initialRetryTimeMs',
    flag: 'kafkaRetryInitialMs',
    env: ['KAFKA_RETRY_INITIAL_MS'],
    type: 'int',
    schema: ms(),
  },
  { path: 'retry.maxRetryTimeMs', flag: 'kafkaRetryMaxMs', env: ['KAFKA_RETRY_MAX_MS'], type: 'int', schema: ms() },
  {
    path: 'producer.compression',
    flag: 'producerCompression',
    env: ['KAFKA_PRODUCER_COMPRESSION'],
    type: 'string',
    schema: compression,
  },
  {
    path: 'producer.requestTimeoutMs',
    flag: 'producerRequestTimeoutMs',
    env: ['KAFKA_PRODUCER_REQUEST_TIMEOUT_MS'],
    type: 'int',
    schema: ms(),
  },
  {
    path: 'producer.retries',
    flag: 'producerRetries',
    env: ['KAFKA_PRODUCER_RETRIES'],
    type: 'int',
    schema: count(100),
  },
  {
    path: 'producer.metadataMaxAgeMs',
    flag: 'producerMetadataMaxAgeMs',
    env: ['KAFKA_PRODUCER_METADATA_MAX_AGE_MS'],
    type: 'int',
    schema: z.number().int().min(100).max(86_400_000),
  },
  {
    path: 'consumer.sessionTimeoutMs',
    env: ['KAFKA_CONSUMER_SESSION_TIMEOUT_MS'],
    type: 'int',
    schema: ms(),
  },
  {
    path: 'consumer.heartbeatIntervalMs',
    env: ['KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS'],
    type: 'int',
    schema: ms(),
  },
  { path: 'consumer.fetchMaxWaitMs', env: ['KAFKA_CONSUMER_FETCH_MAX_WAIT_MS'], type: 'int', schema: ms() },
  {
    path: 'consumer.autoCommitIntervalMs',
    env: ['KAFKA_CONSUMER_AUTO_COMMIT_INTERVAL_MS'],
    type: 'int',
    schema: ms(),
  },
  {
    path: 'consumer.partitionsConsumedConcurrently',
    env: ['KAFKA_CONSUMER_PARTITIONS_CONSUMED_CONCURRENTLY'],
    type: 'int',
    schema: z.number().int().min(1).max(1_000),
  },
  {
    path: 'consumer.metadataMaxAgeMs',
    env: ['KAFKA_CONSUMER_METADATA_MAX_AGE_MS'],
    type: 'int',
    schema: z.number().int().min(100).max(86_400_000),
  },
];

const FIELD_BY_PATH = new Map(FIELDS.map((f) => [f.path, f]));

/** The `--kafka-config` JSON file: every key optional, unknown keys rejected (typos fail). */
const fileSchema = (() => {
  const section = (prefix: string, extra: Record<string, z.ZodType> = {}) =>
    z
      .object({
        ...Object.fromEntries(
          FIELDS.filter((f) => f.path.startsWith(`${prefix}.`)).map((f) => [
            f.path.slice(prefix.length + 1),
            f.schema.optional(),
          ]),
        ),
        ...extra,
      })
      .strict();
  const locked = Object.fromEntries(Object.keys(LOCKED_PRODUCER_SETTINGS).map((k) => [k, z.unknown().optional()]));
  return z
    .object({
      brokers: z.union([z.string(), z.array(z.string())]).optional(),
      clientId: FIELD_BY_PATH.get('clientId')!.schema.optional(),
      ssl: z.union([z.boolean(), section('ssl')]).optional(),
      sasl: section('sasl').optional(),
      connectionTimeoutMs: ms().optional(),
      authenticationTimeoutMs: ms().optional(),
      requestTimeoutMs: ms().optional(),
      retry: section('retry').optional(),
      producer: section('producer', locked).optional(),
      consumer: section('consumer').optional(),
    })
    .strict();
})();

/** The shape of the `--kafka-config` JSON file (see docs/kafka.md). */
export type KafkaConfigFile = z.input<typeof fileSchema>;

/**
 * Flag values as the CLI parsed them, by commander attribute name (`brokers`, `clientId`,
 * `kafkaSsl`, `kafkaSaslMechanism`, ..., and `kafkaConfig` for the file). `undefined` means not given.
 */
export type KafkaConfigFlags = Record<string, string | number | boolean | string[] | undefined>;

/** Options of {@link resolveKafkaConfig}. */
export interface ResolveKafkaConfigOptions {
  /** CLI flag values (highest precedence). @defaultValue none */
  flags?: KafkaConfigFlags;
  /** The environment. @defaultValue process.env */
  env?: Record<string, string | undefined>;
  /**
   * A JSON config file, used when neither `--kafka-config` (`flags.kafkaConfig`) nor
   * `KAFKA_CONFIG_FILE` names one. @defaultValue none
   */
  configFile?: string;
  /** Defaults that differ by program (the relay's client id is `outboxkit-relay`). */
  defaults?: { clientId?: string; brokers?: readonly string[] };
}

/** Producer settings for the relay (`RelayOptions.producerOptions`). */
export interface KafkaProducerSettings {
  /** Record batch compression (the producer maps the name to its client's codec). @defaultValue 'none' */
  compression: KafkaCompression;
  /** Broker-side acknowledgement timeout of one produce request, in ms. @defaultValue 30_000 */
  requestTimeoutMs: number;
  /** kafkajs retries inside one send before it fails. @defaultValue 5 */
  retries: number;
  /**
   * Longest age of the producer's metadata, in ms: how soon after a topic grows the relay writes to
   * its new partitions. @defaultValue 30_000
   */
  metadataMaxAgeMs: number;
}

/** Consumer settings given in the environment or file: spread into `createDedupConsumer()` options. */
export interface KafkaConsumerSettings {
  sessionTimeoutMs?: number;
  heartbeatIntervalMs?: number;
  fetchMaxWaitMs?: number;
  autoCommitIntervalMs?: number;
  partitionsConsumedConcurrently?: number;
  metadataMaxAgeMs?: number;
}

/** What may be logged about a Kafka configuration: never a password, key or passphrase. */
export interface RedactedKafkaConfig {
  brokers: string[];
  clientId: string;
  ssl: boolean;
  /** Present (false) only when certificate verification is off. */
  sslRejectUnauthorized?: false;
  sasl?: { mechanism: KafkaSaslMechanism; username: string };
  connectionTimeoutMs: number;
  requestTimeoutMs: number;
  producer: { compression: KafkaCompression; requestTimeoutMs: number; retries: number; metadataMaxAgeMs: number };
  /** The JSON file that was read, if any. */
  configFile?: string;
}

/** The result of {@link resolveKafkaConfig}. */
export interface ResolvedKafkaConfig {
  /**
   * For `createKafkajsClient(kafkaConfig, { logger })` (outboxkit/kafka) or `new Kafka(kafkaConfig)`
   * (add `logLevel`/`logCreator` as you like). It holds the secrets; JSON.stringify, pino and
   * `util.inspect` show {@link description} instead.
   */
  kafkaConfig: KafkaConfig;
  /** For the relay: `new Relay({ kafka, producerOptions: resolved.producer })`. */
  producer: KafkaProducerSettings;
  /** For the dedup consumer: `createDedupConsumer({ kafka, ...resolved.consumer, ... })`. */
  consumer: KafkaConsumerSettings;
  /** Safe to log. */
  description: RedactedKafkaConfig;
  /** Risky but valid choices (password as a flag, PLAIN without TLS, verification off). Log them. */
  warnings: string[];
}

type Layer = 'flag' | 'env' | 'file';
interface Given {
  value: unknown;
  /** How the user wrote it: `--kafka-sasl-mechanism`, `KAFKA_SASL_MECHANISM`, `sasl.mechanism in kafka.json`. */
  source: string;
  layer: Layer;
}

const flagName = (attr: string) => `--${attr.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;

function fail(field: string, message: string, cause?: unknown): never {
  throw new InvalidKafkaConfigError(field, `Kafka setting ${field}: ${message}`, cause ? { cause } : undefined);
}

/** Parses a flag or environment string by the field's type; the message never repeats the value. */
function parseText(spec: FieldSpec, raw: string | number | boolean | string[], source: string): unknown {
  if (spec.type === 'list') {
    const list = (Array.isArray(raw) ? raw : String(raw).split(','))
      .map((s) => String(s).trim())
      .filter((s) => s.length > 0);
    return list;
  }
  if (spec.type === 'bool') {
    if (typeof raw === 'boolean') return raw;
    const s = String(raw).trim();
    if (/^(1|true|yes|on)$/i.test(s)) return true;
    if (/^(0|false|no|off)$/i.test(s)) return false;
    return fail(source, 'expected true or false.');
  }
  if (spec.type === 'int') {
    if (typeof raw === 'number') return raw;
    const s = String(raw).trim().replace(/_/g, '');
    if (!/^\d+$/.test(s)) return fail(source, 'expected a whole number.');
    return Number(s);
  }
  return String(raw);
}

function check(spec: FieldSpec, value: unknown, source: string): unknown {
  const r = spec.schema.safeParse(value);
  if (!r.success) fail(source, `${r.error.issues.map((i) => i.message).join('; ')}.`);
  return r.data;
}

function readText(field: string, file: string, what: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as { code?: string }).code ?? 'error';
    return fail(field, `cannot read the ${what} file ${file} (${code}).`, err);
  }
}

function readConfigFile(file: string, source: string): Map<string, Given> {
  const text = readText(source, file, 'Kafka config');
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    // JSON.parse's message quotes the text around the error, which may be a secret.
    return fail(source, `${file} is not valid JSON.`);
  }
  const at = (path: string) => `${path} in ${file}`;
  if (json && typeof json === 'object' && !Array.isArray(json)) {
    const producer = (json as { producer?: Record<string, unknown> }).producer;
    if (producer && typeof producer === 'object') {
      for (const [key, rule] of Object.entries(LOCKED_PRODUCER_SETTINGS)) {
        if (key in producer) checkLocked(at(`producer.${key}`), key, rule, producer[key]);
      }
    }
  }
  const parsed = fileSchema.safeParse(json);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const path = issue.path.join('.');
    const keys = (issue as { keys?: string[] }).keys;
    const where = keys?.length ? [path, keys[0]].filter(Boolean).join('.') : path || '(top level)';
    return fail(at(where), `${issue.message}.`);
  }
  const out = new Map<string, Given>();
  const put = (path: string, value: unknown) => {
    if (value !== undefined) out.set(path, { value, source: at(path), layer: 'file' });
  };
  const data = parsed.data as Record<string, unknown>;
  for (const [key, value] of Object.entries(data)) {
    if (key === 'brokers') {
      const list = (Array.isArray(value) ? value : String(value).split(','))
        .map((s: string) => s.trim())
        .filter(Boolean);
      put('brokers', check(FIELD_BY_PATH.get('brokers')!, list, at('brokers')));
    } else if (key === 'ssl' && typeof value === 'boolean') {
      put('ssl.enabled', value);
    } else if (value !== null && typeof value === 'object') {
      for (const [sub, v] of Object.entries(value)) if (FIELD_BY_PATH.has(`${key}.${sub}`)) put(`${key}.${sub}`, v);
    } else {
      put(key, value);
    }
  }
  return out;
}

function checkLocked(
  source: string,
  key: string,
  rule: { safe: readonly unknown[]; shown: string },
  value: unknown,
): void {
  if (rule.safe.some((s) => s === value || (typeof value === 'string' && String(s) === value.trim().toLowerCase())))
    return;
  fail(
    source,
    `producer ${key} cannot be changed: the relay always runs with idempotent=true, acks=all (-1), ` +
      'maxInFlightRequests=1, no topic auto-creation and no transactions, which its no-loss and per-key order ' +
      `guarantees depend on (accepted value: ${rule.shown}). Remove the setting.`,
  );
}

/**
 * Resolves the Kafka settings from flags, the environment, a JSON file and defaults (in that order
 * of precedence) into a validated kafkajs `KafkaConfig`, reading the TLS and password files.
 *
 * @returns the kafkajs config, the relay's producer settings, the consumer settings, a redacted
 *   description to log, and warnings to log.
 * @throws {@link InvalidKafkaConfigError} (code `OUTBOXKIT_INVALID_OPTIONS`) naming the flag,
 *   variable or file key at fault: a malformed value, an unknown file key, an unreadable file, an
 *   incomplete SASL or TLS setup, or an attempt to weaken the relay's producer safety settings.
 */
export function resolveKafkaConfig(options: ResolveKafkaConfigOptions = {}): ResolvedKafkaConfig {
  const flags = options.flags ?? {};
  const env = options.env ?? process.env;
  const warnings: string[] = [];

  for (const [key, rule] of Object.entries(LOCKED_PRODUCER_SETTINGS)) {
    const v = env[rule.env];
    if (v !== undefined && v !== '') checkLocked(rule.env, key, rule, v);
  }

  // Layers, lowest first; a later layer replaces a setting of an earlier one.
  const layers: Map<string, Given>[] = [];
  const fileFlag = flags.kafkaConfig;
  const configFile =
    typeof fileFlag === 'string' && fileFlag !== ''
      ? { path: fileFlag, source: '--kafka-config' }
      : env.KAFKA_CONFIG_FILE
        ? { path: env.KAFKA_CONFIG_FILE, source: 'KAFKA_CONFIG_FILE' }
        : options.configFile
          ? { path: options.configFile, source: 'configFile' }
          : undefined;
  if (configFile) layers.push(readConfigFile(configFile.path, configFile.source));

  const envLayer = new Map<string, Given>();
  for (const spec of FIELDS) {
    const name = spec.env.find((n) => env[n] !== undefined && env[n] !== '');
    if (name === undefined) continue;
    envLayer.set(spec.path, {
      value: check(spec, parseText(spec, env[name]!, name), name),
      source: name,
      layer: 'env',
    });
  }
  layers.push(envLayer);

  const flagLayer = new Map<string, Given>();
  for (const spec of FIELDS) {
    const raw = spec.flag === undefined ? undefined : flags[spec.flag];
    if (raw === undefined) continue;
    const source = flagName(spec.flag!);
    flagLayer.set(spec.path, { value: check(spec, parseText(spec, raw, source), source), source, layer: 'flag' });
  }
  layers.push(flagLayer);

  // One layer giving both forms of one secret is ambiguous; across layers the higher one wins.
  for (const layer of layers) {
    const a = layer.get('sasl.password');
    const b = layer.get('sasl.passwordFile');
    if (a && b) fail(a.source, `give the password or ${b.source}, not both.`);
  }
  const settings = new Map<string, Given>();
  for (const layer of layers) {
    const overridesPassword = layer.has('sasl.password') || layer.has('sasl.passwordFile');
    if (overridesPassword) {
      settings.delete('sasl.password');
      settings.delete('sasl.passwordFile');
    }
    for (const [path, given] of layer) settings.set(path, given);
  }
  const get = <T>(path: string): T | undefined => settings.get(path)?.value as T | undefined;
  const src = (path: string, fallback = path) => settings.get(path)?.source ?? fallback;

  const pw = settings.get('sasl.password');
  if (pw?.layer === 'flag') {
    warnings.push(
      'The SASL password was given as a flag: other users of this machine can read it in `ps`. ' +
        'Use --kafka-sasl-password-file or KAFKA_SASL_PASSWORD_FILE instead.',
    );
  }

  // TLS: on when asked for, or when a TLS file is given (unless explicitly off).
  const sslFiles = ['ssl.caFile', 'ssl.certFile', 'ssl.keyFile', 'ssl.keyPasswordFile', 'ssl.servername'].filter((p) =>
    settings.has(p),
  );
  const sslEnabled = get<boolean>('ssl.enabled');
  if (sslEnabled === false && sslFiles.length > 0) {
    fail(
      src(sslFiles[0]!),
      `TLS is turned off (${src('ssl.enabled')}) but TLS settings are given; remove them or turn TLS on.`,
    );
  }
  const rejectUnauthorized = get<boolean>('ssl.rejectUnauthorized');
  const ssl = sslEnabled === true || sslFiles.length > 0 || (sslEnabled === undefined && rejectUnauthorized === false);
  if (settings.has('ssl.certFile') !== settings.has('ssl.keyFile')) {
    const given = settings.has('ssl.certFile') ? 'ssl.certFile' : 'ssl.keyFile';
    fail(src(given), 'a client certificate needs both the certificate file and the private key file.');
  }
  let sslConfig: KafkaConfig['ssl'] = ssl;
  if (ssl && (sslFiles.length > 0 || rejectUnauthorized !== undefined)) {
    const tls: Record<string, unknown> = {};
    if (settings.has('ssl.caFile'))
      tls.ca = [readText(src('ssl.caFile'), get<string>('ssl.caFile')!, 'CA certificate')];
    if (settings.has('ssl.certFile'))
      tls.cert = readText(src('ssl.certFile'), get<string>('ssl.certFile')!, 'client certificate');
    if (settings.has('ssl.keyFile')) tls.key = readText(src('ssl.keyFile'), get<string>('ssl.keyFile')!, 'private key');
    if (settings.has('ssl.keyPasswordFile'))
      tls.passphrase = secretFromFile(src('ssl.keyPasswordFile'), get<string>('ssl.keyPasswordFile')!, 'key password');
    if (settings.has('ssl.servername')) tls.servername = get<string>('ssl.servername');
    if (rejectUnauthorized !== undefined) tls.rejectUnauthorized = rejectUnauthorized;
    // kafkajs copies the enumerable keys into tls.connect(): the key stays enumerable, but a log
    // or inspect of the object shows only the file names.
    const shown = Object.fromEntries(
      sslFiles.map((p) => [p.slice(4), p === 'ssl.servername' ? get(p) : `<${get<string>(p)}>`]),
    );
    hideBehind(tls, { ...shown, ...(rejectUnauthorized === undefined ? {} : { rejectUnauthorized }) });
    sslConfig = tls;
  }
  if (ssl && rejectUnauthorized === false) {
    warnings.push(
      `TLS certificate verification is off (${src('ssl.rejectUnauthorized')}): anyone on the path can impersonate the brokers.`,
    );
  }

  // SASL: complete or absent.
  const saslPaths = ['sasl.mechanism', 'sasl.username', 'sasl.password', 'sasl.passwordFile'].filter((p) =>
    settings.has(p),
  );
  let sasl: SASLOptions | undefined;
  let saslShown: RedactedKafkaConfig['sasl'];
  if (saslPaths.length > 0) {
    const first = src(saslPaths[0]!);
    const mech = get<KafkaSaslMechanism>('sasl.mechanism');
    if (!mech)
      fail(
        first,
        `SASL needs a mechanism (--kafka-sasl-mechanism, KAFKA_SASL_MECHANISM or sasl.mechanism): ${KAFKA_SASL_MECHANISMS.join(', ')}.`,
      );
    const username = get<string>('sasl.username');
    if (!username)
      fail(
        src('sasl.mechanism'),
        'SASL needs a username (--kafka-sasl-username, KAFKA_SASL_USERNAME or sasl.username).',
      );
    let password: string;
    if (settings.has('sasl.passwordFile')) {
      password = secretFromFile(src('sasl.passwordFile'), get<string>('sasl.passwordFile')!, 'SASL password');
    } else if (settings.has('sasl.password')) {
      password = get<string>('sasl.password')!;
    } else {
      return fail(
        src('sasl.mechanism'),
        'SASL needs a password: KAFKA_SASL_PASSWORD_FILE / --kafka-sasl-password-file / sasl.passwordFile (preferred), or KAFKA_SASL_PASSWORD.',
      );
    }
    sasl = { mechanism: mech, username } as SASLOptions;
    // Non-enumerable: kafkajs reads it by name, JSON and loggers never see it.
    Object.defineProperty(sasl, 'password', { value: password, enumerable: false });
    saslShown = { mechanism: mech, username };
    hideBehind(sasl as object, saslShown);
    if (mech === 'plain' && !ssl) {
      warnings.push(
        'SASL PLAIN without TLS sends the password in clear text: turn TLS on (KAFKA_SSL=true) or use SCRAM.',
      );
    }
  }

  const brokers = get<string[]>('brokers') ?? [...(options.defaults?.brokers ?? KAFKA_CONFIG_DEFAULTS.brokers)];
  const clientId = get<string>('clientId') ?? options.defaults?.clientId ?? KAFKA_CONFIG_DEFAULTS.clientId;
  const connectionTimeoutMs = get<number>('connectionTimeoutMs') ?? KAFKA_CONFIG_DEFAULTS.connectionTimeoutMs;
  const requestTimeoutMs = get<number>('requestTimeoutMs') ?? KAFKA_CONFIG_DEFAULTS.requestTimeoutMs;
  const retryInitialMs = get<number>('retry.initialRetryTimeMs') ?? KAFKA_CONFIG_DEFAULTS.retryInitialMs;
  const retryMaxMs = get<number>('retry.maxRetryTimeMs') ?? KAFKA_CONFIG_DEFAULTS.retryMaxMs;
  if (retryMaxMs < retryInitialMs) {
    fail(
      src('retry.maxRetryTimeMs', src('retry.initialRetryTimeMs')),
      `the largest retry delay (${retryMaxMs} ms) is below the first one (${retryInitialMs} ms).`,
    );
  }
  const compressionName = get<KafkaCompression>('producer.compression') ?? KAFKA_CONFIG_DEFAULTS.producerCompression;
  const producer: KafkaProducerSettings = {
    compression: compressionName,
    requestTimeoutMs: get<number>('producer.requestTimeoutMs') ?? KAFKA_CONFIG_DEFAULTS.producerRequestTimeoutMs,
    retries: get<number>('producer.retries') ?? KAFKA_CONFIG_DEFAULTS.producerRetries,
    metadataMaxAgeMs: get<number>('producer.metadataMaxAgeMs') ?? KAFKA_CONFIG_DEFAULTS.producerMetadataMaxAgeMs,
  };
  const consumer: KafkaConsumerSettings = {};
  for (const key of [
    'sessionTimeoutMs',
    'heartbeatIntervalMs',
    'fetchMaxWaitMs',
    'autoCommitIntervalMs',
    'partitionsConsumedConcurrently',
    'metadataMaxAgeMs',
  ] as const) {
    const v = get<number>(`consumer.${key}`);
    if (v !== undefined) consumer[key] = v;
  }
  if (
    consumer.heartbeatIntervalMs !== undefined &&
    consumer.sessionTimeoutMs !== undefined &&
    consumer.heartbeatIntervalMs >= consumer.sessionTimeoutMs
  ) {
    fail(src('consumer.heartbeatIntervalMs'), 'the heartbeat interval must be below the session timeout.');
  }

  const description: RedactedKafkaConfig = {
    brokers,
    clientId,
    ssl,
    ...(ssl && rejectUnauthorized === false ? { sslRejectUnauthorized: false as const } : {}),
    ...(saslShown ? { sasl: saslShown } : {}),
    connectionTimeoutMs,
    requestTimeoutMs,
    producer: {
      compression: compressionName,
      requestTimeoutMs: producer.requestTimeoutMs,
      retries: producer.retries,
      metadataMaxAgeMs: producer.metadataMaxAgeMs,
    },
    ...(configFile ? { configFile: configFile.path } : {}),
  };
  const kafkaConfig: KafkaConfig = {
    brokers,
    clientId,
    ssl: sslConfig,
    ...(sasl ? { sasl } : {}),
    connectionTimeout: connectionTimeoutMs,
    authenticationTimeout: get<number>('authenticationTimeoutMs') ?? KAFKA_CONFIG_DEFAULTS.authenticationTimeoutMs,
    requestTimeout: requestTimeoutMs,
    retry: {
      retries: get<number>('retry.retries') ?? KAFKA_CONFIG_DEFAULTS.retries,
      initialRetryTime: retryInitialMs,
      maxRetryTime: retryMaxMs,
    },
  };
  hideBehind(kafkaConfig, description);
  return { kafkaConfig, producer, consumer, description, warnings };
}

/**
 * {@link resolveKafkaConfig} from the environment alone (and `KAFKA_CONFIG_FILE`, or
 * `options.configFile`): the one line an application embedding the relay or the dedup consumer
 * needs, `new Kafka(kafkaConfigFromEnv().kafkaConfig)`.
 *
 * @throws {@link InvalidKafkaConfigError}
 */
export function kafkaConfigFromEnv(options: Omit<ResolveKafkaConfigOptions, 'flags'> = {}): ResolvedKafkaConfig {
  return resolveKafkaConfig({ ...options, flags: {} });
}

/** A secret read from a file: the trailing newline editors and `echo` add is dropped. */
function secretFromFile(field: string, file: string, what: string): string {
  const text = readText(field, file, what).replace(/\r?\n$/, '');
  if (text.length === 0) fail(field, `the ${what} file ${file} is empty.`);
  return text;
}

/** JSON.stringify, pino and util.inspect of `target` show `shown` (non-enumerable, so kafkajs never copies it). */
function hideBehind(target: object, shown: object): void {
  Object.defineProperty(target, 'toJSON', { value: () => shown, enumerable: false });
  Object.defineProperty(target, inspect.custom, { value: () => shown, enumerable: false });
}
