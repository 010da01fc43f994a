/**
 * The import of bench/bulk-import.ts, in a process of its own (its event building must not delay
 * the measured writers' event loop): ONE transaction that inserts N business rows and, with
 * `enqueue`, enqueues one event per row, each with its own key (`by-hand`: the same outbox rows by
 * one INSERT … SELECT; `rows-only`: no outbox rows). Prints `begun` once the
 * transaction has started, then `committed <ms>` (from BEGIN to COMMIT) and exits.
 *
 * Usage: node --import tsx bench/processes/bulk-import-writer.ts <database-url> <rows> <enqueue|by-hand|rows-only>
 */
import pg from 'pg';
import { enqueue } from '../../src/index.js';

const [url, rowsArg, mode] = process.argv.slice(2);
const rows = Number(rowsArg);
if (!url || !Number.isInteger(rows) || !['enqueue', 'by-hand', 'rows-only'].includes(mode ?? '')) {
  throw new Error('usage: bulk-import-writer.ts <database-url> <rows> <enqueue|by-hand|rows-only>');
}
const client = new pg.Client({ connectionString: url });
await client.connect();
const started = performance.now();
await client.query('BEGIN');
process.stdout.write('begun\n');
const prefix = `import-${process.pid}-`;
await client.query(`INSERT INTO imported SELECT $1 || g, 'imported row ' || g FROM generate_series(1, $2::int) AS g`, [
  prefix,
  rows,
]);
if (mode === 'enqueue') {
  const payload = { source: 'bulk', amount: 1234 };
  await enqueue(
    client,
    Array.from({ length: rows }, (_, i) => ({
      topic: 'imports',
      key: `${prefix}${i + 1}`,
      type: 'row.imported',
      payload,
    })),
  );
} else if (mode === 'by-hand') {
  // The same outbox rows written by one INSERT … SELECT, without enqueue() (no key locks, no
  // NOTIFY, nothing built in JavaScript): the write volume alone.
  await client.query(
    `INSERT INTO outboxkit.outbox_events (event_id, topic, key, lane, type, payload, headers)
     SELECT gen_random_uuid(), 'imports', $1 || g, g % 64, 'row.imported', convert_to($3, 'UTF8'), '{}'
       FROM generate_series(1, $2::int) AS g`,
    [prefix, rows, JSON.stringify({ source: 'bulk', amount: 1234 })],
  );
}
await client.query('COMMIT');
process.stdout.write(`committed ${Math.round(performance.now() - started)}\n`);
await client.end();
