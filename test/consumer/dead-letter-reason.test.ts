/**
 * A dead letter's reason (the `dlq-reason` header, shown by `outboxkit dlq list`) never carries
 * bytes of the message value: not through `event.json()` on bytes that are not JSON, not through
 * a SyntaxError of the handler's own JSON.parse (V8 quotes the input), and not through a handler
 * message that quotes a field of the payload. Real Kafka and PostgreSQL.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { v7 as uuidv7 } from 'uuid';
import { HEADER_EVENT_ID } from '../../src/outbox/event.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { readTopic } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { ConsumerRegistry, createTopicsWithDlq, record } from './support.js';

const CARD = '4111111111111111';

describe('dead-letter reasons', () => {
  let db: TestDatabase;
  const consumers = new ConsumerRegistry();

  beforeAll(async () => {
    db = await createTestDatabase();
  });
  afterEach(() => consumers.stopAll());
  afterAll(async () => {
    await db?.drop();
  });

  it('withhold what the value holds: json() on bad bytes, JSON.parse in the handler, a message quoting a field', async () => {
    const [topic] = await createTopicsWithDlq(['dlq-reason'], 1);
    const consumer = consumers.create({
      topics: [topic!],
      database: db.pool,
      maxAttempts: 1,
      handler: async ({ event }) => {
        const mode = event.headers['x-mode'];
        if (mode === 'json') event.json();
        if (mode === 'parse') JSON.parse(event.value!.toString('utf8'));
        if (mode === 'message') {
          const { card } = event.json<{ card: string }>();
          throw new Error(`card ${card} declined by the issuer`);
        }
      },
    });
    const seen = record(consumer);
    await consumer.start();
    const raw = consumers.kafka.producer();
    await raw.connect();
    try {
      await raw.send({
        topic: topic!,
        messages: [
          { value: `card ${CARD} (not JSON)`, headers: { [HEADER_EVENT_ID]: uuidv7(), 'x-mode': 'json' } },
          { value: `card ${CARD}`, headers: { [HEADER_EVENT_ID]: uuidv7(), 'x-mode': 'parse' } },
          { value: JSON.stringify({ card: CARD }), headers: { [HEADER_EVENT_ID]: uuidv7(), 'x-mode': 'message' } },
        ],
      });
    } finally {
      await raw.disconnect();
    }
    await waitFor(() => seen.deadLettered.length === 3);
    const reasons = await readTopic(
      `${topic}.dlq`,
      (m) => m.headers['dlq-reason'],
      (all) => all.length >= 3,
    );
    expect(reasons).toHaveLength(3);
    for (const reason of reasons) expect(reason).not.toMatch(/41111/);
    expect(reasons[0]).toMatch(/^InvalidMessageError: Event .* is not valid JSON; its bytes are not shown\.$/);
    expect(reasons[1]).toBe('SyntaxError: message withheld (it may quote the message value)');
    expect(reasons[2]).toBe('Error: card … declined by the issuer');
  });
});
