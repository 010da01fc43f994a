import { describe, expect, it } from 'vitest';
import { MarkQueue, type MarkBatch } from '../../../relay/mark-queue.js';
import type { HeldLane } from '../../../relay/sql.js';

function batch(seqs: number[], held: HeldLane[] = [{ lane: 1, token: '7' }]): MarkBatch {
  return { seqs: seqs.map(String), lanes: [1], held, leases: held.map((h) => `${h.lane}:${h.token}`).join(',') };
}

/** A mark function whose statements the test completes by hand. */
function statements() {
  const calls: {
    seqs: string[];
    held: readonly HeldLane[];
    resolve: (n: number) => void;
    reject: (e: Error) => void;
  }[] = [];
  const mark = (seqs: string[], held: readonly HeldLane[]) =>
    new Promise<number>((resolve, reject) => calls.push({ seqs, held, resolve, reject }));
  return { calls, mark };
}

const tick = () => new Promise((r) => setImmediate(r));

describe('MarkQueue', () => {
  it('marks a batch at once, and the batches acknowledged meanwhile together in the next statement', async () => {
    const { calls, mark } = statements();
    const marked: [string[], number][] = [];
    const q = new MarkQueue(mark, (batches, n) => marked.push([batches.flatMap((b) => b.seqs), n]));
    q.add(batch([1, 2]));
    expect(calls.map((c) => c.seqs)).toEqual([['1', '2']]);
    q.add(batch([3]));
    q.add(batch([4, 5]));
    // One statement at a time: 3, 4 and 5 wait, and are still pending in the table (a read skips them).
    expect(calls).toHaveLength(1);
    expect(q.pendingSeqs()).toEqual(['1', '2', '3', '4', '5']);
    expect(q.size).toBe(5);
    calls[0]!.resolve(2);
    await tick();
    expect(calls.map((c) => c.seqs)).toEqual([
      ['1', '2'],
      ['3', '4', '5'],
    ]);
    calls[1]!.resolve(3);
    await q.settle();
    expect(marked).toEqual([
      [['1', '2'], 2],
      [['3', '4', '5'], 3],
    ]);
    expect(q.pendingSeqs()).toEqual([]);
  });

  it('marks batches read under other leases in statements of their own, each with its fencing tokens', async () => {
    const { calls, mark } = statements();
    const q = new MarkQueue(mark, () => {});
    const before = [{ lane: 1, token: '7' }];
    const after = [{ lane: 1, token: '8' }];
    q.add(batch([1], before));
    q.add(batch([2], before));
    q.add(batch([3], after));
    calls[0]!.resolve(1);
    await tick();
    calls[1]!.resolve(1);
    await tick();
    calls[2]!.resolve(1);
    await q.settle();
    expect(calls.map((c) => [c.seqs, c.held])).toEqual([
      [['1'], before],
      [['2'], before],
      [['3'], after],
    ]);
  });

  it('reports a failed marking once, and still marks the batches queued behind it', async () => {
    const { calls, mark } = statements();
    const q = new MarkQueue(mark, () => {});
    q.add(batch([1]));
    q.add(batch([2]));
    calls[0]!.reject(new Error('connection lost'));
    await tick();
    expect(calls.map((c) => c.seqs)).toEqual([['1'], ['2']]);
    expect(() => q.takeFailure()).toThrow('connection lost');
    expect(() => q.takeFailure()).not.toThrow();
    calls[1]!.resolve(1);
    await expect(q.settle()).resolves.toBeUndefined();
  });

  it('counts a throw of onMarked as a failed marking (settle rethrows it)', async () => {
    const { calls, mark } = statements();
    const q = new MarkQueue(mark, () => {
      throw new Error('listener failed');
    });
    q.add(batch([1]));
    calls[0]!.resolve(1);
    await expect(q.settle()).rejects.toThrow('listener failed');
  });

  it('drainTo waits for the statement in flight only while more rows than asked wait', async () => {
    const { calls, mark } = statements();
    const q = new MarkQueue(mark, () => {});
    q.add(batch([1, 2, 3]));
    await q.drainTo(3); // 3 rows wait: no need to wait
    let drained = false;
    const waiting = q.drainTo(2).then(() => (drained = true));
    await tick();
    expect(drained).toBe(false);
    calls[0]!.resolve(3);
    await waiting;
    expect(q.size).toBe(0);
  });

  it('ignores an empty batch (a send that failed before any acknowledgement)', () => {
    const { calls, mark } = statements();
    const q = new MarkQueue(mark, () => {});
    q.add(batch([]));
    expect(calls).toHaveLength(0);
    expect(q.size).toBe(0);
  });
});
