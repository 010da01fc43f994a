/**
 * The @platformatic/kafka producer adapter with a fake client (no broker): a send that outlives
 * `sendTimeoutMs` fails, and does not hold up the next send (C27 on the 3-node cluster: a Produce
 * request the broker held for `requestTimeoutMs` made every later send of other partitions wait
 * behind it, as sends are serialised).
 */
import { afterEach, describe, expect, it, vi } from 'vitest';

/** A fake client producer: a send with a record for partition 0 gets no answer until closed. */
class FakeProducer {
  static made: FakeProducer[] = [];
  closed = false;
  private hung: ((err: Error) => void)[] = [];
  constructor() {
    FakeProducer.made.push(this);
  }
  metadata() {
    return Promise.resolve({
      brokers: new Map([[1, {}]]),
      topics: new Map([['t', { partitionsCount: 2, partitions: [{ leader: 1 }, { leader: 1 }] }]]),
    });
  }
  send(options: { messages: { partition?: number }[] }) {
    if (this.closed) return Promise.reject(new Error('Connection pool is closed.'));
    if (options.messages.some((m) => m.partition === 0)) {
      return new Promise((_, reject) => this.hung.push(reject));
    }
    return Promise.resolve({ offsets: [] });
  }
  close() {
    this.closed = true;
    for (const reject of this.hung.splice(0)) reject(new Error('Connection closed'));
    return Promise.resolve();
  }
}

vi.mock('../../../src/kafka/platformatic/load.js', () => ({
  loadPlatformaticKafka: () => Promise.resolve({ Producer: FakeProducer, murmur2: () => 0, ProtocolError: Error }),
}));

const { platformaticProducer } = await import('../../../src/kafka/platformatic/producer.js');

const connection = { clientId: 'test', bootstrapBrokers: ['127.0.0.1:1'] };
const record = (partition: number) => ({ topic: 't', key: 'k', value: Buffer.from('v'), partition });

describe('@platformatic/kafka producer: sendTimeoutMs', () => {
  afterEach(() => {
    FakeProducer.made = [];
  });

  it('fails a send the broker does not answer after sendTimeoutMs, and the next send goes at once through a new client producer', async () => {
    const producer = platformaticProducer(connection, { sendTimeoutMs: 100 });
    await producer.connect();
    const began = performance.now();
    const held = await producer.send([record(0)]);
    expect(performance.now() - began).toBeLessThan(1_000);
    expect(held.outcomes[0]).toMatchObject({ ok: false, failure: { kind: 'broker' } });
    const failure = held.outcomes[0]!.ok ? undefined : held.outcomes[0]!.failure;
    expect(failure?.partitionUnavailable).toBeUndefined();
    expect(failure?.error.message).toMatch(/sendTimeoutMs \(100 ms\)/);
    // The client producer of the held request was closed (its request failed) and replaced.
    expect(FakeProducer.made[0]!.closed).toBe(true);

    // What the relay does after giving up on a send: the next one, for another partition.
    const other = await Promise.race([
      producer.send([record(1)]),
      new Promise<'still waiting'>((r) => setTimeout(() => r('still waiting'), 1_000)),
    ]);
    expect(other).toEqual({ outcomes: [{ ok: true }] });
    expect(FakeProducer.made).toHaveLength(2);
    expect(FakeProducer.made[1]!.closed).toBe(false);
    await producer.disconnect();
  });

  it('without sendTimeoutMs a send waits for the client as before', async () => {
    const producer = platformaticProducer(connection, {});
    await producer.connect();
    const held = producer.send([record(0)]);
    const outcome = await Promise.race([
      held,
      new Promise<'still waiting'>((r) => setTimeout(() => r('still waiting'), 300)),
    ]);
    expect(outcome).toBe('still waiting');
    await producer.disconnect(); // closes the client producer: the held request fails
    expect((await held).outcomes[0]).toMatchObject({ ok: false, failure: { kind: 'broker' } });
  });
});
