/**
 * `dlq replay` produces to the topic the dead-letter topic belongs to (`<topic>.dlq` → `<topic>`),
 * never to the topic a record's `dlq-original-topic` header names: anyone who may write to the
 * dead-letter topic chooses that header, and the replay publishes with the operator's
 * credentials. A record naming another topic is skipped with the reason; `--to` sends it where
 * the operator says; a dead-letter topic named otherwise needs `--to`. Real Kafka, real processes.
 */
import { v7 as uuidv7 } from 'uuid';
import { afterAll, describe, expect, it } from 'vitest';
import { readDeadLetters, replayDeadLetters } from '../../consumer/dead-letter-replay.js';
import { HEADER_DLQ_ORIGINAL_PARTITION, HEADER_DLQ_ORIGINAL_TOPIC } from '../../consumer/dead-letter.js';
import { HEADER_EVENT_ID } from '../../src/outbox/event.js';
import { createTopics, testKafka } from '../helpers/kafka.js';
import { finished, jsonError, spawnCli } from '../helpers/processes.js';
import { createTopicsWithDlq } from './support.js';

const kafka = testKafka('outboxkit-dlq-target-test');
const producer = kafka.producer();
let connected: Promise<void> | undefined;
afterAll(async () => {
  if (connected) await producer.disconnect();
});

/** A dead letter as the consumer writes it, naming `originalTopic` (or no header when null). */
async function deadLetter(dlq: string, originalTopic: string | null): Promise<string> {
  connected ??= producer.connect();
  await connected;
  const id = uuidv7();
  const headers: Record<string, string> = { [HEADER_EVENT_ID]: id, [HEADER_DLQ_ORIGINAL_PARTITION]: '0' };
  if (originalTopic !== null) headers[HEADER_DLQ_ORIGINAL_TOPIC] = originalTopic;
  await producer.send({ topic: dlq, acks: -1, messages: [{ key: 'k', value: '{"n":1}', headers }] });
  return id;
}

async function eventIdsIn(topic: string): Promise<string[]> {
  const { records } = await readDeadLetters(kafka, topic, { timeoutMs: 20_000 });
  return records.map((r) => r.summary.eventId!);
}

describe('dlq replay target', () => {
  it('replays to the topic of <topic>.dlq only; a header naming another topic is skipped unless --to names it', async () => {
    const [orders] = await createTopicsWithDlq(['dlq-target'], 1);
    const [victim] = await createTopics(['dlq-target-victim'], { partitions: 1 });
    const dlq = `${orders}.dlq`;
    const genuine = await deadLetter(dlq, orders!);
    const forged = await deadLetter(dlq, victim!);
    const headerless = await deadLetter(dlq, null);

    const run = await finished(spawnCli(['dlq', 'replay', dlq, '--all']));
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain(`replayed ${genuine} -> ${orders}`);
    expect(run.stdout).toMatch(
      new RegExp(`skipped 0/1 \\(${forged}\\): its dlq-original-topic header names "${victim}", not ${orders}`),
    );
    expect(run.stdout).toContain(`skipped 0/2 (${headerless}): no dlq-original-topic header`);
    expect(run.stdout).toContain('replayed 1 events');
    expect(await eventIdsIn(victim!)).toEqual([]);
    expect(await eventIdsIn(orders!)).toEqual([genuine]);

    // The operator names the topic: then it goes there, header or not.
    const to = await replayDeadLetters(kafka, dlq, { eventIds: [forged], to: victim! });
    expect(to.replayed).toEqual([expect.objectContaining({ eventId: forged, topic: victim })]);
    expect(await eventIdsIn(victim!)).toEqual([forged]);
  });

  it('a dead-letter topic not named <topic>.dlq needs --to: refused before anything is read', async () => {
    const [other] = await createTopics(['dlq-target-named-otherwise'], { partitions: 1 });
    await deadLetter(other!, 'anything');
    const run = await finished(spawnCli(['dlq', 'replay', other!, '--all', '--json']));
    expect(run.code).toBe(1);
    const error = jsonError(run);
    expect(error.code).toBe('OUTBOXKIT_INVALID_OPTIONS');
    expect(error.message).toContain('name the topic to replay to with --to <topic>');
  });
});
