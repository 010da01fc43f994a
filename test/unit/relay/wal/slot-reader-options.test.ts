import { describe, expect, it } from 'vitest';
import { createWalSlotReader, type WalSlotReaderOptions } from '../../../../relay/wal/slot-reader.js';
import { isOutboxkitError } from '../../../../src/errors.js';

const valid: WalSlotReaderOptions = {
  connection: { connectionString: 'postgres://localhost/none' },
  slot: 'outboxkit_slot',
  publication: 'outboxkit_pub',
  handler: async () => {},
};

function rejection(options: unknown): unknown {
  try {
    createWalSlotReader(options as WalSlotReaderOptions);
  } catch (err) {
    return err;
  }
  return undefined;
}

describe('createWalSlotReader options', () => {
  // Breach caught: a slot or publication name spliced unescaped into START_REPLICATION (the
  // library does not quote the publication), a typo'd option silently ignored, or a status
  // interval that cannot keep a connection alive accepted.
  it('refuses unsafe names, unknown options and a status interval out of range', () => {
    for (const bad of [
      { ...valid, slot: 'Bad-Name' },
      { ...valid, publication: "pub', messages 'false" },
      { ...valid, statusIntervalMs: 0 },
      { ...valid, messagePrefix: '' },
      { ...valid, statusIntervalMS: 100 },
      { ...valid, handler: 'not a function' },
    ]) {
      expect(isOutboxkitError(rejection(bad), 'OUTBOXKIT_INVALID_OPTIONS'), JSON.stringify(bad)).toBe(true);
    }
    expect(rejection(valid)).toBeUndefined();
  });

  // Breach caught: confirm() before start() silently accepted (nothing could be confirmed).
  it('refuses confirm() before start() with a lifecycle error', () => {
    const reader = createWalSlotReader(valid);
    let caught: unknown;
    try {
      reader.confirm('0/1');
    } catch (err) {
      caught = err;
    }
    expect(isOutboxkitError(caught, 'OUTBOXKIT_LIFECYCLE')).toBe(true);
  });
});
