/**
 * The dead-letter record: what the consumer writes when it gives up on a message (DESIGN G5).
 * Pure logic, no I/O.
 */
import type { IHeaders, KafkaMessage, Message } from 'kafkajs';

/** Why the message was dead-lettered: the fixed reason below, or the handler's error. */
export const HEADER_DLQ_REASON = 'dlq-reason';
/** The topic the message was read from. */
export const HEADER_DLQ_ORIGINAL_TOPIC = 'dlq-original-topic';
/** Its partition, as a decimal string. */
export const HEADER_DLQ_ORIGINAL_PARTITION = 'dlq-original-partition';
/** Its offset, as a decimal string. */
export const HEADER_DLQ_ORIGINAL_OFFSET = 'dlq-original-offset';
/** How many times the handler ran on it (0 when it never ran), as a decimal string. */
export const HEADER_DLQ_ATTEMPTS = 'dlq-attempts';
/** When the consumer gave up: an ISO 8601 UTC timestamp. */
export const HEADER_DLQ_FAILED_AT = 'dlq-failed-at';
/** The consumer group that gave up (replays usually target that group's handler). */
export const HEADER_DLQ_CONSUMER_GROUP = 'dlq-consumer-group';

/** The `dlq-reason` of a message without a usable event id (case C16). */
export const DEAD_LETTER_REASON_INVALID_EVENT_ID = 'missing or invalid event id';

/** Longest `dlq-reason` written, in characters; longer error messages are cut. */
export const MAX_DLQ_REASON_LENGTH = 1_000;

/** What the dead-letter record says about the failure. */
export interface DeadLetterInfo {
  reason: string;
  topic: string;
  partition: number;
  attempts: number;
  groupId: string;
  failedAt: Date;
}

/** The `dlq-reason` for an error a handler threw: `Name: message`, cut to a bounded length. */
export function reasonOf(err: unknown): string {
  const text = err instanceof Error ? `${err.name}: ${err.message}` : `non-error thrown: ${String(err)}`;
  return text.length > MAX_DLQ_REASON_LENGTH ? `${text.slice(0, MAX_DLQ_REASON_LENGTH - 1)}…` : text;
}

/**
 * The message to produce to the dead-letter topic: the original key and value byte for byte, the
 * original headers (raw, repeated names kept), and the `dlq-*` headers, which replace any that the
 * original carried (a replayed message that fails again records its latest failure).
 */
export function deadLetterMessage(message: KafkaMessage, info: DeadLetterInfo): Message {
  const headers: IHeaders = { ...(message.headers ?? {}) };
  headers[HEADER_DLQ_REASON] = info.reason;
  headers[HEADER_DLQ_ORIGINAL_TOPIC] = info.topic;
  headers[HEADER_DLQ_ORIGINAL_PARTITION] = String(info.partition);
  headers[HEADER_DLQ_ORIGINAL_OFFSET] = message.offset;
  headers[HEADER_DLQ_ATTEMPTS] = String(info.attempts);
  headers[HEADER_DLQ_FAILED_AT] = info.failedAt.toISOString();
  headers[HEADER_DLQ_CONSUMER_GROUP] = info.groupId;
  return { key: message.key, value: message.value, headers };
}
