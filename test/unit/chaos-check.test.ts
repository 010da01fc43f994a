/**
 * The chaos harness's checker must be able to fail: a clean run passes, and each deliberately
 * broken ledger or end state is reported under its invariant, with the ids involved.
 */
import { describe, expect, it } from 'vitest';
import { checkRun, type InvariantId, type Observed, type Operation } from '../../chaos/check.js';

const ORDER_1 = '00000000-0000-4000-8000-000000000001';
const ORDER_2 = '00000000-0000-4000-8000-000000000002';
const EVENT_1 = '01900000-0000-7000-8000-000000000001';
const EVENT_2 = '01900000-0000-7000-8000-000000000002';

/** Two orders of one customer, published and applied in commit order, both answered and replayed. */
function cleanRun(): { operations: Operation[]; observed: Observed } {
  const answer = (orderId: string) => JSON.stringify({ orderId });
  const operations: Operation[] = [
    {
      tenant: 't',
      key: 'key-1-aaaaaaaa',
      cartId: 'cart-1',
      customerId: 'c1',
      body: '{"cartId":"cart-1"}',
      attempts: [
        { status: undefined, replayed: false, body: '' },
        { status: 201, replayed: false, body: answer(ORDER_1) },
        { status: 201, replayed: true, body: answer(ORDER_1) },
      ],
      reuse: { body: '{"cartId":"cart-1","amount":2}', attempts: [{ status: 422, replayed: false, body: '{}' }] },
    },
    {
      tenant: 't',
      key: 'key-2-bbbbbbbb',
      cartId: 'cart-2',
      customerId: 'c1',
      body: '{"cartId":"cart-2"}',
      attempts: [
        { status: 409, replayed: false, body: '{}' },
        { status: 201, replayed: false, body: answer(ORDER_2) },
      ],
    },
  ];
  const observed: Observed = {
    orders: [
      { id: ORDER_1, tenant: 't', cartId: 'cart-1', customerId: 'c1' },
      { id: ORDER_2, tenant: 't', cartId: 'cart-2', customerId: 'c1' },
    ],
    outbox: [
      { eventId: EVENT_1, orderId: ORDER_1, key: 'c1' },
      { eventId: EVENT_2, orderId: ORDER_2, key: 'c1' },
    ],
    stuckKeys: [],
    shipments: [
      { orderId: ORDER_1, eventId: EVENT_1, applications: 1, appliedSeq: 1, customerId: 'c1', customerVersion: 1 },
      { orderId: ORDER_2, eventId: EVENT_2, applications: 1, appliedSeq: 2, customerId: 'c1', customerVersion: 2 },
    ],
    published: [
      { partition: 0, offset: '0', eventId: EVENT_1, key: 'c1', orderId: ORDER_1, customerVersion: 1 },
      { partition: 0, offset: '1', eventId: EVENT_2, key: 'c1', orderId: ORDER_2, customerVersion: 2 },
      // A relay republish after a crash: a later duplicate does not count for the order.
      { partition: 0, offset: '2', eventId: EVENT_1, key: 'c1', orderId: ORDER_1, customerVersion: 1 },
    ],
    deadLetters: [],
  };
  return { operations, observed };
}

function violationsOf(result: ReturnType<typeof checkRun>): Partial<Record<InvariantId, string[]>> {
  return Object.fromEntries(result.invariants.filter((i) => i.violations.length > 0).map((i) => [i.id, i.violations]));
}

