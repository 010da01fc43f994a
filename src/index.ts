/**
 * outboxkit: safe retries across PostgreSQL and Apache Kafka.
 *
 * - `enqueue()` / `createOutbox()`: the transactional outbox writer.
 * - `migrate()`: creates and upgrades outboxkit's tables.
 * - Errors: every error is an `OutboxkitError` with a stable `code`.
 *
 * Importing it loads no Kafka client (test/unit/kafka/root-import.test.ts): the Kafka helpers
 * live in `outboxkit/kafka`; their names here are deprecated aliases, and `ensureTopics` loads
 * kafkajs only when called.
 */
import * as kafkaConfig from './kafka/config.js';
import * as kafkajsErrors from './kafka/kafkajs/errors.js';
import * as kafkajsFix from './kafka/kafkajs/fix.js';
import type { Kafka } from './kafka/kafkajs/client.js';
import type * as kafkaTopics from './kafka/topics.js';
import type { KafkaClient, TopicSpec } from './kafka/types.js';

export { enqueue, createOutbox, notifyChannel, OUTBOX_DEFAULTS, OUTBOX_SOURCES } from './outbox/enqueue.js';
export { ENQUEUE_LOCK_TABLE_ENTRIES } from './constants.js';
export type { Outbox, OutboxOptions, OutboxSource, EnqueuedEvent } from './outbox/enqueue.js';
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
export { walPublicationName } from './schema-name.js';
export type { MigrateOptions, MigrateResult } from './migrate.js';
export { joinTransaction, runTransaction, withPgTransaction } from './database.js';
export type { TransactionHandle, Queryable, DatabaseHandle, TransactionOf } from './database.js';
export { DEFAULT_SCHEMA, OUTBOX_LANES } from './constants.js';
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
  KafkaClientUnavailableError,
  WalStreamError,
  PermissionDeniedError,
} from './errors.js';
export type { ErrorCode, OutboxkitErrorOptions } from './errors.js';
// Idempotency keys: the one-transaction mode, HTTP problem responses.
export * from './idempotency/index.js';

// ------------------------------------------------------------------------------------------------
// Deprecated aliases of `outboxkit/kafka`, which loads kafkajs: none of these does at import (the
// modules they come from import kafkajs's types only, and ensureTopics loads it when called).
// ------------------------------------------------------------------------------------------------

/** @deprecated import from 'outboxkit/kafka' */
export const resolveKafkaConfig = kafkaConfig.resolveKafkaConfig;
/** @deprecated import from 'outboxkit/kafka' */
export const kafkaConfigFromEnv = kafkaConfig.kafkaConfigFromEnv;
/** @deprecated import from 'outboxkit/kafka' */
export const KAFKA_CONFIG_DEFAULTS = kafkaConfig.KAFKA_CONFIG_DEFAULTS;
/** @deprecated import from 'outboxkit/kafka' */
export const KAFKA_SASL_MECHANISMS = kafkaConfig.KAFKA_SASL_MECHANISMS;
/** @deprecated import from 'outboxkit/kafka' */
export const KAFKA_COMPRESSIONS = kafkaConfig.KAFKA_COMPRESSIONS;
/** @deprecated import from 'outboxkit/kafka' */
export type ResolvedKafkaConfig = kafkaConfig.ResolvedKafkaConfig;
/** @deprecated import from 'outboxkit/kafka' */
export type ResolveKafkaConfigOptions = kafkaConfig.ResolveKafkaConfigOptions;
/** @deprecated import from 'outboxkit/kafka' */
export type RedactedKafkaConfig = kafkaConfig.RedactedKafkaConfig;
/** @deprecated import from 'outboxkit/kafka' */
export type KafkaConfigFile = kafkaConfig.KafkaConfigFile;
/** @deprecated import from 'outboxkit/kafka' */
export type KafkaConfigFlags = kafkaConfig.KafkaConfigFlags;
/** @deprecated import from 'outboxkit/kafka' */
export type KafkaProducerSettings = kafkaConfig.KafkaProducerSettings;
/** @deprecated import from 'outboxkit/kafka' */
export type KafkaConsumerSettings = kafkaConfig.KafkaConsumerSettings;
/** @deprecated import from 'outboxkit/kafka' */
export type KafkaSaslMechanism = kafkaConfig.KafkaSaslMechanism;
/** @deprecated import from 'outboxkit/kafka' */
export type KafkaCompression = kafkaConfig.KafkaCompression;
/** @deprecated import from 'outboxkit/kafka' */
export const isRetriableKafkaError = kafkajsErrors.isRetriableKafkaError;
/** @deprecated import from 'outboxkit/kafka' */
export const applyKafkajsRequestQueueFix = kafkajsFix.applyKafkajsRequestQueueFix;
/** @deprecated import from 'outboxkit/kafka' */
export type KafkajsFixOutcome = kafkajsFix.KafkajsFixOutcome;
/** @deprecated import from 'outboxkit/kafka' */
export type EnsureTopicsOptions = kafkaTopics.EnsureTopicsOptions;
/** @deprecated import from 'outboxkit/kafka' */
export type EnsureTopicsResult = kafkaTopics.EnsureTopicsResult;

/**
 * See `ensureTopics` of `outboxkit/kafka`, which this loads (and kafkajs with it) when called.
 *
 * @deprecated import from 'outboxkit/kafka'
 */
export async function ensureTopics(
  kafka: Kafka | KafkaClient,
  topics: TopicSpec[],
  options?: EnsureTopicsOptions,
): Promise<EnsureTopicsResult> {
  const topicsModule = await import('./kafka/topics.js');
  return topicsModule.ensureTopics(kafka, topics, options);
}
