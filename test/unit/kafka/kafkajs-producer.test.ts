/**
 * The kafkajs adapter's producer (src/kafka/kafkajs/producer.ts) as pure mapping logic, over a
 * fake kafkajs `Kafka` that records what it is asked: the safety settings, the compression codec
 * by name or by id, an outcome per record (every record of a failed request gets its failure,
 * classified by kafkajs's error type), serialised sends, the deprecated `createKafkajsProducer`
 * rejecting as before, and a `RelayProducer` wrapped. The real broker runs them in test/relay/.
 */
import { CompressionTypes, KafkaJSNumberOfRetriesExceeded, KafkaJSProtocolError } from 'kafkajs';
import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import {
  createKafkajsProducer,
  fromRelayProducer,
  kafkajsProducer,
  unacknowledgedPartitions,
} from '../../../src/kafka/kafkajs/producer.js';
import type { Kafka } from '../../../src/kafka/kafkajs/client.js';
import type { OutboundRecord } from '../../../src/kafka/types.js';

interface SendBatchCall {
  acks: number;
  timeout: number;
  compression: number;
  topicMessages: { topic: string; messages: { key: unknown; value: unknown; partition?: number }[] }[];
  /** What kafkajs would answer when every partition chosen (3 per topic) was acknowledged. */
  answers: { topicName: string; partition: number }[];
}

type Partitioner = (args: { topic: string; partitionMetadata: unknown[]; message: unknown }) => number;

/**
 * A fake kafkajs client whose producer's sendBatch asks the configured partitioner for each message
 * (3 partitions per topic), as kafkajs does, then runs `answer` (by default: every partition answered).
 */
function fakeKafka(answer: (call: SendBatchCall) => Promise<unknown> = async (call) => call.answers) {
  const producerConfigs: Record<string, unknown>[] = [];
  const calls: SendBatchCall[] = [];
  /** What happened to each kafkajs producer made, in order: 'connect', 'send', 'disconnect'. */
  const lives: string[][] = [];
  const partitionMetadata = [0, 1, 2].map((partitionId) => ({ partitionId, leader: 1 }));
  const kafka = {
    producer(config: Record<string, unknown>) {
      producerConfigs.push(config);
      const partitioner = (config.createPartitioner as () => Partitioner)();
      const life: string[] = [];
      lives.push(life);
      return {
        connect: async () => void life.push('connect'),
        disconnect: async () => void life.push('disconnect'),
        sendBatch: (batch: Omit<SendBatchCall, 'answers'>) => {
          life.push('send');
          const chosen = new Set<string>();
          const answers: SendBatchCall['answers'] = [];
          for (const { topic, messages } of batch.topicMessages) {
            for (const message of messages) {
              const partition = partitioner({ topic, partitionMetadata, message });
              if (!chosen.has(`${topic}-${partition}`)) answers.push({ topicName: topic, partition });
              chosen.add(`${topic}-${partition}`);
            }
          }
          const call = { ...batch, answers };
          calls.push(call);
          return answer(call);
        },
      };
    },
    admin: () => ({ connect: async () => {}, disconnect: async () => {}, describeCluster: async () => ({}) }),
    consumer: () => ({}),
  } as unknown as Kafka;
  return { kafka, producerConfigs, calls, lives };
}

const record = (topic: string, key: string | null = 'k'): OutboundRecord => ({
  topic,
  key,
  value: Buffer.from('v'),
  headers: { h: '1' },
});

const protocolError = (type: string) =>
  new KafkaJSProtocolError({ message: type, type, code: 0, retriable: false } as never);

