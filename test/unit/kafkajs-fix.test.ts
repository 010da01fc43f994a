/**
 * The replacement of kafkajs' RequestQueue#scheduleCheckPendingRequests (src/kafka/kafkajs/fix.ts): on
 * plain objects with fake timers (it schedules a check whenever one has work to do), then on a real
 * kafkajs RequestQueue driven through its public methods (every request is sent, through the
 * in-flight limit, a request timeout and broker throttling, and no timer is left armed when idle).
 * test/kafka/kafkajs-fix.test.ts runs it against the broker.
 */
import { createRequire } from 'node:module';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { applyKafkajsRequestQueueFix } from '../../src/kafka/kafkajs/fix.js';

interface Queue {
  throttledUntil: number;
  throttleCheckTimeoutId: NodeJS.Timeout | null;
  pending: unknown[];
  checks: number;
  checkPendingRequests(): void;
  scheduleCheckPendingRequests(): void;
}

interface RealQueue {
  throttleCheckTimeoutId: NodeJS.Timeout | null;
  push(request: { entry: Entry; expectResponse: boolean; sendRequest(): void }): void;
  fulfillRequest(response: { correlationId: number; payload: Buffer; size: number }): void;
  maybeThrottle(ms: number): void;
  scheduleRequestTimeoutCheck(): void;
  checkPendingRequests(): void;
  destroy(): void;
}
interface Entry {
  correlationId: number;
  resolve(value: unknown): void;
  reject(error: unknown): void;
}

const RequestQueue = createRequire(import.meta.url)('kafkajs/src/network/requestQueue/index.js') as {
  prototype: object;
  new (options: object): RealQueue;
};
const { prototype } = RequestQueue;

function queue(state: { throttledUntil?: number; pending?: number }): Queue {
  const q = Object.create(prototype) as Queue;
  q.throttledUntil = state.throttledUntil ?? -1;
  q.throttleCheckTimeoutId = null;
  q.pending = Array.from({ length: state.pending ?? 0 });
  q.checks = 0;
  q.checkPendingRequests = () => void q.checks++;
  return q;
}

describe('applyKafkajsRequestQueueFix', () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: 1_000_000 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('applies once to the installed kafkajs 2.2.4, then says so', () => {
    expect(['applied', 'already-applied']).toContain(applyKafkajsRequestQueueFix());
    expect(applyKafkajsRequestQueueFix()).toBe('already-applied');
  });

  it('nothing pending, not throttled: no timer (the 1 ms loop of the defect)', () => {
    applyKafkajsRequestQueueFix();
    const q = queue({});
    q.scheduleCheckPendingRequests();
    expect(q.throttleCheckTimeoutId).toBeNull();
    expect(vi.getTimerCount()).toBe(0);
  });

  it('requests pending, not throttled: a check in 10 ms, as kafkajs does', () => {
    applyKafkajsRequestQueueFix();
    const q = queue({ pending: 2 });
    q.scheduleCheckPendingRequests();
    vi.advanceTimersByTime(9);
    expect(q.checks).toBe(0);
    vi.advanceTimersByTime(1);
    expect(q.checks).toBe(1);
    expect(q.throttleCheckTimeoutId).toBeNull();
  });

  it('throttled by the broker: a check when the throttling ends, pending or not', () => {
    applyKafkajsRequestQueueFix();
    for (const pending of [0, 3]) {
      const q = queue({ throttledUntil: Date.now() + 250, pending });
      q.scheduleCheckPendingRequests();
      vi.advanceTimersByTime(249);
      expect(q.checks).toBe(0);
      vi.advanceTimersByTime(1);
      expect(q.checks).toBe(1);
    }
  });

  it('one timer at a time', () => {
    applyKafkajsRequestQueueFix();
    const q = queue({ pending: 1 });
    q.scheduleCheckPendingRequests();
    q.scheduleCheckPendingRequests();
    expect(vi.getTimerCount()).toBe(1);
  });
});

describe('a real kafkajs RequestQueue with the fix', () => {
  it('sends every request (in-flight limit, a timed-out request, throttling), then arms no timer while idle', async () => {
    expect(['applied', 'already-applied']).toContain(applyKafkajsRequestQueueFix());
    const quiet = () => undefined;
    const q = new RequestQueue({
      maxInFlightRequests: 1,
      requestTimeout: 40,
      enforceRequestTimeout: true,
      clientId: 'test',
      broker: 'test:9092',
      logger: { debug: quiet, info: quiet, warn: quiet, error: quiet },
    });
    q.scheduleRequestTimeoutCheck();
    const sent: number[] = [];
    const settled = new Map<number, string>();
    const push = (correlationId: number) => {
      const entry: Entry = {
        correlationId,
        resolve: () => void settled.set(correlationId, 'answered'),
        reject: () => void settled.set(correlationId, 'timed out'),
      };
      q.push({ entry, expectResponse: true, sendRequest: () => void sent.push(correlationId) });
    };
    const answer = (correlationId: number) => q.fulfillRequest({ correlationId, payload: Buffer.alloc(0), size: 0 });
    const until = async (what: () => boolean) => {
      for (let i = 0; i < 200 && !what(); i++) await new Promise((r) => setTimeout(r, 5));
      expect(what()).toBe(true);
    };
    try {
      push(1);
      push(2);
      push(3);
      expect(sent).toEqual([1]); // one in flight at a time
      answer(1);
      expect(sent).toEqual([1, 2]);
      await until(() => sent.length === 3); // 2 times out: its timeout sends 3
      expect(settled.get(2)).toBe('timed out');
      answer(3);
      q.maybeThrottle(30); // the broker asks for 30 ms of quiet
      push(4);
      expect(sent).toEqual([1, 2, 3]);
      await until(() => sent.length === 4); // sent when the throttling ends, by the scheduled check
      answer(4);
      expect([...settled.entries()].sort()).toEqual([
        [1, 'answered'],
        [2, 'timed out'],
        [3, 'answered'],
        [4, 'answered'],
      ]);
      // Idle: stock kafkajs re-arms a 1 ms timer here forever.
      let checks = 0;
      const check = q.checkPendingRequests.bind(q);
      q.checkPendingRequests = () => {
        checks++;
        check();
      };
      await new Promise((r) => setTimeout(r, 50));
      expect(checks).toBe(0);
      expect(q.throttleCheckTimeoutId).toBeNull();
    } finally {
      q.destroy();
    }
  });
});
