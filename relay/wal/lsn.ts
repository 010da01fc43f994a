/**
 * Log sequence numbers (PostgreSQL's `pg_lsn`): a byte position in the WAL, printed as two
 * hexadecimal 32-bit halves (`16/B374D848`). pg-logical-replication passes them zero-padded
 * (`00000016/B374D848`); outboxkit compares them as `bigint` and prints them as PostgreSQL does.
 */
import { InvalidOptionsError } from '../../src/errors.js';

const LSN = /^([0-9A-F]{1,8})\/([0-9A-F]{1,8})$/i;

/**
 * The LSN `text` (`16/B374D848`, padded or not) as a number of bytes.
 *
 * @throws {@link InvalidOptionsError} when `text` is not an LSN.
 */
export function parseLsn(text: string): bigint {
  const m = typeof text === 'string' ? LSN.exec(text) : null;
  if (!m?.[1] || !m[2])
    throw new InvalidOptionsError(`Not a PostgreSQL LSN: ${JSON.stringify(text)} (expected like 16/B374D848).`);
  return (BigInt(`0x${m[1]}`) << 32n) | BigInt(`0x${m[2]}`);
}

/** A number of bytes as PostgreSQL prints a pg_lsn (`16/B374D848`, upper case, unpadded). */
export function formatLsn(lsn: bigint): string {
  return `${(lsn >> 32n).toString(16).toUpperCase()}/${(lsn & 0xffffffffn).toString(16).toUpperCase()}`;
}
