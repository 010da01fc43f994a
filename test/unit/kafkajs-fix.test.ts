/**
 * The replacement of kafkajs' RequestQueue#scheduleCheckPendingRequests (src/kafkajs-fix.ts), on
 * plain objects with fake timers: it still schedules a check whenever one has work to do.
 * test/kafka/kafkajs-fix.test.ts runs it against the broker.
 */
import { createRequire } from 'node:module';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { applyKafkajsRequestQueueFix } from '../../src/kafkajs-fix.js';

interface Queue {
  throttledUntil: number;
  throttleCheckTimeoutId: NodeJS.Timeout | null;
  pending: unknown[];
  checks: number;
  checkPendingRequests(): void;
  scheduleCheckPendingRequests(): void;
}

const { prototype } = createRequire(import.meta.url)('kafkajs/src/network/requestQueue/index.js') as {
  prototype: object;
};

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
