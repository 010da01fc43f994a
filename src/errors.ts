/**
 * Every error outboxkit throws is an {@link OutboxkitError} carrying a stable `code` from
 * {@link ERROR_CODES}. Recognise errors with {@link isOutboxkitError} or by `code`, not with
 * `instanceof`: applications often load two copies of a library (a bundled one and a hoisted one),
 * and `instanceof` fails across copies.
 */
import { MISSING_RELATION_SQLSTATES, SQLSTATE } from './postgres.js';

/** Every error code outboxkit uses. New codes are only ever appended. */
export const ERROR_CODES = [
  /** Options passed to a function or component are invalid. */
  'OUTBOXKIT_INVALID_OPTIONS',
  /** An outbox event is invalid (no topic, payload too large, not serialisable, ...). */
  'OUTBOXKIT_INVALID_EVENT',
  /** The handle passed as a transaction is not a live transaction (a pool, the top-level db). */
  'OUTBOXKIT_NOT_IN_TRANSACTION',
  /** The PostgreSQL server is older than outboxkit supports, or lacks a setting a component needs (`wal_level`). */
  'OUTBOXKIT_UNSUPPORTED_SERVER',
  /** A migration failed or the migration files are inconsistent. */
  'OUTBOXKIT_MIGRATION_FAILED',
  /** The idempotency key is missing where required. */
  'OUTBOXKIT_KEY_MISSING',
  /** The idempotency key is malformed (empty, too long, not visible ASCII) or repeated. */
  'OUTBOXKIT_KEY_INVALID',
  /** The tenant of a request could not be determined. */
  'OUTBOXKIT_TENANT_UNRESOLVED',
  /** The request body is larger than the fingerprint limit. */
  'OUTBOXKIT_BODY_TOO_LARGE',
  /** The request body cannot be fingerprinted (not JSON, or a number JSON cannot hold losslessly). */
  'OUTBOXKIT_BODY_INVALID',
  /** The same idempotency key was sent with a different request fingerprint. */
  'OUTBOXKIT_KEY_MISMATCH',
  /** The same idempotency key is still being processed by another request. */
  'OUTBOXKIT_KEY_IN_PROGRESS',
  /** The idempotency store (PostgreSQL) is unavailable. */
  'OUTBOXKIT_STORE_UNAVAILABLE',
  /** A lease owner lost its lease: its fencing token is stale. */
  'OUTBOXKIT_LEASE_LOST',
  /** A Kafka topic the component needs does not exist. */
  'OUTBOXKIT_TOPIC_MISSING',
  /** A Kafka message could not be decoded into an outbox event. */
  'OUTBOXKIT_INVALID_MESSAGE',
  /** A component was used after it was stopped, or started twice. */
  'OUTBOXKIT_LIFECYCLE',
  /**
   * outboxkit's tables (or its schema) do not exist in the database: run `outboxkit migrate`. From
   * migrate() itself: a table was dropped after it was migrated (the message says how to recreate it).
   */
  'OUTBOXKIT_SCHEMA_MISSING',
  /** An outbox encoder hook (`createOutbox({ encode })`) failed or returned no bytes. */
  'OUTBOXKIT_ENCODING_FAILED',
  /** The Kafka broker did not answer in time, or the relay has no connected producer. */
  'OUTBOXKIT_BROKER_UNAVAILABLE',
  /** A request's deadline is not a finite time (ms since the epoch). */
  'OUTBOXKIT_DEADLINE_INVALID',
  /** The idempotent client: the server answered with a status the client never retries (400, 413, 422, 404, ...). */
  'OUTBOXKIT_CLIENT_REJECTED',
  /** The idempotent client stopped retrying (attempts or deadline exhausted); the outcome is unknown. */
  'OUTBOXKIT_CLIENT_GAVE_UP',
  /** A replay's stored content coding, and identity too, are refused by the retry's Accept-Encoding. */
  'OUTBOXKIT_REPLAY_NOT_ACCEPTABLE',
  /** A consumer's handler asks for its message to run again later, without counting an attempt. */
  'OUTBOXKIT_RETRY_LATER',
  /** The Kafka client library chosen (`kafkaClient: 'platformatic'`) is not installed, too old, or needs a newer Node.js. */
  'OUTBOXKIT_KAFKA_CLIENT_UNAVAILABLE',
  /** The WAL source's replication stream could not start, or ended while it was read (docs/wal-source.md). */
  'OUTBOXKIT_WAL_STREAM_FAILED',
  /**
   * The database role may not use outboxkit's schema or its tables (SQLSTATE 42501): grant it
   * access. From the WAL relay: the role may not replicate (no `REPLICATION`).
   */
  'OUTBOXKIT_PERMISSION_DENIED',
] as const;

