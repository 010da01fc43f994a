/**
 * `outboxkit/kafka`: outboxkit's Kafka boundary and its kafkajs adapter.
 *
 * - The interfaces the relay, the dedup consumer and the CLI use (`KafkaClient`, `KafkaProducer`,
 *   `KafkaAdmin`, `GroupConsumer`), and `createKafkajsClient()`, which implements them over kafkajs;
 *   `createPlatformaticClient()` implements the producer and admin over @platformatic/kafka (an
 *   optional peer dependency, loaded on first connect; docs/kafka.md, "Choosing a client").
 * - `ensureTopics()`, the Kafka settings (`resolveKafkaConfig()`, `kafkaConfigFromEnv()`), kafkajs's
 *   error classification and the fix of its idle timer loop.
 *
 * Importing it loads kafkajs; the package root (`outboxkit`) does not.
 */
export type {
  CompressionCodec,
  GroupConsumer,
  GroupConsumerEvents,
  GroupConsumerRun,
  GroupConsumerSettings,
  InboundBatch,
  InboundMessage,
  KafkaAdmin,
  KafkaClient,
  KafkaFailure,
  KafkaProducer,
  OutboundRecord,
  PartitionOffsets,
  ProducerMessage,
  ProducerRecord,
  ProducerSettings,
  RecordHeaders,
  RecordHeaderValue,
  RecordOutcome,
  SendResult,
  TopicPartitions,
  TopicSpec,
} from './types.js';
export { firstFailure, isTooLarge, throwIfFailed } from './outcomes.js';
export { createKafkajsClient } from './kafkajs/client.js';
export type { KafkajsClientOptions, KafkajsLogLevel } from './kafkajs/client.js';
export { isRetriableKafkaError } from './kafkajs/errors.js';
export { createPlatformaticClient } from './platformatic/client.js';
export { applyKafkajsRequestQueueFix } from './kafkajs/fix.js';
export type { KafkajsFixOutcome } from './kafkajs/fix.js';
export { applyKafkajsMetadataFix } from './kafkajs/metadata-fix.js';
export { applyPlatformaticMetadataFix } from './platformatic/metadata-fix.js';
export type { PlatformaticFixOutcome } from './platformatic/metadata-fix.js';
export { ensureTopics, weakAcksReason } from './topics.js';
export type { EnsureTopicsOptions, EnsureTopicsResult } from './topics.js';
export {
  resolveKafkaConfig,
  kafkaConfigFromEnv,
  KAFKA_CONFIG_DEFAULTS,
  KAFKA_SASL_MECHANISMS,
  KAFKA_COMPRESSIONS,
} from './config.js';
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
} from './config.js';
