/** outboxkit/relay: publishes committed outbox events to Kafka. */
export { Relay, createRelay, RELAY_DEFAULTS, resolveRelayOptions } from './relay.js';
export type { RelayOptions, ResolvedRelayOptions, RelayEvents } from './relay.js';
export { createKafkajsProducer, SAFE_PRODUCER_CONFIG } from './producer.js';
export type { RelayProducer, OutboundRecord } from './producer.js';
export { releaseOwner, laneOwners, backlog } from './sql.js';