describe('the kafkajs producer', () => {
  it('is idempotent with one request in flight, no topic auto-creation and finite retries', () => {
    const { kafka, producerConfigs } = fakeKafka();
    kafkajsProducer(kafka, { retries: 3, retryInitialMs: 100, retryMaxMs: 2_000 });
    kafkajsProducer(kafka, {});
    expect(producerConfigs[0]).toMatchObject({
      idempotent: true,
      maxInFlightRequests: 1,
      allowAutoTopicCreation: false,
      retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 2_000 },
    });
    expect(typeof producerConfigs[0]!.createPartitioner).toBe('function');
    // Without retry timings, the client's own apply (kafkajs merges them).
    expect(producerConfigs[1]!.retry).toEqual({ retries: 5 });
  });

  it('sends acks=all with the codec named or given by id, and refuses an unknown setting', async () => {
    const { kafka, calls } = fakeKafka();
    await kafkajsProducer(kafka).send([record('a')]);
    await kafkajsProducer(kafka, { compression: 'gzip', requestTimeoutMs: 1_234 }).send([record('a')]);
    await kafkajsProducer(kafka, { compression: CompressionTypes.GZIP }).send([record('a')]);
    expect(calls.map((c) => [c.acks, c.compression, c.timeout])).toEqual([
      [-1, CompressionTypes.None, 30_000],
      [-1, CompressionTypes.GZIP, 1_234],
      [-1, CompressionTypes.GZIP, 30_000],
    ]);
    let err: unknown;
    try {
      kafkajsProducer(kafka, { compresion: 'gzip' } as never);
    } catch (e) {
      err = e;
    }
    expect(isOutboxkitError(err, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
  });

  it('gives every record of a failed send its failure: a record error by its type, through kafkajs wrappers', async () => {
    const tooLarge = protocolError('MESSAGE_TOO_LARGE');
    const missing = new KafkaJSNumberOfRetriesExceeded(protocolError('UNKNOWN_TOPIC_OR_PARTITION'), {
      retryCount: 5,
      retryTime: 100,
    });
    const down = new Error('Connection error: ECONNREFUSED');
    const answers = [tooLarge, missing, down];
    const { kafka, calls } = fakeKafka(async () => {
      throw answers.shift();
    });
    const producer = kafkajsProducer(kafka);
    const a = await producer.send([record('t1'), record('t2', null), record('t1', 'other')]);
    const b = await producer.send([record('t1')]);
    const c = await producer.send([record('t1')]);
    // One request per send, the records grouped by topic, in order.
    expect(calls[0]!.topicMessages.map((t) => [t.topic, t.messages.map((m) => m.key)])).toEqual([
      ['t1', ['k', 'other']],
      ['t2', [null]],
    ]);
    expect(a.outcomes).toHaveLength(3);
    for (const outcome of a.outcomes) {
      expect(outcome).toEqual({ ok: false, failure: { kind: 'record', code: 'MESSAGE_TOO_LARGE', error: tooLarge } });
    }
    expect(b.outcomes).toEqual([
      { ok: false, failure: { kind: 'record', code: 'UNKNOWN_TOPIC_OR_PARTITION', error: missing } },
    ]);
    expect(c.outcomes).toEqual([{ ok: false, failure: { kind: 'broker', error: down } }]);
  });

  it('acknowledged records are ok; sends are serialised; onSend says each one (a throw of it is ignored)', async () => {
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let inFlight = 0;
    let most = 0;
    const { kafka } = fakeKafka(async (call) => {
      most = Math.max(most, ++inFlight);
      await held;
      inFlight--;
      return call.answers;
    });
    const sent: { records: number; ok: boolean }[] = [];
    const producer = kafkajsProducer(kafka, {
      onSend: ({ records, ok }) => {
        sent.push({ records, ok });
        throw new Error('metrics down');
      },
    });
    const first = producer.send([record('a'), record('a')]);
    const second = producer.send([record('a')]);
    await new Promise((r) => setTimeout(r, 10));
    release();
    expect((await first).outcomes).toEqual([{ ok: true }, { ok: true }]);
    expect((await second).outcomes).toEqual([{ ok: true }]);
    expect(most).toBe(1);
    expect(sent).toEqual([
      { records: 2, ok: true },
      { records: 1, ok: true },
    ]);
  });

  it('a send kafkajs resolved without an answer for a partition fails (a broker failure) instead of passing as written', async () => {
    // kafkajs 2.2.4 can resolve a send without writing a partition whose leader moved during it
    // (tulios/kafkajs#1798): its answer then lacks that partition.
    const { kafka } = fakeKafka(async (call) => call.answers.slice(0, 1));
    const producer = kafkajsProducer(kafka);
    const keys = Array.from({ length: 30 }, (_, i) => `key-${i}`);
    const { outcomes } = await producer.send(keys.map((k) => record('t', k)));
    expect(outcomes).toHaveLength(30);
    for (const outcome of outcomes) {
      expect(outcome.ok).toBe(false);
      if (outcome.ok) continue;
      expect(outcome.failure.kind).toBe('broker');
      expect(isOutboxkitError(outcome.failure.error, 'OUTBOXKIT_BROKER_UNAVAILABLE')).toBe(true);
      expect(outcome.failure.error.message).toMatch(/without an acknowledgement for t-\d, t-\d/);
    }
  });

  it('createKafkajsProducer (deprecated) rejects with kafkajs’s error, as before', async () => {
    const tooLarge = protocolError('MESSAGE_TOO_LARGE');
    const { kafka, producerConfigs } = fakeKafka(async () => {
      throw tooLarge;
    });
    const producer = createKafkajsProducer(kafka);
    await expect(producer.send([record('a')])).rejects.toBe(tooLarge);
    // The relay's retry timing inside one send.
    expect(producerConfigs[0]!.retry).toEqual({ retries: 5, initialRetryTime: 100, maxRetryTime: 2_000 });
  });

  it('a RelayProducer: its rejection read as kafkajs’s for every record; no probe without a client', async () => {
    const missing = Object.assign(new Error('gone'), { type: 'UNKNOWN_TOPIC_OR_PARTITION' });
    let fail = true;
    const wrapped = fromRelayProducer({
      connect: async () => {},
      disconnect: async () => {},
      send: async () => {
        if (fail) throw missing;
      },
    });
    expect(wrapped.probe).toBeUndefined();
    expect((await wrapped.send([record('a'), record('b')])).outcomes).toEqual([
      { ok: false, failure: { kind: 'record', code: 'UNKNOWN_TOPIC_OR_PARTITION', error: missing } },
      { ok: false, failure: { kind: 'record', code: 'UNKNOWN_TOPIC_OR_PARTITION', error: missing } },
    ]);
    fail = false;
    expect((await wrapped.send([record('a')])).outcomes).toEqual([{ ok: true }]);
  });
});

describe('the kafkajs producer after a failed send (C09: its sequence numbers may be behind the broker)', () => {
  it('sends the next records through a new kafkajs producer (a new producer id), the old one disconnected; not after a success', async () => {
    let fail = 1;
    const { kafka, lives, producerConfigs } = fakeKafka(async (call) => {
      if (fail-- > 0) throw new Error('Connection error: read ECONNRESET');
      return call.answers;
    });
    const producer = kafkajsProducer(kafka, { retries: 2 });
    await producer.connect();
    expect((await producer.send([record('a')])).outcomes[0]!.ok).toBe(false);
    expect((await producer.send([record('a')])).outcomes[0]!.ok).toBe(true);
    expect((await producer.send([record('a')])).outcomes[0]!.ok).toBe(true);
    // The same settings for the replacement (idempotent, acks=all, one request in flight).
    expect(producerConfigs[1]).toMatchObject({ idempotent: true, maxInFlightRequests: 1, retry: { retries: 2 } });
    await producer.disconnect();
    expect(lives).toEqual([
      ['connect', 'send', 'disconnect'],
      ['connect', 'send', 'send', 'disconnect'],
    ]);
  });

  it('replaces it also after a send kafkajs resolved without an answer for a partition', async () => {
    const { kafka, lives } = fakeKafka(async (call) => (lives.length === 1 ? [] : call.answers));
    const producer = kafkajsProducer(kafka);
    await producer.connect();
    expect((await producer.send([record('a')])).outcomes[0]!.ok).toBe(false);
    expect((await producer.send([record('a')])).outcomes[0]!.ok).toBe(true);
    expect(lives.map((l) => l.join(','))).toEqual(['connect,send,disconnect', 'connect,send']);
  });

  it('fails the send whose replacement cannot connect, and tries again at the next one', async () => {
    let fail = 1;
    let connects = 0;
    const { kafka, lives } = fakeKafka(async (call) => {
      if (fail-- > 0) throw new Error('Connection error: read ECONNRESET');
      return call.answers;
    });
    const make = kafka.producer.bind(kafka);
    (kafka as { producer: unknown }).producer = (config: never) => {
      const p = make(config);
      const connect = p.connect;
      p.connect = async () => {
        if (++connects === 2) throw new Error('Connection error: connect ECONNREFUSED');
        return connect();
      };
      return p;
    };
    const producer = kafkajsProducer(kafka);
    await producer.connect();
    expect((await producer.send([record('a')])).outcomes[0]!.ok).toBe(false);
    const refused = (await producer.send([record('a')])).outcomes[0]!;
    expect(refused).toMatchObject({ ok: false, failure: { kind: 'broker' } });
    expect((await producer.send([record('a')])).outcomes[0]!.ok).toBe(true);
    expect(lives.map((l) => l.join(','))).toEqual(['connect,send,disconnect', 'disconnect', 'connect,send']);
  });
});

describe('unacknowledgedPartitions (a send kafkajs resolved without an answer for some partition)', () => {
  it('names the topic-partitions sent that no answer covers, once each', () => {
    const sent = new Map([
      ['a', [0, 1, 1]],
      ['b', [0]],
    ]);
    expect(unacknowledgedPartitions(sent, (p) => p, [{ topicName: 'a', partition: 0 }])).toEqual(['a-1', 'b-0']);
    expect(
      unacknowledgedPartitions(sent, (p) => p, [
        { topicName: 'a', partition: 0 },
        { topicName: 'a', partition: 1 },
        { topicName: 'b', partition: 0 },
      ]),
    ).toEqual([]);
  });

  it('counts a message whose partition was never chosen as unacknowledged', () => {
    expect(
      unacknowledgedPartitions(new Map([['a', [undefined]]]), (p) => p, [{ topicName: 'a', partition: 0 }]),
    ).toEqual(['a-?']);
  });
});
