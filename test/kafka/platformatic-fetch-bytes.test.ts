/**
 * The dedup consumer's group member on @platformatic/kafka asks at most 10 MiB per Fetch response
 * (`FETCH_MAX_BYTES`, kafkajs's `maxBytes` default), whichever client version runs: 1.x's own
 * default is 10 MiB, 2.x's 50 MiB. Eleven partitions of about 1 MB each: one response may carry ten
 * of them, never all eleven. The responses are read through the client's diagnostics channel
 * (`plt:kafka:consumer:fetches`, in 1.35.0 and 2.12.1).
 */
import diagnostics from 'node:diagnostics_channel';
import { describe, expect, inject, it } from 'vitest';
import { FETCH_MAX_BYTES } from '../../src/kafka/platformatic/group-consumer.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import { readPackage } from '../../src/kafka/platformatic/load.js';
import { createTopics, randomName, testKafka } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';

const PARTITIONS = 11;
/** Below the broker's default `max.message.bytes` (1,048,588) with the batch's overhead. */
const VALUE_BYTES = 1_000_000;

interface FetchContext {
  result?: { responses?: { partitions?: { records?: { records?: { value?: Buffer | null }[] }[] }[] }[] };
}

/** Bytes of record values in one Fetch response. */
function valueBytes(context: FetchContext): number {
  let bytes = 0;
  for (const t of context.result?.responses ?? [])
    for (const p of t.partitions ?? [])
      for (const batch of p.records ?? []) for (const r of batch.records ?? []) bytes += r.value?.length ?? 0;
  return bytes;
}

describe(`the @platformatic/kafka group member's fetches (${readPackage().version})`, () => {
  it('carry at most 10 MiB per response: ten of eleven ~1 MB partitions, not all eleven', async () => {
    const [topic] = await createTopics(['fetch-bytes'], { partitions: PARTITIONS });
    const producer = testKafka('fetch-bytes').producer();
    await producer.connect();
    try {
      for (let partition = 0; partition < PARTITIONS; partition++) {
        await producer.send({
          topic: topic!,
          messages: [{ partition, value: Buffer.alloc(VALUE_BYTES, partition) }],
        });
      }
    } finally {
      await producer.disconnect();
    }

    const responses: number[] = [];
    const channel = diagnostics.tracingChannel('plt:kafka:consumer:fetches');
    const handlers = {
      start() {},
      end() {},
      asyncStart(context: unknown) {
        const bytes = valueBytes(context as FetchContext);
        if (bytes > 0) responses.push(bytes);
      },
      asyncEnd() {},
      error() {},
    };
    channel.subscribe(handlers);
    const consumer = createPlatformaticClient({
      brokers: inject('kafkaBrokers'),
      clientId: 'fetch-bytes',
    }).groupConsumer({ groupId: randomName('fetch-bytes'), fetchMaxWaitMs: 500 });
    const seen = new Set<number>();
    try {
      await consumer.connect();
      await consumer.subscribe([topic!], { fromBeginning: true });
      await consumer.run({
        concurrency: PARTITIONS,
        eachBatch: async (batch) => {
          for (const m of batch.messages) batch.markProcessed(m.offset);
          seen.add(batch.partition);
        },
      });
      await waitFor(() => seen.size === PARTITIONS, { timeoutMs: 30_000 });
    } finally {
      await consumer.disconnect();
      channel.unsubscribe(handlers);
    }
    // The first round asks for every partition at once: the broker fills the response up to the bound.
    expect(responses[0]).toBeGreaterThanOrEqual(10 * VALUE_BYTES);
    expect(Math.max(...responses)).toBeLessThanOrEqual(FETCH_MAX_BYTES);
  }, 60_000);
});