/** Union of every error code outboxkit uses. */
export type ErrorCode = (typeof ERROR_CODES)[number];

const BRAND = Symbol.for('outboxkit.error');

/** Options shared by every outboxkit error. */
export interface OutboxkitErrorOptions {
  /** The underlying error, if any. */
  cause?: unknown;
  /** Whether retrying the same operation later may succeed. @defaultValue false */
  retriable?: boolean;
}

/**
 * Base class of every outboxkit error.
 *
 * - `code`: a stable {@link ErrorCode}; match on it.
 * - `retriable`: true when the same call may succeed later (store unavailable, key in progress).
 * - `cause`: the underlying error (for example a `pg` DatabaseError), when there is one.
 */
export class OutboxkitError extends Error {
  readonly code: ErrorCode;
  readonly retriable: boolean;
  readonly [BRAND] = true;

  constructor(code: ErrorCode, message: string, options: OutboxkitErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.retriable = options.retriable ?? false;
  }
}

/** True when `err` is an outboxkit error (from any copy of the library), optionally of one code. */
export function isOutboxkitError(err: unknown, code?: ErrorCode): err is OutboxkitError {
  if (typeof err !== 'object' || err === null) return false;
  if ((err as Record<symbol, unknown>)[BRAND] !== true) return false;
  return code === undefined || (err as OutboxkitError).code === code;
}

/**
 * Options passed to a component are invalid. Thrown by every `resolveXxxOptions()`, and by
 * `ensureTopics()` (`outboxkit topics ensure`) for a topic the broker refuses to create for what it
 * asks (a bad configuration entry, more replicas than brokers, a policy: docs/kafka.md, Topics),
 * the Kafka client's error as `cause`. Also by the WAL relay's `start()` for a `statusIntervalMs`
 * not below the server's `wal_sender_timeout` (docs/wal-source.md, "Start-up checks").
 */
export class InvalidOptionsError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_INVALID_OPTIONS', message, options);
  }
}

/**
 * Refuses option names that `what` does not know (a typo such as `fromBeggining` would otherwise
 * fall back to the default silently), whatever their value, `undefined` included.
 *
 * @throws {@link InvalidOptionsError} naming the unknown keys and listing `known`.
 */
export function refuseUnknownOptions(options: object, known: readonly string[], what: string): void {
  const unknown = Object.keys(options).filter((key) => !known.includes(key));
  if (unknown.length === 0) return;
  throw new InvalidOptionsError(
    `${what}: unknown option${unknown.length === 1 ? '' : 's'} ${unknown.map((k) => JSON.stringify(k)).join(', ')}; ` +
      `the options are ${known.join(', ')}.`,
  );
}

/**
 * The option names of the options type `T`, for {@link refuseUnknownOptions}: the keys of `keys`,
 * a record the compiler checks against `T` (a missing or an unknown name does not compile), so the
 * list stays in step with the type.
 */
export function optionNames<T>(keys: Record<keyof T, true>): readonly string[] {
  return Object.freeze(Object.keys(keys));
}

/** An outbox event was rejected before anything was written. Thrown by `enqueue()`. */
export class InvalidEventError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_INVALID_EVENT', message, options);
  }
}

/**
 * The handle given where a transaction is required is not a live transaction: a `pg.Pool`, a
 * `pg.Client` outside BEGIN, or a top-level drizzle database. Thrown by `enqueue()` (test/outbox/enqueue.test.ts, "phantom events").
 */
export class NotInTransactionError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_NOT_IN_TRANSACTION', message, options);
  }
}

/**
 * The PostgreSQL server is older than the minimum outboxkit supports, or (`migrate({ walPublication })`,
 * the WAL relay) does not run `wal_level = logical`, or (the WAL relay) runs `max_wal_senders` or
 * `max_replication_slots` at 0. Thrown by `migrate()` and by the WAL relay's `start()` and
 * `outboxkit relay --source wal` (not retriable: the settings need a restart of PostgreSQL;
 * docs/wal-source.md, "Start-up checks").
 */
