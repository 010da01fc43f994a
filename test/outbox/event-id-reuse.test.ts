/**
 * An explicit eventId is used by one event only, ever: the writer takes it only as a UUIDv7 of
 * the last hour, and the relay's retention cleanup keeps a published row at least that long (65
 * min, whatever publishedRetentionMs says), so a reused id meets the unique constraint while the
 * first event's row exists and is refused for its age afterwards. Before, retention deleted the
 * row and the same id was accepted again, and every consumer that had applied the first event
 * skipped the second as a duplicate. Real PostgreSQL, a real relay and broker.
 */
import { v4 as uuidv4, v7 as uuidv7 } from 'uuid';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { enqueue, isOutboxkitError, type OutboxEventInput } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics } from '../helpers/kafka.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db.drop();
});

async function write(event: OutboxEventInput): Promise<unknown> {
  const client = await db.pool.connect();
  try {
    await client.query('BEGIN');
    const [written] = await enqueue(client, event);
    await client.query('COMMIT');
    return written;
  } catch (err) {
    await client.query('ROLLBACK');
    return err;
  } finally {
    client.release();
  }
}

async function rowExists(eventId: string): Promise<boolean> {
  const { rows } = await db.pool.query('SELECT 1 FROM outboxkit.outbox_events WHERE event_id = $1', [eventId]);
  return rows.length === 1;
}

describe('explicit event ids are never used twice', () => {
  it('retention with publishedRetentionMs 0 keeps a published row for the reuse window; the id is then refused', async () => {
    const [topic] = await createTopics(['event-id-reuse']);
    const event = (eventId?: string): OutboxEventInput => ({
      topic: topic!,
      key: 'k',
      type: 't',
      payload: {},
      eventId,
    });
    const id = uuidv7();
    await write(event(id));
    // A row published two hours ago (past the reuse window): the cleanup deletes it, which tells
    // that a cleanup ran after the explicit event was published.
    const old = (await write(event())) as { eventId: string };

    const relay = await startRelay(db.url, { publishedRetentionMs: 0, cleanupIntervalMs: 100 });
    try {
      await waitFor(async () => {
        const { rows } = await db.pool.query(
          'SELECT count(*)::int AS n FROM outboxkit.outbox_events WHERE published_at IS NULL',
        );
        return rows[0].n === 0;
      });
      await db.pool.query(
        `UPDATE outboxkit.outbox_events SET published_at = now() - interval '2 hours' WHERE event_id = $1`,
        [old.eventId],
      );
      await waitFor(async () => !(await rowExists(old.eventId)), { message: 'the cleanup deletes the old row' });
    } finally {
      await relay.stopAndForget();
    }
    expect(await rowExists(id)).toBe(true);

    // The same id again: refused while the first event's row exists.
    const again = await write({ ...event(id), payload: { another: 'event' } });
    expect(isOutboxkitError(again, 'OUTBOXKIT_INVALID_EVENT')).toBe(true);
    expect((again as Error).message).toContain('already exists in the outbox');

    // An id older than the window (the first event's row may be gone by then), or without a time.
    const dayOld = await write(event(uuidv7({ msecs: Date.now() - 86_400_000 })));
    expect(isOutboxkitError(dayOld, 'OUTBOXKIT_INVALID_EVENT')).toBe(true);
    expect((dayOld as Error).message).toContain('docs/events.md');
    expect(isOutboxkitError(await write(event(uuidv4())), 'OUTBOXKIT_INVALID_EVENT')).toBe(true);
    expect(await rowExists(id)).toBe(true);
  });
});
