/**
 * consumer/retry.ts without infrastructure: attempt counting per partition, the decision after a
 * failed run (interrupted, retry, dead-letter, error), full-jitter backoff from an injected random
 * source, and partitions paused and resumed by injected timers.
 */
import { describe, expect, it } from 'vitest';
import { ConnectionLostError, HandlerFailure, swallowedFailure } from '../../../consumer/classify-error.js';
import { InvalidMessageError, RetryLaterError } from '../../../consumer/errors.js';
import { Retries, type Timers } from '../../../consumer/retry.js';

const POLICY = { maxAttempts: 3, retryInitialMs: 100, retryMaxMs: 1_000, maxRetryLaterMs: 10_000 };
const at = (offset: string, partition = 0) => ({ topic: 'orders', partition, offset });
const withCode = (code: string) => Object.assign(new Error(code), { code });

/** A run of message `offset` that failed with `error`, as the consumer reports it. */
function fail(retries: Retries, offset: string, error: unknown, options: { aborted?: boolean; value?: Buffer } = {}) {
  const position = at(offset);
  const pending = retries.pendingOf(position);
  return retries.afterFailure(position, pending, {
    attempt: pending.attempts + 1,
    error,
    aborted: options.aborted ?? false,
    value: options.value ?? null,
  });
}

/** Timers run by hand: `tick(ms)` fires those due. */
function manualTimers(): Timers & { tick(ms: number): void; pending(): number } {
  let now = 0;
  const timers = new Map<number, { at: number; callback: () => void }>();
  let nextId = 1;
  return {
    setTimeout(callback, ms) {
      const id = nextId++;
      timers.set(id, { at: now + ms, callback });
      return id;
    },
    clearTimeout(timer) {
      timers.delete(timer as number);
    },
    tick(ms) {
      now += ms;
      for (const [id, t] of [...timers]) {
        if (t.at <= now) {
          timers.delete(id);
          t.callback();
        }
      }
    },
    pending: () => timers.size,
  };
}

