import {
  KafkaJSAggregateError,
  KafkaJSGroupCoordinatorNotFound,
  KafkaJSNumberOfRetriesExceeded,
  KafkaJSProtocolError,
} from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { isRetriableKafkaError } from '../../src/kafka/kafkajs/errors.js';

// kafkajs builds protocol errors from the protocol's error table (`retriable` included).
const protocolError = (type: string, retriable: boolean) =>
  new KafkaJSProtocolError({ message: type, type, code: 0, retriable } as never);

describe('isRetriableKafkaError', () => {
  it('a group coordinator not found (a broker loading __consumer_offsets after a restart) is retriable, although kafkajs says not', () => {
    const err = new (
      KafkaJSGroupCoordinatorNotFound as unknown as new (message: string) => Error & { retriable: boolean }
    )('Failed to find group coordinator');
    expect(err.retriable).toBe(false);
    expect(isRetriableKafkaError(err)).toBe(true);
  });

  it('follows kafkajs retriable flag, through retries-exceeded and aggregate errors', () => {
    const notHosted = protocolError('UNKNOWN_TOPIC_OR_PARTITION', true);
    const badFactor = protocolError('INVALID_REPLICATION_FACTOR', false);
    expect(isRetriableKafkaError(notHosted)).toBe(true);
    expect(isRetriableKafkaError(badFactor)).toBe(false);
    expect(
      isRetriableKafkaError(new KafkaJSNumberOfRetriesExceeded(notHosted, { retryCount: 5, retryTime: 100 })),
    ).toBe(true);
    expect(
      isRetriableKafkaError(new KafkaJSNumberOfRetriesExceeded(badFactor, { retryCount: 5, retryTime: 100 })),
    ).toBe(false);
    expect(isRetriableKafkaError(new KafkaJSAggregateError('x', [notHosted, notHosted]))).toBe(true);
    expect(isRetriableKafkaError(new KafkaJSAggregateError('x', [notHosted, badFactor]))).toBe(false);
    expect(isRetriableKafkaError(new Error('boom'))).toBe(false);
    expect(isRetriableKafkaError(null)).toBe(false);
  });
});
