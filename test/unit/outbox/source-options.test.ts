/**
 * The writer's `source` option and the `walPublication` option of migrate(), without a database:
 * the values each accepts, the errors for the rest, and the defaults (docs/wal-source.md, "The
 * writer"). The WAL writer's behaviour against a real server is test/wal/writer.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { isOutboxkitError } from '../../../src/errors.js';
import { migrate } from '../../../src/migrate.js';
import { createOutbox, OUTBOX_DEFAULTS } from '../../../src/outbox/enqueue.js';
import { walPublicationName } from '../../../src/schema-name.js';

/** The error `fn` throws (synchronously or as a rejection). */
async function errorOf(fn: () => unknown): Promise<unknown> {
  try {
    await fn();
  } catch (err) {
    return err;
  }
  throw new Error('expected an error');
}

describe("createOutbox's source", () => {
  it("defaults to 'table', and 'wal' is accepted with notify left out or false", () => {
    // Catches: a default that silently turns every existing writer into a lock-free one.
    expect(OUTBOX_DEFAULTS.source).toBe('table');
    expect(createOutbox().source).toBe('table');
    expect(createOutbox({ source: 'wal' }).source).toBe('wal');
    expect(createOutbox({ source: 'wal', notify: false }).source).toBe('wal');
    expect(createOutbox({ source: 'table', notify: true }).source).toBe('table');
  });

  it("refuses notify: true with source: 'wal', naming both options", async () => {
    // Catches: a WAL writer that accepts notify: true (and then either NOTIFYs for nothing, or
    // silently ignores what the caller asked for).
    const err = await errorOf(() => createOutbox({ source: 'wal', notify: true }));
    expect(isOutboxkitError(err) && err.code).toBe('OUTBOXKIT_INVALID_OPTIONS');
    expect((err as Error).message).toMatch(/createOutbox/);
    expect((err as Error).message).toMatch(/notify: true/);
    expect((err as Error).message).toMatch(/source: 'wal'/);
  });

  it('refuses a source other than table and wal, naming the option and the accepted values', async () => {
    // Catches: a misspelt source ('WAL', 'logical') that falls back to the table writer.
    for (const source of ['WAL', 'logical', '', 1, null]) {
      const err = await errorOf(() => createOutbox({ source: source as never }));
      expect(isOutboxkitError(err) && err.code).toBe('OUTBOXKIT_INVALID_OPTIONS');
      expect((err as Error).message).toMatch(/source must be 'table' or 'wal'/);
    }
  });
});

describe("migrate's walPublication", () => {
  // A port nothing listens on: an option error must come before any connection attempt.
  const unreachable = 'postgres://postgres@127.0.0.1:1/none';

  it('refuses an invalid publication name or value before connecting', async () => {
    // Catches: a name the relay's replication connection would splice into START_REPLICATION
    // unquoted, or a non-boolean value taken as "no publication".
    for (const walPublication of ['Outbox', 'with-dash', '1abc', 'x'.repeat(64), '', 1, {}]) {
      const err = await errorOf(() =>
        migrate({ connectionString: unreachable, walPublication: walPublication as never }),
      );
      expect(isOutboxkitError(err) && err.code).toBe('OUTBOXKIT_INVALID_OPTIONS');
    }
  });

  it('names the default publication after the schema, always a valid replication name', () => {
    // Catches: a default name the slot reader would refuse for a long (40-character) schema name.
    expect(walPublicationName('outboxkit')).toBe('outboxkit_outbox_events');
    expect(walPublicationName('s'.repeat(40))).toMatch(/^[a-z_][a-z0-9_]{0,62}$/);
  });
});