describe('Retries: attempts', () => {
  it('counts handler failures of one message, and starts again at a new offset', () => {
    const retries = new Retries(POLICY, { random: () => 0.5 });
    expect(fail(retries, '7', new HandlerFailure(new Error('boom')))).toMatchObject({ kind: 'retry' });
    expect(retries.pendingOf(at('7')).attempts).toBe(1);
    expect(fail(retries, '7', new HandlerFailure(new Error('boom')))).toMatchObject({ kind: 'retry' });
    expect(retries.pendingOf(at('7')).attempts).toBe(2);
    // The partition moved on: the next message counts from 0.
    expect(retries.pendingOf(at('8'))).toEqual({ offset: '8', attempts: 0, infraFailures: 0 });
  });

  it('dead-letters at maxAttempts, with the reason kept for a failed dead-letter send', () => {
    const retries = new Retries(POLICY);
    fail(retries, '1', new HandlerFailure(new Error('boom')));
    fail(retries, '1', new HandlerFailure(new Error('boom')));
    const error = new Error('still boom');
    expect(fail(retries, '1', new HandlerFailure(error))).toEqual({
      kind: 'dead-letter',
      reason: 'Error: still boom',
      error,
    });
    expect(retries.pendingOf(at('1')).deadLetter).toEqual({ reason: 'Error: still boom', error });
  });

  it('dead-letters an InvalidMessageError at once, never quoting the message value in the reason', () => {
    const retries = new Retries(POLICY);
    const decision = fail(retries, '1', new HandlerFailure(new InvalidMessageError('card 4111111111111111 declined')), {
      value: Buffer.from('{"card":"4111111111111111"}'),
    });
    expect(decision).toMatchObject({ kind: 'dead-letter', reason: 'InvalidMessageError: card … declined' });
    expect(retries.pendingOf(at('1')).attempts).toBe(1);
  });

  it('counts a swallowed failed statement as the handler’s', () => {
    const retries = new Retries({ ...POLICY, maxAttempts: 1 });
    expect(fail(retries, '1', swallowedFailure(withCode('25P02')))).toMatchObject({ kind: 'dead-letter' });
  });

  it('never counts a stop or a rebalance (interrupted)', () => {
    const retries = new Retries(POLICY);
    expect(fail(retries, '1', new HandlerFailure(new Error('aborted')), { aborted: true })).toEqual({
      kind: 'interrupted',
    });
    expect(retries.pendingOf(at('1'))).toEqual({ offset: '1', attempts: 0, infraFailures: 0 });
  });

  it('never counts failures outside the handler, nor the consumer’s lost connection: they only pace the backoff', () => {
    const retries = new Retries({ ...POLICY, maxAttempts: 1 }, { random: () => 0.999 });
    const lockTimeout = withCode('55P03');
    expect(fail(retries, '1', lockTimeout)).toEqual({ kind: 'error', delayMs: 99, error: lockTimeout });
    const lost = new ConnectionLostError(withCode('57P01'), new Error('Connection terminated'));
    expect(fail(retries, '1', lost)).toEqual({ kind: 'error', delayMs: 199, error: lost });
    expect(fail(retries, '1', withCode('ECONNREFUSED'))).toMatchObject({ kind: 'error', delayMs: 399 });
    expect(retries.pendingOf(at('1'))).toEqual({ offset: '1', attempts: 0, infraFailures: 3 });
  });

  it.each(['ECONNRESET', 'ETIMEDOUT', 'ECONNREFUSED', 'UND_ERR_CONNECT_TIMEOUT', '57P01', '08006', '53300'])(
    'C31 counts what the handler threw with code %s as an attempt: its code says nothing of the consumer’s connection',
    (code) => {
      const retries = new Retries({ ...POLICY, maxAttempts: 2 }, { random: () => 0.5 });
      const err = new TypeError('fetch failed', { cause: withCode(code) });
      expect(fail(retries, '1', new HandlerFailure(withCode(code)))).toMatchObject({ kind: 'retry' });
      expect(fail(retries, '1', new HandlerFailure(err))).toMatchObject({ kind: 'dead-letter', error: err });
      expect(retries.pendingOf(at('1'))).toMatchObject({ attempts: 2, infraFailures: 0 });
    },
  );

  it('keeps the state of the failed message when a later one of its batch was read meanwhile', () => {
    const retries = new Retries(POLICY);
    const pending = retries.pendingOf(at('1'));
    retries.pendingOf(at('2')); // batch scope: the next message joined the transaction
    retries.afterFailure(at('1'), pending, { attempt: 1, error: new HandlerFailure(1), aborted: false, value: null });
    expect(retries.pendingOf(at('1')).attempts).toBe(1);
  });

  it('forgets a partition’s message once resolved, only that message; forgets unowned partitions', () => {
    const retries = new Retries(POLICY);
    fail(retries, '1', new HandlerFailure(new Error('x')));
    retries.resolved(at('0'));
    expect(retries.pendingOf(at('1')).attempts).toBe(1);
    retries.resolved(at('1'));
    expect(retries.pendingOf(at('1')).attempts).toBe(0);

    fail(retries, '1', new HandlerFailure(new Error('x')));
    retries.forget(at('5'));
    expect(retries.pendingOf(at('1')).attempts).toBe(0);

    for (const partition of [0, 1, 2]) {
      const position = at('9', partition);
      retries.afterFailure(position, retries.pendingOf(position), {
        attempt: 1,
        error: new HandlerFailure(1),
        aborted: false,
        value: null,
      });
    }
    retries.keepOnly({ orders: [1], payments: [0] });
    expect([0, 1, 2].map((p) => retries.pendingOf(at('9', p)).attempts)).toEqual([0, 1, 0]);
    retries.clear();
    expect(retries.pendingOf(at('9', 1)).attempts).toBe(0);
  });
});

describe('Retries: backoff (full jitter)', () => {
  it('draws below min(retryMaxMs, retryInitialMs * 2^(n-1)) for retry n', () => {
    const top = new Retries({ ...POLICY, maxAttempts: 10 }, { random: () => 0.999999 });
    const delays = [1, 2, 3, 4, 5].map(() => {
      const d = fail(top, '1', new HandlerFailure(new Error('x')));
      return d.kind === 'retry' ? d.delayMs : -1;
    });
    expect(delays).toEqual([99, 199, 399, 799, 999]);
    const bottom = new Retries(POLICY, { random: () => 0 });
    expect(fail(bottom, '1', new HandlerFailure(new Error('x')))).toMatchObject({ kind: 'retry', delayMs: 0 });
  });

  it('grows the delay of failures outside the handler with their own run', () => {
    const retries = new Retries(POLICY, { random: () => 0.5 });
    const pending = retries.pendingOf(at('1'));
    expect([1, 2, 3, 4, 5].map(() => retries.afterError(pending))).toEqual([50, 100, 200, 400, 500]);
  });
});

