/**
 * B1 outbox write: a one-row business transaction plus `enqueue()` of one event, against the same
 * transaction with a hand-written INSERT of the same outbox row (no per-key lock, no NOTIFY), and
 * against the transaction with no outbox row; NOTIFY on and off; 1 and 32 clients.
 */
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { createOutbox } from '../src/index.js';
import { laneOf } from '../src/outbox/event.js';
import { compare, formatComparisons, type Comparison } from './lib.js';
import { benchDatabase, BUSINESS_TABLE_DDL, businessTransaction, machine } from './support.js';

export async function run(): Promise<string> {
  const db = await benchDatabase();
  const pool = new pg.Pool({ connectionString: db.url, max: 32 });
  await pool.query(BUSINESS_TABLE_DDL);
  const withNotify = createOutbox({ notify: true });
  const withoutNotify = createOutbox({ notify: false });
  const payload = { orderId: 'x', amount: 1234, currency: 'EUR', lines: [{ sku: 'a', qty: 1 }] };

  const tx = (body: (c: pg.PoolClient, id: string) => Promise<unknown>) => businessTransaction(pool, body);
  const viaEnqueue = (outbox: typeof withNotify) => () =>
    tx((c, id) => outbox.enqueue(c, { topic: 'orders', key: id, type: 'order.created', payload }));
  const byHand = () =>
    tx((c, id) =>
      c.query(
        `INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload, headers)
         VALUES ($1, 'orders', $2, $3, 'order.created', $4, '{}')`,
        [randomUUID(), id, laneOf(id), Buffer.from(JSON.stringify(payload))],
      ),
    );
  const noOutbox = () => tx(async () => undefined);

  const rows: Comparison[] = [];
  for (const concurrency of [1, 32]) {
    const o = { concurrency, rounds: 5, roundMs: 2_000 };
    rows.push(
      await compare(
        `enqueue (NOTIFY on), ${concurrency} client(s)`,
        viaEnqueue(withNotify),
        'hand-written INSERT',
        byHand,
        o,
      ),
    );
    rows.push(
      await compare(
        `enqueue (NOTIFY off), ${concurrency} client(s)`,
        viaEnqueue(withoutNotify),
        'hand-written INSERT',
        byHand,
        o,
      ),
    );
    rows.push(
      await compare(
        `enqueue (NOTIFY on), ${concurrency} client(s)`,
        viaEnqueue(withNotify),
        'no outbox row',
        noOutbox,
        o,
      ),
    );
    rows.push(
      await compare(
        `NOTIFY on, ${concurrency} client(s)`,
        viaEnqueue(withNotify),
        'NOTIFY off',
        viaEnqueue(withoutNotify),
        o,
      ),
    );
  }
  await pool.end();
  await db.drop();
  return `Machine: ${await machine()}\n\n${formatComparisons(rows)}`;
}
