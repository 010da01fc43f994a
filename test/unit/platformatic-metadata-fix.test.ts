/**
 * The @platformatic/kafka metadata fix (src/kafka/platformatic/metadata-fix.ts): a partition
 * without a leader (LEADER_NOT_AVAILABLE) or with a replica down (REPLICA_NOT_AVAILABLE) no longer
 * fails the whole Metadata answer; every other error still does. On the installed package's own
 * parsers, for every Metadata version it implements (v9-v12 in 1.35.0, v0-v12 in 2.12.1: run with
 * `bash scripts/platformatic-v2.sh test/unit/platformatic-metadata-fix.test.ts`), driven through the
 * client's own `Base.prototype[kGetApi]` with a connection that parses the answer's bytes as the
 * client's connection does. Also: a leader that is not in the metadata gives a retriable error
 * instead of a TypeError, and the producer adapter's placement of a send's records.
 * test/cluster/partial-outage runs the fix against a cluster with a dead broker.
 */
import * as kafka from '@platformatic/kafka';
import { afterAll, describe, expect, it } from 'vitest';
import { loadPlatformaticKafka } from '../../src/kafka/platformatic/load.js';
import {
  fixPlatformaticMetadata,
  onlyLeaderlessPartitions,
  platformaticMetadataVersions,
} from '../../src/kafka/platformatic/metadata-fix.js';
import { platformaticFailureOf } from '../../src/kafka/platformatic/errors.js';
import { placeMessages, type Message } from '../../src/kafka/platformatic/producer.js';

const { Base, Reader, Writer, kGetApi, kGetConnection, kListApis } = kafka as unknown as {
  Base: new (options: Record<string, unknown>) => Record<symbol, unknown> & { close(): Promise<void> };
  Reader: { from(writer: unknown): unknown };
  Writer: { create(): W };
  kGetApi: symbol;
  kGetConnection: symbol;
  kListApis: symbol;
};
const modules = kafka as unknown as Record<string, { parseResponse: Parse }>;
type Parse = (correlationId: number, apiKey: number, apiVersion: number, reader: unknown) => Answer;
type Callback = (error: unknown, result?: unknown) => void;
interface W {
  appendInt16(v: number): W;
  appendInt32(v: number): W;
  appendBoolean(v: boolean): W;
  appendString(v: string | null, compact?: boolean): W;
  appendUUID(v: string | null): W;
  appendArray<T>(v: T[], fn: (w: W, item: T) => void, compact?: boolean, tagged?: boolean): W;
  appendTaggedFields(): W;
}
interface Answer {
  brokers: { nodeId: number }[];
  topics: {
    errorCode: number;
    name: string;
    partitions: { errorCode: number; partitionIndex: number; leaderId: number }[];
  }[];
}

const versions = platformaticMetadataVersions(kafka as never);
/** The package's own parsers, taken before any test applies the fix (the fix leaves them as they are). */
const parse = (v: number): Parse => modules[`metadataV${v}`]!.parseResponse;

/**
 * The bytes of a Metadata answer of version `v` (Kafka's schema for it) with one broker and one
 * topic whose partitions carry `codes` (Kafka protocol error codes); a partition with code 5 has
 * leader -1.
 */
function answerBytes(v: number, codes: number[], topicErrorCode = 0): unknown {
  const flexible = v >= 9;
  const w = Writer.create();
  if (v >= 3) w.appendInt32(0); // throttle_time_ms
  w.appendArray(
    [1],
    (w, nodeId) => {
      w.appendInt32(nodeId).appendString('127.0.0.1', flexible).appendInt32(9092);
      if (v >= 1) w.appendString(null, flexible); // rack
    },
    flexible,
    flexible,
  );
  if (v >= 2) w.appendString('cluster', flexible);
  if (v >= 1) w.appendInt32(1); // controller_id
  w.appendArray(
    ['orders'],
    (w, name) => {
      w.appendInt16(topicErrorCode).appendString(name, flexible);
      if (v >= 10) w.appendUUID('a1b2c3d4-0000-0000-0000-000000000001');
      if (v >= 1) w.appendBoolean(false);
      w.appendArray(
        codes.map((code, index) => ({ code, index })),
        (w, { code, index }) => {
          w.appendInt16(code)
            .appendInt32(index)
            .appendInt32(code === 5 ? -1 : 1);
          if (v >= 7) w.appendInt32(0); // leader_epoch
          w.appendArray([1], (w, n) => w.appendInt32(n), flexible, false);
          w.appendArray(code === 5 ? [] : [1], (w, n) => w.appendInt32(n), flexible, false);
          if (v >= 5) w.appendArray(code === 5 ? [1] : [], (w, n) => w.appendInt32(n), flexible, false);
        },
        flexible,
        flexible,
      );
      if (v >= 8) w.appendInt32(-2147483648); // topic_authorized_operations
    },
    flexible,
    flexible,
  );
  if (v >= 8 && v <= 10) w.appendInt32(-2147483648); // cluster_authorized_operations
  if (flexible) w.appendTaggedFields();
  return Reader.from(w);
}

