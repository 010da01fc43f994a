/**
 * An `outbox_events` row as the replication stream gives it, decoded into the columns the relay
 * publishes. pgoutput (protocol 1) sends every column as text; pg-logical-replication parses each
 * with node-postgres's type parser of its type OID (`pg.types`), so with node-postgres's defaults
 * `bytea` arrives as a Buffer, `jsonb` parsed, `bigint` as a decimal string, `smallint` and
 * `integer` as numbers. An application that changed those global parsers (`pg.types.setTypeParser`,
 * for example bigint as BigInt or bytea left as text) changes what arrives, so each column is taken
 * in any form that carries the same value: the `\x…` hex text of a bytea, the JSON text of a jsonb,
 * a bigint as number or BigInt. The result is the row the table relay reads from the same table
 * (relay/sql.ts, `readPending`), so both build the same Kafka record (relay/record.ts).
 */
import type { OutboxRecordRow } from '../record.js';

/** A decoded outbox row: its seq (a decimal string) and the columns of its record. */
export interface WalOutboxRow extends OutboxRecordRow {
  seq: string;
}

/** What decoding a row gave: the row, or why not (with its seq when that much was readable). */
export type DecodedOutboxRow = { ok: true; row: WalOutboxRow } | { ok: false; seq?: string; error: string };

/**
 * Decodes one row of `outbox_events` from the stream. Never throws: a row that does not have the
 * table's shape (a column missing or of another type) is reported with the reason, so the relay can
 * park it by its seq instead of losing it.
 */
export function decodeOutboxRow(row: Readonly<Record<string, unknown>>): DecodedOutboxRow {
  const seq = decimal(row.seq);
  if (seq === undefined) return { ok: false, error: `seq is not an integer: ${describe(row.seq)}` };
  const fail = (what: string, value: unknown): DecodedOutboxRow => ({
    ok: false,
    seq,
    error: `the row from the replication stream has ${what}: ${describe(value)}`,
  });
  const eventId = row.event_id;
  if (typeof eventId !== 'string') return fail('no event_id', eventId);
  const topic = row.topic;
  if (typeof topic !== 'string') return fail('no topic', topic);
  const key = row.key;
  if (key !== null && typeof key !== 'string') return fail('a key that is not text', key);
  const type = row.type;
  if (typeof type !== 'string') return fail('no type', type);
  const payload = bytes(row.payload);
  if (payload === undefined) return fail('a payload that is not bytea', row.payload);
  const headers = stringRecord(row.headers);
  if (headers === undefined) return fail('headers that are not a JSON object of strings', row.headers);
  return { ok: true, row: { seq, event_id: eventId, topic, key, type, payload, headers } };
}

function decimal(v: unknown): string | undefined {
  if (typeof v === 'string' && /^-?\d+$/.test(v)) return v;
  if (typeof v === 'bigint') return v.toString();
  if (typeof v === 'number' && Number.isSafeInteger(v)) return String(v);
  return undefined;
}

/** A bytea: a Buffer (node-postgres's parser), or its text form in hex (`\x0a1b`). */
function bytes(v: unknown): Buffer | undefined {
  if (Buffer.isBuffer(v)) return v;
  if (v instanceof Uint8Array) return Buffer.from(v);
  if (typeof v === 'string' && /^\\x(?:[0-9a-f]{2})*$/i.test(v)) return Buffer.from(v.slice(2), 'hex');
  return undefined;
}

/** A jsonb object of string values: parsed (node-postgres's parser), or its JSON text. */
function stringRecord(v: unknown): Record<string, string> | undefined {
  let value = v;
  if (typeof value === 'string') {
    try {
      value = JSON.parse(value) as unknown;
    } catch {
      return undefined;
    }
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return undefined;
  for (const item of Object.values(value)) if (typeof item !== 'string') return undefined;
  return value as Record<string, string>;
}

function describe(v: unknown): string {
  if (v === undefined) return 'missing';
  if (v === null) return 'null';
  if (Buffer.isBuffer(v)) return `a Buffer of ${v.length} bytes`;
  const text = typeof v === 'string' ? JSON.stringify(v) : `${typeof v}`;
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}