export class UnsupportedServerError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_UNSUPPORTED_SERVER', message, options);
  }
}

/** A migration failed; the failed migration was rolled back. Thrown by `migrate()`. */
export class MigrationError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_MIGRATION_FAILED', message, options);
  }
}

/** A Kafka topic does not exist. Thrown by the relay and the consumer at start. */
export class TopicMissingError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_TOPIC_MISSING', message, options);
  }
}

/** A component was started twice or used after `stop()`. */
export class LifecycleError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_LIFECYCLE', message, options);
  }
}

/**
 * outboxkit's schema or tables do not exist in the database it was pointed at (SQLSTATE 42P01
 * undefined_table or 3F000 invalid_schema_name). Run `outboxkit migrate` (or `migrate()`) with the
 * same schema option.
 *
 * Also thrown by `migrate()` when a table that an applied migration created is missing (dropped
 * after it was migrated): migrate never applies a recorded migration again, so it stops before
 * applying anything, and the message names the tables and how to create them again (restore them,
 * or delete the migrations' records and migrate again, or run their statements by hand;
 * test/migrate.test.ts).
 */
export class SchemaMissingError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_SCHEMA_MISSING', message, options);
  }
}

/**
 * The database role may not use outboxkit's schema or one of its tables (SQLSTATE 42501
 * insufficient_privilege): it lacks `USAGE` on the schema, or a privilege on a table that a
 * statement needs (`SELECT` to read, `INSERT`, `UPDATE`, `DELETE` to change rows), or (the WAL
 * relay daemon creating its missing publication) `CREATE` on the database and the ownership of
 * `outbox_events`. The message names PostgreSQL's refusal and the fix (the `GRANT` statements, or
 * `outboxkit migrate --wal-publication` as the tables' owner); `cause` holds the driver's error.
 * Not retriable: the schema's owner (or a superuser) must grant the access. Thrown by the CLI:
 * every command with `--database-url`, `outboxkit relay` of either source (made by
 * {@link permissionDeniedOr}); see docs/configuration.md, "Database privileges".
 *
 * Also thrown by the WAL relay's `start()` (and `outboxkit relay --source wal`) when its role has
 * neither `REPLICATION` nor `SUPERUSER`, before any slot or lease is touched: the message names
 * the role and `ALTER ROLE <role> WITH REPLICATION` (docs/wal-source.md, "Start-up checks"); and
 * by `outboxkit wal drop-slot` for the same lack.
 */
export class PermissionDeniedError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_PERMISSION_DENIED', message, options);
  }
}

/**
 * The outbox's `encode` hook threw or returned something other than bytes; nothing was written.
 * Thrown by `enqueue()`. `cause` holds the encoder's error (a Schema Registry encoder may fail for
 * a schema mismatch or because the registry is unreachable: look at `cause` to decide on a retry).
 */
export class EventEncodingError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_ENCODING_FAILED', message, options);
  }
}

/**
 * Kafka could not be reached. In the relay: a send, a producer connect or a health probe got no
 * answer within `brokerTimeoutMs`, or no producer is connected; the relay backs off, reconnects
 * and stands down after `leaseMs` of failing (its lanes go to a healthy relay). Seen in the
 * `relay:error` event and the `relay pass failed` log. Also the rejection of a `connect()` of a
 * Kafka client's producer, admin or group consumer (both clients; the @platformatic/kafka admin's
 * requests too, which connect first) when no broker could be reached at all (connection refused,
 * unknown host, no route): `Kafka brokers could not be reached (<brokers>): <socket reason>`, as
 * the dedup consumer's start-up warnings, the relay's `producer reconnect failed` and the CLI's
 * error show it (src/kafka/unreachable.ts). Retriable. `cause` holds the Kafka client's error, if any.
 */
export class BrokerUnavailableError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_BROKER_UNAVAILABLE', message, { retriable: true, ...options });
  }
}

