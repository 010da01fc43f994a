/** outboxkit/relay: publishes committed outbox events to Kafka. */
export { Relay, createRelay, RELAY_DEFAULTS, resolveRelayOptions } from './relay.js';
export type { RelayOptions, ResolvedRelayOptions, RelayEvents } from './relay.js';
export { createKafkajsProducer, SAFE_PRODUCER_CONFIG } from '../src/kafka/kafkajs/producer.js';
export type { RelayProducer, OutboundRecord, KafkajsProducerOptions } from '../src/kafka/kafkajs/producer.js';
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
export type { RelayReadiness, RelayMetricsOptions, ServeMetricsOptions } from './metrics.js';