/** A connection whose `send` parses `reader` with the request's parser, as the client's connection does. */
function connectionAnswering(reader: () => unknown) {
  return {
    send(
      apiKey: number,
      apiVersion: number,
      _payload: unknown,
      parser: Parse,
      _requestTagged: boolean,
      _responseTagged: boolean,
      callback: Callback,
    ) {
      let error: unknown = null;
      let answer: unknown;
      try {
        answer = parser(1, apiKey, apiVersion, reader());
      } catch (err) {
        error = err;
      }
      callback(error, answer);
    },
  };
}

const clients: { close(): Promise<void> }[] = [];
afterAll(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
});

/** The Metadata API a client gets from `kGetApi` when the broker supports only version `v`. */
function metadataApi(v: number): Promise<(connection: unknown, ...args: unknown[]) => void> {
  const client = new Base({ clientId: 'test', bootstrapBrokers: ['127.0.0.1:1'] });
  clients.push(client);
  client[kListApis] = (callback: Callback) =>
    callback(null, [{ apiKey: 3, name: 'Metadata', minVersion: v, maxVersion: v }]);
  return new Promise((resolve, reject) => {
    (client[kGetApi] as (name: string, cb: Callback) => void).call(client, 'Metadata', (error, api) =>
      error ? reject(error as Error) : resolve(api as (connection: unknown, ...args: unknown[]) => void),
    );
  });
}

/** The answer of the Metadata API of version `v` to a request, given the answer's bytes. */
async function ask(v: number, codes: number[], topicErrorCode = 0): Promise<Answer> {
  const api = await metadataApi(v);
  return new Promise((resolve, reject) => {
    api(
      connectionAnswering(() => answerBytes(v, codes, topicErrorCode)),
      ['orders'],
      false,
      false,
      (error: unknown, answer: unknown) => (error ? reject(error as Error) : resolve(answer as Answer)),
    );
  });
}

