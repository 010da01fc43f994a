/** outboxkit/relay: publishes committed outbox events to Kafka. */
import * as kafkajsProducer from '../src/kafka/kafkajs/producer.js';
import type * as kafkaTypes from '../src/kafka/types.js';

export { Relay, createRelay, RELAY_DEFAULTS, resolveRelayOptions } from './relay.js';
export type { RelayOptions, ResolvedRelayOptions, RelayEvents } from './relay.js';
export type { RelayProducer } from '../src/kafka/kafkajs/producer.js';
export { releaseOwner, laneOwners, backlog } from './sql.js';
// Metrics and health endpoints, for a relay embedded in an application process.
export {
  relayMetrics,
  relayReadiness,
  serveMetrics,
  PUBLISH_DURATION_BUCKETS,
  RELAY_METRICS_REFRESH_MS,
  DEFAULT_METRICS_HOST,
} from './metrics.js';
export type { RelayReadiness, RelayMetricsOptions, ServeMetricsOptions, WalRelayReadiness } from './metrics.js';
// The WAL source's relay (docs/wal-source.md): reads the outbox from a logical replication slot.
export { createWalRelay, WAL_RELAY_DEFAULTS } from './wal/wal-relay.js';
export type { WalRelay, WalRelayOptions, WalRelayEvents, WalResyncReason } from './wal/wal-relay.js';
export { ensureLogicalSlot, ensurePublication } from './wal/slot-sql.js';
export { walPublicationName, walSlotName } from '../src/schema-name.js';
export { WalStreamError } from '../src/errors.js';

// Deprecated aliases: the kafkajs producer moved behind outboxkit's Kafka boundary (outboxkit/kafka).

/** @deprecated use `createKafkajsClient(kafka).producer(settings)` from 'outboxkit/kafka' */
export const createKafkajsProducer = kafkajsProducer.createKafkajsProducer;
/** @deprecated the kafkajs adapter of 'outboxkit/kafka' applies it to every producer it makes */
export const SAFE_PRODUCER_CONFIG = kafkajsProducer.SAFE_PRODUCER_CONFIG;
/** @deprecated import `ProducerSettings` from 'outboxkit/kafka' */
export type KafkajsProducerOptions = kafkajsProducer.KafkajsProducerOptions;
/** @deprecated import from 'outboxkit/kafka' */
export type OutboundRecord = kafkaTypes.OutboundRecord;
