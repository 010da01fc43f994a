import { describe, expect, it } from 'vitest';
import { formatLsn, parseLsn } from '../../../../relay/wal/lsn.js';
import { isOutboxkitError } from '../../../../src/errors.js';

describe('LSN parsing and printing', () => {
  // Breach caught: a padded LSN from the library read differently from PostgreSQL's form, or the
  // high half dropped (LSNs past 4 GiB of WAL compared wrongly).
  it('reads the library padded form and PostgreSQL form alike, and prints as PostgreSQL does', () => {
    expect(parseLsn('00000000/019782D0')).toBe(0x019782d0n);
    expect(parseLsn('0/19782D0')).toBe(0x019782d0n);
    expect(parseLsn('16/b374d848')).toBe((0x16n << 32n) | 0xb374d848n);
    expect(formatLsn((0x16n << 32n) | 0xb374d848n)).toBe('16/B374D848');
    expect(formatLsn(parseLsn('00000001/00000000') - 1n)).toBe('0/FFFFFFFF');
  });

  // Breach caught: garbage taken for an LSN (a confirm() with a wrong value moving the slot).
  it('refuses what is not an LSN with a typed error', () => {
    for (const bad of ['', '0', '0/', '/1', '123456789/0', '0/G', ' 0/1']) {
      let caught: unknown;
      try {
        parseLsn(bad);
      } catch (err) {
        caught = err;
      }
      expect(isOutboxkitError(caught, 'OUTBOXKIT_INVALID_OPTIONS'), bad).toBe(true);
    }
  });
});