describe('the @platformatic/kafka metadata fix', () => {
  it('finds the Metadata versions the installed package implements', () => {
    const major = (kafka as unknown as { clientSoftwareVersion: string }).clientSoftwareVersion.split('.')[0];
    const expected = major === '1' ? [9, 10, 11, 12] : [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    expect(versions).toEqual(expected);
  });

  it("the package's own parse fails a whole answer on one leaderless partition (what the fix is for)", async () => {
    for (const v of versions) {
      // Through the client's kGetApi before the package is loaded by outboxkit (so without the fix).
      await expect(ask(v, [0, 5]), `v${v}`).rejects.toMatchObject({ code: 'PLT_KFK_RESPONSE' });
      let thrown: unknown;
      try {
        parse(v)(1, 3, v, answerBytes(v, [0, 5]));
      } catch (err) {
        thrown = err;
      }
      expect(thrown, `v${v}`).toMatchObject({ code: 'PLT_KFK_RESPONSE' });
      expect((thrown as { errors: unknown[] }).errors, `v${v}`).toEqual([
        expect.objectContaining({ apiId: 'LEADER_NOT_AVAILABLE', path: '/topics/0/partitions/1' }),
      ]);
      // The parsed answer rides on the error: what the fix answers with.
      expect(onlyLeaderlessPartitions(thrown), `v${v}`).toBe(true);
    }
  });

  it('is applied by the loader, once per module', async () => {
    const loaded = await loadPlatformaticKafka();
    expect(fixPlatformaticMetadata(loaded)).toBe('already-applied');
  });

  it('keeps leaderless partitions (leader -1) and those with a replica down, in every Metadata version', async () => {
    await loadPlatformaticKafka();
    for (const v of versions) {
      const answer = await ask(v, [0, 5, 9]);
      expect(
        answer.brokers.map((b) => b.nodeId),
        `v${v}`,
      ).toEqual([1]);
      expect(
        answer.topics[0]!.partitions.map(({ errorCode, partitionIndex, leaderId }) => ({
          errorCode,
          partitionIndex,
          leaderId,
        })),
        `v${v}`,
      ).toEqual([
        { errorCode: 0, partitionIndex: 0, leaderId: 1 },
        { errorCode: 5, partitionIndex: 1, leaderId: -1 },
        { errorCode: 9, partitionIndex: 2, leaderId: 1 },
      ]);
      // An answer without errors is as before.
      expect((await ask(v, [0, 0])).topics[0]!.partitions, `v${v}`).toHaveLength(2);
    }
  });

  it('still fails on every other partition error, and on a topic error', async () => {
    await loadPlatformaticKafka();
    for (const v of versions) {
      // 3 UNKNOWN_TOPIC_OR_PARTITION beside a leaderless partition: the whole answer fails, with both.
      const unknown = await ask(v, [0, 5, 3]).catch((err: unknown) => err);
      expect(unknown, `v${v}`).toMatchObject({ code: 'PLT_KFK_RESPONSE' });
      expect(
        (unknown as { errors: { apiCode: number }[] }).errors.map((e) => e.apiCode),
        `v${v}`,
      ).toEqual([5, 3]);
      // 29 TOPIC_AUTHORIZATION_FAILED; 17 INVALID_TOPIC_EXCEPTION even with a leaderless partition in it.
      await expect(ask(v, [0], 29), `v${v}`).rejects.toMatchObject({
        errors: [expect.objectContaining({ apiCode: 29 })],
      });
      await expect(ask(v, [5], 17), `v${v}`).rejects.toMatchObject({ code: 'PLT_KFK_RESPONSE' });
    }
  });

  it('answers a leader that is not in the metadata with a retriable error, read as a partition that cannot take writes', async () => {
    await loadPlatformaticKafka();
    const client = new Base({ clientId: 'test', bootstrapBrokers: ['127.0.0.1:1'] });
    clients.push(client);
    const error = await new Promise<unknown>((resolve, reject) => {
      try {
        // What a send for a partition with leader -1 asks: `metadata.brokers.get(-1)`.
        (client[kGetConnection] as (broker: unknown, cb: Callback) => void).call(client, undefined, (err) =>
          resolve(err),
        );
      } catch (err) {
        reject(err as Error);
      }
    });
    expect(error).toMatchObject({ code: 'PLT_KFK_NETWORK', canRetry: true, hasStaleMetadata: true });
    expect(platformaticFailureOf(error)).toMatchObject({ kind: 'broker', partitionUnavailable: true });
  });
});

describe('the @platformatic/kafka producer: placing a send', () => {
  const murmur2 = (key: Buffer) => (kafka as unknown as { murmur2(k: Buffer): number }).murmur2(key);
  // Topic `orders`, 3 partitions, partition 1 without a leader.
  const metadata = {
    brokers: new Map([[1, {}]]),
    topics: new Map([['orders', { partitionsCount: 3, partitions: [{ leader: 1 }, { leader: -1 }, { leader: 1 }] }]]),
  };
  const keyFor = (partition: number) => {
    for (let i = 0; ; i++)
      if ((murmur2(Buffer.from(`k${i}`)) & 0x7fffffff) % 3 === partition) return Buffer.from(`k${i}`);
  };

  it('places keyed records as the Java client does and names a leaderless partition', () => {
    const messages: Message[] = [
      { topic: 'orders', key: keyFor(0) },
      { topic: 'orders', key: keyFor(2) },
    ];
    expect(placeMessages(messages, metadata, murmur2, new Map())).toEqual({
      messages: [
        { topic: 'orders', key: keyFor(0), partition: 0 },
        { topic: 'orders', key: keyFor(2), partition: 2 },
      ],
    });
    const withLeaderless = placeMessages(
      [...messages, { topic: 'orders', key: keyFor(1) }],
      metadata,
      murmur2,
      new Map(),
    );
    expect(withLeaderless.leaderless).toEqual({ topic: 'orders', partition: 1 });
    // A given partition is checked modulo the partition count, as the client takes it.
    expect(placeMessages([{ topic: 'orders', partition: 4 }], metadata, murmur2, new Map()).leaderless).toEqual({
      topic: 'orders',
      partition: 1,
    });
  });

  it('puts records without a key only on partitions with a leader, round robin', () => {
    const next = new Map<string, number>();
    const placed = placeMessages(
      Array.from({ length: 4 }, () => ({ topic: 'orders' })),
      metadata,
      murmur2,
      next,
    );
    expect(placed.leaderless).toBeUndefined();
    expect(placed.messages.map((m) => m.partition)).toEqual([0, 2, 0, 2]);
    // A leader not among the brokers counts as none; with no partition writable, the send is refused.
    const none = {
      brokers: new Map([[1, {}]]),
      topics: new Map([['orders', { partitionsCount: 2, partitions: [{ leader: -1 }, { leader: 7 }] }]]),
    };
    expect(placeMessages([{ topic: 'orders' }], none, murmur2, next).leaderless).toMatchObject({ topic: 'orders' });
  });

  it('leaves a topic the metadata does not hold to the client', () => {
    expect(placeMessages([{ topic: 'other', key: Buffer.from('a') }], metadata, murmur2, new Map())).toEqual({
      messages: [{ topic: 'other', key: Buffer.from('a') }],
    });
  });
});
