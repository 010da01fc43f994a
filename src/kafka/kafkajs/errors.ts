/**
 * Tells a Kafka error that belongs to one record (the record is too large, its topic is missing or
 * forbidden) from one that belongs to the connection or the cluster (broker down, leader moving,
 * timeouts). In the relay only the first kind counts against a row's attempts and can park it: a
 * broker outage must never park healthy events. The dedup consumer uses it for its dead-letter
 * sends. Errors are recognised by kafkajs' protocol error `type`, never by message text.
 */

/** Kafka protocol error types that are a property of the record or its topic. */
export const RECORD_ERROR_TYPES = new Set([
  'MESSAGE_TOO_LARGE',
  'RECORD_LIST_TOO_LARGE',
  'INVALID_RECORD',
  'CORRUPT_MESSAGE',
  'UNKNOWN_TOPIC_OR_PARTITION',
  'TOPIC_AUTHORIZATION_FAILED',
  'INVALID_TOPIC_EXCEPTION',
  'POLICY_VIOLATION',
  'INVALID_REQUIRED_ACKS',
]);

/** The protocol error type of `err` or of an error it wraps, if any. */
export function kafkaErrorType(err: unknown): string | undefined {
  const seen = new Set<unknown>();
  let current: unknown = err;
  while (current && typeof current === 'object' && !seen.has(current)) {
    seen.add(current);
    const type = (current as { type?: unknown }).type;
    if (typeof type === 'string') return type;
    const next = current as { cause?: unknown; originalError?: unknown; errors?: unknown[] };
    current = next.cause ?? next.originalError ?? next.errors?.[0];
  }
  return undefined;
}

/**
 * True when `err` is about the records sent, not the connection. kafkajs wraps some of these (a
 * missing topic comes as KafkaJSNumberOfRetriesExceeded whose `cause` has the type), so the
 * chain of causes is followed.
 */
export function isRecordError(err: unknown): boolean {
  const type = kafkaErrorType(err);
  return type !== undefined && RECORD_ERROR_TYPES.has(type);
}

/** True when the broker refused the record (or its batch) as larger than the topic accepts. */
export function isTooLargeError(err: unknown): boolean {
  const type = kafkaErrorType(err);
  return type === 'MESSAGE_TOO_LARGE' || type === 'RECORD_LIST_TOO_LARGE';
}