describe('chaos checker', () => {
  it('passes a clean run (late duplicates in Kafka are fine)', () => {
    const { operations, observed } = cleanRun();
    const result = checkRun(operations, observed);
    expect(violationsOf(result)).toEqual({});
    expect(result.violations).toBe(0);
  });

  it('reports an effect applied twice', () => {
    const { operations, observed } = cleanRun();
    observed.shipments[0]!.applications = 2;
    const result = checkRun(operations, observed);
    expect(violationsOf(result)).toEqual({ 'effect-duplicated': [`order ${ORDER_1}: effect applied 2 times`] });
  });

  it('reports a committed event that was never published', () => {
    const { operations, observed } = cleanRun();
    observed.published = observed.published.filter((m) => m.eventId !== EVENT_2);
    const v = violationsOf(checkRun(operations, observed));
    expect(v['committed-unpublished']).toEqual([`event ${EVENT_2} (order ${ORDER_2})`]);
  });

  it('reports an outbox row left neither published nor parked after the drain (a WAL relay that never deleted it)', () => {
    const { operations, observed } = cleanRun();
    // Published to Kafka, yet its row is still in the table: the relay did not finish its work.
    observed.leftPending = [{ eventId: EVENT_2, orderId: ORDER_2 }];
    const v = violationsOf(checkRun(operations, observed));
    expect(v).toEqual({ 'left-pending': [`event ${EVENT_2} (order ${ORDER_2}): row neither published nor parked`] });
  });

  it('--cluster: reports an audit event committed and not in its topic, or there without its row; duplicates are fine', () => {
    const { operations, observed } = cleanRun();
    observed.otherTopics = [{ topic: 'audit', committed: ['a1', 'a2'], published: ['a1', 'a1', 'a2'] }];
    expect(violationsOf(checkRun(operations, observed))).toEqual({});
    observed.otherTopics = [{ topic: 'audit', committed: ['a1', 'a2'], published: ['a1', 'a3'] }];
    expect(violationsOf(checkRun(operations, observed))).toEqual({
      'committed-unpublished': ['event a2 (topic audit) not in its topic'],
      'rolled-back-published': ['event a3 published to audit, never committed'],
    });
  });

  it('reports a key whose first occurrences are out of commit order', () => {
    const { operations, observed } = cleanRun();
    observed.published[0]!.offset = '5';
    const v = violationsOf(checkRun(operations, observed));
    expect(v['key-order']).toEqual([`key c1 in Kafka: version 1 (event ${EVENT_1}) after version 2`]);
  });

  it('reports effects applied out of order at the consumer', () => {
    const { operations, observed } = cleanRun();
    observed.shipments[0]!.appliedSeq = 3;
    const v = violationsOf(checkRun(operations, observed));
    expect(v['key-order']).toEqual([`key c1 at the consumer: version 1 (order ${ORDER_1}) applied after version 2`]);
  });

  it('reports an event published from a rolled-back transaction', () => {
    const { operations, observed } = cleanRun();
    const ghost = '01900000-0000-7000-8000-0000000000ff';
    observed.published.push({ partition: 1, offset: '0', eventId: ghost, key: 'c9', orderId: 'x', customerVersion: 1 });
    const v = violationsOf(checkRun(operations, observed));
    expect(v['rolled-back-published']).toEqual([`event ${ghost} (order x) published, never committed`]);
  });

  it('reports an effect never applied, unless the event was dead-lettered (listed)', () => {
    const { operations, observed } = cleanRun();
    observed.shipments.pop();
    expect(violationsOf(checkRun(operations, observed))['effect-missing']).toEqual([
      `order ${ORDER_2} (cart-2): never applied nor dead-lettered; p0@1, group offset unknown`,
    ]);
    // The group's committed offset tells a skipped event (a G4 breach) from one never consumed.
    expect(
      violationsOf(checkRun(operations, { ...observed, committedOffsets: new Map([[0, 1n]]) }))['effect-missing'],
    ).toEqual([`order ${ORDER_2} (cart-2): never applied nor dead-lettered; p0@1, group at 1 (not consumed)`]);
    expect(
      violationsOf(checkRun(operations, { ...observed, committedOffsets: new Map([[0, 2n]]) }))['effect-missing'],
    ).toEqual([
      `order ${ORDER_2} (cart-2): never applied nor dead-lettered; p0@1, group committed past it at 2 (skipped)`,
    ]);
    observed.deadLetters.push({ eventId: EVENT_2, orderId: ORDER_2, reason: 'Error: undeliverable' });
    const result = checkRun(operations, observed);
    expect(result.violations).toBe(0);
    expect(result.deadLetters).toHaveLength(1);
  });

  it('reports a record left processing, without printing the full key', () => {
    const { operations, observed } = cleanRun();
    observed.stuckKeys.push({ tenant: 't', key: 'secret-key-123', state: 'processing' });
    const v = violationsOf(checkRun(operations, observed));
    expect(v['stuck-processing']).toEqual(['tenant t, key secr…: processing']);
  });

  it('reports a replay that differs, and a reuse that was not refused', () => {
    const { operations, observed } = cleanRun();
    operations[0]!.attempts.push({ status: 201, replayed: true, body: JSON.stringify({ orderId: ORDER_2 }) });
    operations[0]!.reuse!.attempts.push({ status: 201, replayed: true, body: '{}' });
    const v = violationsOf(checkRun(operations, observed));
    expect(v['replay-differs']).toHaveLength(2);
    expect(v['replay-differs']![0]).toContain('cart-1 (key key-…)');
  });

  it('reports two executions of one key and a request never answered', () => {
    const { operations, observed } = cleanRun();
    const extra = '00000000-0000-4000-8000-000000000003';
    observed.orders.push({ id: extra, tenant: 't', cartId: 'cart-1', customerId: 'c1' });
    observed.outbox.push({ eventId: 'e3', orderId: extra, key: 'c1' });
    observed.published.push({
      partition: 0,
      offset: '3',
      eventId: 'e3',
      key: 'c1',
      orderId: extra,
      customerVersion: 3,
    });
    observed.shipments.push({
      orderId: extra,
      eventId: 'e3',
      applications: 1,
      appliedSeq: 3,
      customerId: 'c1',
      customerVersion: 3,
    });
    operations[1]!.attempts = [{ status: undefined, replayed: false, body: '' }];
    const v = violationsOf(checkRun(operations, observed));
    expect(v['executed-twice']).toEqual([`cart-1 (key key-…): 2 orders ${ORDER_1}, ${extra}`]);
    expect(v.unanswered).toEqual(['cart-2 (key key-…): no final answer in 1 attempts']);
  });
});