/**
 * The Kafka client library that was chosen cannot run here: `@platformatic/kafka` (relay option
 * `kafkaClient: 'platformatic'`, `outboxkit relay --kafka-client platformatic`) is not installed,
 * is a major version outboxkit does not support, or needs a newer Node.js than the one running
 * (its 1.x line runs on Node.js 20.19.4+, its 2.x line needs 22.22+). The message says what to
 * install. Also thrown for a part of outboxkit that does not run on that client yet (the dedup
 * consumer). Not retriable: install the package (an optional peer dependency) or choose kafkajs.
 * Thrown by the relay's `start()` and by `createPlatformaticClient()`'s connects; see docs/kafka.md.
 */
export class KafkaClientUnavailableError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_KAFKA_CLIENT_UNAVAILABLE', message, options);
  }
}

/**
 * The WAL source's replication stream could not start or ended under its reader
 * (relay/wal/slot-reader.ts): the connection was lost (network, server restart,
 * `pg_terminate_backend` of the walsender, `wal_sender_timeout`), `START_REPLICATION` was refused
 * (the slot is held by another reader, SQLSTATE 55006), or the slot does not exist. Nothing is
 * lost: what the reader had not confirmed comes again to the next reader of the slot. `retriable`
 * is true except for a missing slot or publication (create them: `ensureLogicalSlot()`,
 * `ensurePublication()`). `cause` holds the driver's error, if any. Seen as the rejection of the
 * reader's `start()` or `ended`; also thrown (retriable) by `outboxkit wal drop-slot` while a WAL
 * relay holds the slot's lease or reads it.
 */
export class WalStreamError extends OutboxkitError {
  constructor(message: string, options?: OutboxkitErrorOptions) {
    super('OUTBOXKIT_WAL_STREAM_FAILED', message, { retriable: true, ...options });
  }
}

/**
 * Turns a PostgreSQL "table/schema does not exist" error into {@link SchemaMissingError}; returns
 * any other error unchanged.
 */
export function schemaMissingOr(err: unknown, schema?: string): unknown {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string' && MISSING_RELATION_SQLSTATES.has(code)) {
    const where = schema === undefined ? '' : ` in schema "${schema}"`;
    const flag = schema === undefined ? '' : ` --schema ${schema}`;
    return new SchemaMissingError(
      `outboxkit's tables are missing${where} (${(err as Error).message}); run \`outboxkit migrate${flag}\` or migrate() first.`,
      { cause: err },
    );
  }
  return err;
}

/**
 * Turns PostgreSQL's "permission denied" (SQLSTATE 42501) for a statement on outboxkit's tables in
 * `schema` into {@link PermissionDeniedError} naming the grants needed; returns any other error
 * unchanged. Only for errors of statements that read or change outboxkit's tables: 42501 also
 * means a missing `REPLICATION` attribute or table ownership (`CREATE PUBLICATION`), which the
 * schema's grants do not fix.
 *
 * @param schema - the schema name, unquoted (validated: a lower-case identifier).
 */
export function permissionDeniedOr(err: unknown, schema: string): unknown {
  if ((err as { code?: unknown } | null)?.code !== SQLSTATE.INSUFFICIENT_PRIVILEGE) return err;
  const s = `"${schema}"`;
  return new PermissionDeniedError(
    `The database role may not use outboxkit's schema "${schema}" (${(err as Error).message}). ` +
      `As the schema's owner, grant it: GRANT USAGE ON SCHEMA ${s} TO <role>; then the privileges on the tables, ` +
      `GRANT SELECT ON ALL TABLES IN SCHEMA ${s} TO <role> for \`outboxkit status\` and \`parked list\`, ` +
      `or GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ${s} TO <role> for a relay ` +
      'and the commands that change rows (docs/configuration.md, "Database privileges").',
    { cause: err },
  );
}

/**
 * A Kafka connection setting (flag, environment variable or `--kafka-config` file key) is invalid
 * or missing. `field` names the setting as the user gave it (for example `--kafka-sasl-mechanism`,
 * `KAFKA_SASL_USERNAME` or `sasl.passwordFile in kafka.json`). The message never contains a secret.
 * Thrown by `resolveKafkaConfig()` and `kafkaConfigFromEnv()`.
 */
export class InvalidKafkaConfigError extends InvalidOptionsError {
  /** Where the bad setting came from, as the user wrote it. */
  readonly field: string;

  constructor(field: string, message: string, options?: OutboxkitErrorOptions) {
    super(message, options);
    this.field = field;
  }
}
