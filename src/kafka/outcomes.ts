/**
 * Reading a {@link SendResult}: for callers that treat a send as all or nothing (the relay's
 * passes, a dead letter, a replay).
 */
import type { KafkaFailure, ProducerRecord, ProducerSettings, SendResult } from './types.js';

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

/**
 * What every producer adapter's `send()` shares: sends run one after another (each once the one
 * before it settled, whatever its outcome), `onSend` hears of each with its duration in ms (a
 * metrics hook that throws never fails a send), and every record of a send gets the send's
 * outcome. `attempt` makes one send and resolves with its failure, or `undefined`; it never rejects.
 */
export function serialisedSends(
  onSend: ProducerSettings['onSend'],
  attempt: (records: readonly ProducerRecord[]) => Promise<KafkaFailure | undefined>,
): (records: readonly ProducerRecord[]) => Promise<SendResult> {
  let tail: Promise<unknown> = Promise.resolve();
  return (records) => {
    const run = async (): Promise<SendResult> => {
      const began = performance.now();
      const failure = await attempt(records);
      try {
        onSend?.({ records: records.length, durationMs: performance.now() - began, ok: failure === undefined });
      } catch {
        // metrics must never fail a send
      }
      return { outcomes: records.map(() => (failure ? { ok: false, failure } : { ok: true })) };
    };
    const result = tail.then(run, run);
    tail = result.catch(() => undefined);
    return result;
  };
}
