/**
 * Reading a {@link SendResult}: for callers that treat a send as all or nothing (the relay's
 * passes, a dead letter, a replay).
 */
import type { KafkaFailure, SendResult } from './types.js';

/** The failure of the first record that was not written, if any. */
export function firstFailure(result: SendResult): KafkaFailure | undefined {
  for (const outcome of result.outcomes) if (!outcome.ok) return outcome.failure;
  return undefined;
}

/** Throws the client's error of the first record that was not written, if any. */
export function throwIfFailed(result: SendResult): void {
  const failure = firstFailure(result);
  if (failure) throw failure.error;
}

/** True when the broker refused the record (or its batch) as larger than the topic accepts. */
export function isTooLarge(failure: KafkaFailure): boolean {
  return failure.code === 'MESSAGE_TOO_LARGE' || failure.code === 'RECORD_LIST_TOO_LARGE';
}
