/**
 * What every `outboxkit` command shares: option builders (flag > env > default), parsers, and a
 * short-lived pool for operator commands.
 */
import { InvalidArgumentError, Option } from 'commander';
import pg from 'pg';
import type { Queryable } from '../src/database.js';

export const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/postgres';
export const DEFAULT_BROKERS = '127.0.0.1:9092';

export function int(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n)) throw new InvalidArgumentError('Not an integer.');
  return n;
}

export function bool(value: string): boolean {
  if (/^(1|true|yes|on)$/i.test(value)) return true;
  if (/^(0|false|no|off)$/i.test(value)) return false;
  throw new InvalidArgumentError('Expected true or false.');
}

export const databaseOption = () =>
  new Option('--database-url <url>', 'PostgreSQL connection string (session mode)')
    .env('DATABASE_URL')
    .default(DEFAULT_DATABASE_URL);
export const schemaOption = () =>
  new Option('--schema <name>', "schema of outboxkit's tables").env('OUTBOXKIT_SCHEMA').default('outboxkit');
export const brokersOption = () =>
  new Option('--brokers <list>', 'Kafka brokers, comma-separated host:port')
    .env('KAFKA_BROKERS')
    .default(DEFAULT_BROKERS);

export async function withPool(url: string, fn: (pool: pg.Pool) => Promise<void>): Promise<void> {
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  try {
    await fn(pool);
  } finally {
    await pool.end();
  }
}

/** A {@link Queryable} over a pool (autocommit statements). */
export function q(pool: pg.Pool): Queryable {
  return {
    query: async <R>(text: string, values?: readonly unknown[]) => {
      const r = await pool.query(text, values as unknown[]);
      return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
    },
  };
}
