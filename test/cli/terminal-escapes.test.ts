/**
 * Text from outside reaches the operator's terminal only escaped: `dlq list` (a dead letter's
 * headers, written by whoever may write the topic), `parked list` (an event's type and the
 * broker's error) and `keys list` (tenants and operations from requests) print C0/C1 controls,
 * DEL and bidirectional overrides as visible escapes, in text and in JSON, and a newline inside a
 * value cannot forge a line. Real processes against the real PostgreSQL and Kafka.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { v7 as uuidv7 } from 'uuid';
import { enqueue } from '../../src/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { createTopics, testKafka } from '../helpers/kafka.js';
import { finished, spawnCli } from '../helpers/processes.js';

/** ESC sequences (clear screen, window title, recolour), a C1 CSI, DEL, a bidi override, a BEL. */
const HOSTILE = 'a\u001b[2J\u001b]0;pwned\u0007b\u009b31mc\u007fd\u202ee\nFAKE LINE';
/** Anything a terminal would act on, except the line breaks between output lines. */
const RAW_CONTROL = /(?!\n)[\p{Cc}\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/u;
const SHOWN = 'a\\x1b[2J\\x1b]0;pwned\\x07b\\x9b31mc\\x7fd\\u202ee\\nFAKE LINE';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

const cli = (args: string[]) => finished(spawnCli(args));

describe('CLI text output escapes control characters from outside', () => {
  it('dlq list: headers of a dead letter, as text and as JSON', async () => {
    const [dlq] = await createTopics(['escapes-dlq'], { partitions: 1 });
    const producer = testKafka().producer();
    await producer.connect();
    try {
      await producer.send({
        topic: dlq!,
        messages: [
          {
            key: `k${HOSTILE}`,
            value: '{}',
            headers: {
              'event-id': uuidv7(),
              'event-type': `type${HOSTILE}`,
              'dlq-reason': `Error: ${HOSTILE}`,
              'dlq-original-topic': 'orders',
              'dlq-original-partition': '0',
              'dlq-original-offset': `7${HOSTILE}`,
              'dlq-consumer-group': `group${HOSTILE}`,
              'dlq-failed-at': `2026${HOSTILE}`,
            },
          },
        ],
      });
    } finally {
      await producer.disconnect();
    }
    const text = await cli(['dlq', 'list', dlq!]);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).not.toMatch(RAW_CONTROL);
    expect(text.stdout).toContain(`Error: ${SHOWN}`);
    expect(text.stdout).toContain(`group=group${SHOWN}`);
    // Two lines per dead letter: the value's newline did not add one.
    expect(text.stdout.trim().split('\n')).toHaveLength(2);
    expect(text.stdout).not.toMatch(/^FAKE LINE/m);

    const json = await cli(['dlq', 'list', dlq!, '--json']);
    expect(json.stdout).not.toMatch(RAW_CONTROL);
    const [summary] = JSON.parse(json.stdout) as { reason: string; eventType: string }[];
    expect(summary).toMatchObject({ reason: `Error: ${HOSTILE}`, eventType: `type${HOSTILE}` });
  });

  it('parked list: the type a writer gave and the error of the broker', async () => {
    const client = await db.pool.connect();
    let eventId: string;
    try {
      await client.query('BEGIN');
      const [written] = await enqueue(client, { topic: 'orders', key: 'k', type: `t${HOSTILE}`, payload: {} });
      eventId = written!.eventId;
      await client.query('COMMIT');
    } finally {
      client.release();
    }
    await db.pool.query(
      `UPDATE outboxkit.outbox_events SET parked_at = now(), attempts = 5, last_error = $2 WHERE event_id = $1`,
      [eventId, `broker said ${HOSTILE}`],
    );
    const text = await cli(['parked', 'list', '--database-url', db.url]);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).not.toMatch(RAW_CONTROL);
    expect(text.stdout).toContain(`t${SHOWN}`);
    expect(text.stdout).toContain(`broker said ${SHOWN}`);
    const json = await cli(['parked', 'list', '--database-url', db.url, '--json']);
    expect(json.stdout).not.toMatch(RAW_CONTROL);
    expect((JSON.parse(json.stdout) as { type: string }[])[0]!.type).toBe(`t${HOSTILE}`);
  });

  it('keys list: tenants and operations from requests', async () => {
    await db.pool.query(
      `INSERT INTO outboxkit.idempotency_keys (tenant, operation, key, fingerprint, fingerprint_version, state, expires_at)
       VALUES ($1, $2, $3, '\\x00'::bytea, 1, 'processing', now() + interval '1 hour')`,
      [`tenant${HOSTILE}`, `op${HOSTILE}`, randomUUID()],
    );
    const text = await cli(['keys', 'list', '--state', 'processing', '--database-url', db.url]);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).not.toMatch(RAW_CONTROL);
    expect(text.stdout).toContain(`tenant${SHOWN}  op${SHOWN}`);
    const json = await cli(['keys', 'list', '--state', 'processing', '--database-url', db.url, '--json']);
    expect(json.stdout).not.toMatch(RAW_CONTROL);
    expect((JSON.parse(json.stdout) as { tenant: string }[])[0]!.tenant).toBe(`tenant${HOSTILE}`);
  });

  it('error messages: a relay id that holds no lanes is quoted escaped on stderr', async () => {
    const r = await cli(['lanes', 'release', `relay${HOSTILE}`, '--database-url', db.url]);
    expect(r.code).toBe(1);
    expect(r.stderr).not.toMatch(RAW_CONTROL);
    expect(r.stderr).toContain('holds no lanes');
  });
});
