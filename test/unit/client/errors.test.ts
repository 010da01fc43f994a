/**
 * The idempotent client's errors are outboxkit errors: codes in ERROR_CODES, recognised by
 * isOutboxkitError() as every other error of outboxkit, and still by isClientError().
 */
import { describe, expect, it } from 'vitest';
import { createIdempotentClient, isClientError } from '../../../src/client/index.js';
import { ERROR_CODES, isOutboxkitError, OutboxkitError } from '../../../src/errors.js';
import { CLIENT_ERROR_CODES } from '../../../src/client/errors.js';

function clientAnswering(status: number, maxAttempts = 1) {
  return createIdempotentClient({
    baseUrl: 'http://127.0.0.1:1',
    maxAttempts,
    fetch: async () => new Response('{}', { status, headers: { 'content-type': 'application/json' } }),
  });
}

describe('idempotent client errors', () => {
  it('have their codes in ERROR_CODES', () => {
    for (const code of CLIENT_ERROR_CODES) expect(ERROR_CODES).toContain(code);
  });

  it('a rejected request is an OutboxkitError with OUTBOXKIT_CLIENT_REJECTED, not retriable', async () => {
    const err = await clientAnswering(422)
      .post('/orders', { a: 1 })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OutboxkitError);
    expect(isOutboxkitError(err, 'OUTBOXKIT_CLIENT_REJECTED')).toBe(true);
    expect(isClientError(err, 'OUTBOXKIT_CLIENT_REJECTED')).toBe(true);
    expect((err as OutboxkitError).retriable).toBe(false);
    expect((err as Error).name).toBe('RequestRejectedError');
  });

  it('retries exhausted is an OutboxkitError with OUTBOXKIT_CLIENT_GAVE_UP, retriable', async () => {
    const err = await clientAnswering(503, 1)
      .post('/orders', { a: 1 })
      .catch((e: unknown) => e);
    expect(isOutboxkitError(err, 'OUTBOXKIT_CLIENT_GAVE_UP')).toBe(true);
    expect(isClientError(err)).toBe(true);
    expect((err as OutboxkitError).retriable).toBe(true);
    // Another outboxkit error is not a client error.
    expect(isClientError(new OutboxkitError('OUTBOXKIT_INVALID_OPTIONS', 'x'))).toBe(false);
  });
});
