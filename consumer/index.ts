/**
 * `outboxkit/consumer`: the dedup consumer (docs/guarantees.md, G4-G6).
 */
export {
  createDedupConsumer,
  type DedupConsumer,
  type DedupConsumerHealth,
  type DedupConsumerState,
} from './dedup-consumer.js';
export type { PartitionHealth, PartitionWait } from './partition-health.js';
export {
  DEDUP_CONSUMER_DEFAULTS,
  resolveDedupConsumerOptions,
  type DedupConsumerHooks,
  type DedupConsumerOptions,
  type DedupHandler,
  type HandlerContext,
} from './options.js';
export type { ConsumedEvent, EventDecoder } from './consumed-event.js';
export { readCloudEventAttributes, type CloudEventAttributes } from '../src/outbox/cloud-events.js';
export type { DedupConsumerEvents, DedupConsumerListener, MessagePosition } from './events.js';
export {
  DEAD_LETTER_REASON_INVALID_EVENT_ID,
  HEADER_DLQ_ATTEMPTS,
  HEADER_DLQ_CONSUMER_GROUP,
  HEADER_DLQ_FAILED_AT,
  HEADER_DLQ_ORIGINAL_OFFSET,
  HEADER_DLQ_ORIGINAL_PARTITION,
  HEADER_DLQ_ORIGINAL_TOPIC,
  HEADER_DLQ_REASON,
} from './dead-letter.js';
export {
  readDeadLetters,
  replayDeadLetters,
  type DeadLetterRecord,
  type DeadLetters,
  type ReadDeadLettersOptions,
  type ReplayDeadLettersOptions,
  type ReplayResult,
} from './dead-letter-replay.js';
export type { DeadLetterSummary } from './dead-letter.js';
export {
  CLEANUP_INBOX_DEFAULTS,
  cleanupInbox,
  DEFAULT_INBOX_RETENTION_MS,
  type CleanupInboxOptions,
} from './inbox-cleanup.js';
export { resetConsumerProgress, type ResetConsumerProgressOptions } from './progress.js';
export { InboxUnavailableError, InvalidMessageError, RetryLaterError, type RetryLaterErrorOptions } from './errors.js';
export { consumerMetrics, HANDLER_DURATION_BUCKETS } from './metrics.js';
