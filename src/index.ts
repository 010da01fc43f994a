/**
 * outboxkit: safe retries across PostgreSQL and Apache Kafka.
 *
 * - `enqueue()` / `createOutbox()`: the transactional outbox writer.
 * - `migrate()`: creates and upgrades outboxkit's tables.
 * - Errors: every error is an `OutboxkitError` with a stable `code`.
 */
export { enqueue, createOutbox, notifyChannel, OUTBOX_DEFAULTS } from './outbox/enqueue.js';
export type { Outbox, OutboxOptions, EnqueuedEvent } from './outbox/enqueue.js';
export { HEADER_EVENT_ID, HEADER_EVENT_TYPE, laneOf } from './outbox/event.js';
export { EVENT_ID_MAX_AGE_MS, EVENT_ID_MAX_SKEW_MS, EVENT_ID_REUSE_WINDOW_MS } from './constants.js';
export type { OutboxEventInput } from './outbox/event.js';
export type { EncodeContext, EncoderResult, PayloadEncoder } from './outbox/encoding.js';
export {
  CE_HEADERS,
  CLOUDEVENTS_SPEC_VERSION,
  HEADER_CONTENT_TYPE,
  JSON_CONTENT_TYPE,
  readCloudEventAttributes,
} from './outbox/cloud-events.js';
export type { CloudEventAttributes, CloudEventsOptions } from './outbox/cloud-events.js';
export { HEADER_TRACEPARENT, HEADER_TRACESTATE } from './tracing.js';
export { migrate, MIN_SERVER_VERSION_NUM } from './migrate.js';
export type { MigrateOptions, MigrateResult } from './migrate.js';
export { joinTransaction, runTransaction, withPgTransaction } from './database.js';
export type { TransactionHandle, Queryable, DatabaseHandle, TransactionOf } from './database.js';
export { DEFAULT_SCHEMA, OUTBOX_LANES } from './schema.js';
export { ensureTopics, isRetriableKafkaError } from './kafka/topics.js';
export { applyKafkajsRequestQueueFix } from './kafka/kafkajs/fix.js';
export type { KafkajsFixOutcome } from './kafka/kafkajs/fix.js';
export type { EnsureTopicsOptions, EnsureTopicsResult } from './kafka/topics.js';
export type { Logger } from './logger.js';
export { fullJitterBackoffMs } from './backoff.js';
export {
  ERROR_CODES,
  OutboxkitError,
  isOutboxkitError,
  InvalidOptionsError,
  InvalidEventError,
  NotInTransactionError,
  UnsupportedServerError,
  MigrationError,
  TopicMissingError,
  LifecycleError,
  SchemaMissingError,
  EventEncodingError,
  BrokerUnavailableError,
  InvalidKafkaConfigError,
} from './errors.js';
export type { ErrorCode, OutboxkitErrorOptions } from './errors.js';
export {
  resolveKafkaConfig,
  kafkaConfigFromEnv,
  KAFKA_CONFIG_DEFAULTS,
  KAFKA_SASL_MECHANISMS,
  KAFKA_COMPRESSIONS,
} from './kafka/config.js';
export type {
  ResolvedKafkaConfig,
  ResolveKafkaConfigOptions,
  RedactedKafkaConfig,
  KafkaConfigFile,
  KafkaConfigFlags,
  KafkaProducerSettings,
  KafkaConsumerSettings,
  KafkaSaslMechanism,
  KafkaCompression,
} from './kafka/config.js';

// Idempotency keys: the one-transaction mode, HTTP problem responses.
export * from './idempotency/index.js';
