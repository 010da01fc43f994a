/**
 * `weakAcksReason()`: the topic settings under which acks=all does not protect an acknowledged
 * event against one broker's loss (issue 16: `outboxkit topics ensure` warns of them).
 */
import { describe, expect, it } from 'vitest';
import { weakAcksReason } from '../../../src/kafka/topics.js';

describe('weakAcksReason', () => {
  it('replication factor 1 is weak whatever min.insync.replicas says', () => {
    for (const minIsr of [undefined, 1, 2]) expect(weakAcksReason(1, minIsr)).toMatch(/^replication factor 1: /);
  });

  it('min.insync.replicas 1 with 3 replicas or more is weak', () => {
    expect(weakAcksReason(3, 1)).toMatch(/^min\.insync\.replicas 1 with 3 replicas: .*set min\.insync\.replicas to 2/);
    expect(weakAcksReason(5, 1)).toMatch(/with 5 replicas/);
  });

  it('is not weak: 3 replicas with min.insync.replicas 2, 2 replicas with 1, an unknown min.insync.replicas', () => {
    expect(weakAcksReason(3, 2)).toBeUndefined();
    expect(weakAcksReason(2, 1)).toBeUndefined();
    expect(weakAcksReason(3, undefined)).toBeUndefined();
  });
});
