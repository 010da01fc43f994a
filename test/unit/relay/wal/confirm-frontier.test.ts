import { describe, expect, it } from 'vitest';
import { ConfirmFrontier } from '../../../../relay/wal/confirm-frontier.js';
import { isOutboxkitError } from '../../../../src/errors.js';

describe('ConfirmFrontier', () => {
  // Breach caught: confirming a later transaction moving the slot past an earlier unconfirmed one
  // (a crash would then lose the earlier one).
  it('never moves past an unconfirmed transaction, and jumps once the gap closes', () => {
    const f = new ConfirmFrontier(100n);
    expect(f.add(110n, false)).toBeUndefined();
    expect(f.add(120n, false)).toBeUndefined();
    expect(f.add(130n, false)).toBeUndefined();
    expect(f.confirm(130n)).toBeUndefined();
    expect(f.confirm(120n)).toBeUndefined();
    expect(f.frontier).toBe(100n);
    expect(f.open).toBe(3);
    expect(f.confirm(110n)).toBe(130n);
    expect(f.frontier).toBe(130n);
    expect(f.open).toBe(0);
  });

  // Breach caught: an empty transaction (nothing handed over) either holding the slot back forever
  // or letting it jump past an earlier unconfirmed transaction.
  it('settles empty transactions on arrival, behind the unconfirmed ones before them', () => {
    const f = new ConfirmFrontier(100n);
    expect(f.add(105n, true)).toBe(105n);
    expect(f.add(110n, false)).toBeUndefined();
    expect(f.add(115n, true)).toBeUndefined();
    expect(f.frontier).toBe(105n);
    expect(f.confirm(110n)).toBe(115n);
  });

  // Breach caught: a repeated confirm() throwing (the caller settles at least once), or a confirm()
  // of an LSN never handed over accepted (a caller bug that would confirm something else).
  it('takes a repeated confirmation as a no-op and refuses an unknown LSN', () => {
    const f = new ConfirmFrontier(100n);
    f.add(110n, false);
    f.add(120n, false);
    expect(f.confirm(110n)).toBe(110n);
    expect(f.confirm(110n)).toBeUndefined();
    expect(f.confirm(90n)).toBeUndefined();
    let caught: unknown;
    try {
      f.confirm(115n);
    } catch (err) {
      caught = err;
    }
    expect(isOutboxkitError(caught, 'OUTBOXKIT_INVALID_OPTIONS')).toBe(true);
    expect(f.frontier).toBe(110n);
  });

  // Breach caught: a commit at or below the frontier (or out of order) counted as open, so the
  // frontier waits for a confirmation that never comes, or moves backwards.
  it('ignores commits at or below the frontier and refuses commits out of order', () => {
    const f = new ConfirmFrontier(100n);
    expect(f.add(100n, false)).toBeUndefined();
    expect(f.open).toBe(0);
    f.add(120n, false);
    expect(() => f.add(110n, false)).toThrow(/arrived after/);
    expect(f.frontier).toBe(100n);
  });

  // Breach caught: a keepalive's position confirmed past a transaction handed over and not yet
  // confirmed (a crash would then lose it), or the frontier moved backwards.
  it('skips to a keepalive position only while nothing is open, and never backwards', () => {
    const f = new ConfirmFrontier(100n);
    expect(f.skipTo(150n)).toBe(150n);
    expect(f.skipTo(140n)).toBeUndefined();
    expect(f.frontier).toBe(150n);
    f.add(200n, false);
    expect(f.skipTo(300n)).toBeUndefined();
    expect(f.frontier).toBe(150n);
    expect(f.confirm(200n)).toBe(200n);
    expect(f.skipTo(300n)).toBe(300n);
    // A commit at or below the skipped-to position is already confirmed.
    expect(f.add(250n, false)).toBeUndefined();
    expect(f.open).toBe(0);
  });
});