describe('Retries: paused partitions', () => {
  it('pauses at once and resumes after the delay', () => {
    const timers = manualTimers();
    const retries = new Retries(POLICY, { timers });
    const log: string[] = [];
    retries.pauseFor(
      () => {
        log.push('paused');
        return () => log.push('resumed');
      },
      250,
      () => log.push('resume failed'),
    );
    expect(log).toEqual(['paused']);
    timers.tick(249);
    expect(log).toEqual(['paused']);
    timers.tick(1);
    expect(log).toEqual(['paused', 'resumed']);
    expect(timers.pending()).toBe(0);
  });

  it('hands a failed resume to onResumeError (the consumer restarted meanwhile)', () => {
    const timers = manualTimers();
    const retries = new Retries(POLICY, { timers });
    const errors: unknown[] = [];
    const err = new Error('not running');
    retries.pauseFor(
      () => () => {
        throw err;
      },
      10,
      (e) => errors.push(e),
    );
    timers.tick(10);
    expect(errors).toEqual([err]);
  });

  it('cancels every resume on stop', () => {
    const timers = manualTimers();
    const retries = new Retries(POLICY, { timers });
    let resumed = 0;
    for (const ms of [10, 20])
      retries.pauseFor(
        () => () => resumed++,
        ms,
        () => {},
      );
    retries.cancelResumes();
    expect(timers.pending()).toBe(0);
    timers.tick(100);
    expect(resumed).toBe(0);
  });
});

describe('Retries: RetryLaterError', () => {
  /** A clock moved by hand. */
  function clock() {
    let t = 1_000;
    return { now: () => t, advance: (ms: number) => (t += ms) };
  }

  it('defers without counting an attempt, waiting the delay asked for (or the backoff of the nth deferral)', () => {
    const c = clock();
    const retries = new Retries({ ...POLICY, maxAttempts: 1 }, { random: () => 0.999, now: c.now });
    const later = new RetryLaterError('downstream down', { delayMs: 250 });
    expect(fail(retries, '1', new HandlerFailure(later))).toEqual({
      kind: 'deferred',
      delayMs: 250,
      error: later,
      retryLater: { deferrals: 1, deferredMs: 0, counted: false },
    });
    c.advance(300);
    // No delay asked for: full jitter below min(retryMaxMs, retryInitialMs * 2^(n-1)) for deferral n = 2.
    expect(fail(retries, '1', new HandlerFailure(new RetryLaterError('again')))).toMatchObject({
      kind: 'deferred',
      delayMs: 199,
      retryLater: { deferrals: 2, deferredMs: 300, counted: false },
    });
    expect(retries.pendingOf(at('1'))).toMatchObject({ attempts: 0, infraFailures: 0 });
  });

  it('holds maxRetryLaterMs: the last wait is cut to what is left, and then a RetryLaterError counts as an attempt', () => {
    const c = clock();
    const retries = new Retries({ ...POLICY, maxAttempts: 2, maxRetryLaterMs: 10_000 }, { now: c.now });
    const later = (delayMs: number) => new HandlerFailure(new RetryLaterError('downstream down', { delayMs }));
    expect(fail(retries, '1', later(4_000))).toMatchObject({ kind: 'deferred', delayMs: 4_000 });
    c.advance(4_000);
    expect(fail(retries, '1', later(4_000))).toMatchObject({ kind: 'deferred', delayMs: 4_000 });
    c.advance(4_000);
    // 8 s deferred: 2 s left, so a wait of an hour is cut to 2 s.
    expect(fail(retries, '1', later(3_600_000))).toMatchObject({
      kind: 'deferred',
      delayMs: 2_000,
      retryLater: { deferrals: 3, deferredMs: 8_000, counted: false },
    });
    c.advance(2_000);
    const counted = fail(retries, '1', later(1_000));
    expect(counted).toMatchObject({ kind: 'retry', retryLater: { deferrals: 3, deferredMs: 10_000, counted: true } });
    expect(retries.pendingOf(at('1')).attempts).toBe(1);
    const last = fail(retries, '1', later(1_000));
    expect(last).toMatchObject({
      kind: 'dead-letter',
      reason: 'RetryLaterError: downstream down',
      retryLater: { counted: true },
    });
  });

  it('counts every RetryLaterError with maxRetryLaterMs 0, and starts the bound again for the next message', () => {
    const c = clock();
    const off = new Retries({ ...POLICY, maxRetryLaterMs: 0 }, { now: c.now });
    expect(fail(off, '1', new HandlerFailure(new RetryLaterError('x', { delayMs: 5 })))).toMatchObject({
      kind: 'retry',
      retryLater: { deferrals: 0, deferredMs: 0, counted: true },
    });
    const retries = new Retries({ ...POLICY, maxRetryLaterMs: 1_000 }, { now: c.now });
    fail(retries, '1', new HandlerFailure(new RetryLaterError('x', { delayMs: 5 })));
    c.advance(5_000);
    expect(fail(retries, '2', new HandlerFailure(new RetryLaterError('x', { delayMs: 5 })))).toMatchObject({
      kind: 'deferred',
      retryLater: { deferrals: 1, deferredMs: 0 },
    });
  });
});
