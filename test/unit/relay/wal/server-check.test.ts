/**
 * The WAL relay's start-up check of the server (relay/wal/server-check.ts), as pure logic: settings
 * rows as plain objects in, errors and log notes out; and the async check over a fake `Queryable`
 * (one query, the first error thrown). test/wal/server-check.test.ts runs it against the real
 * PostgreSQL (a role without REPLICATION, a role's wal_sender_timeout, the max_slot_wal_keep_size
 * line).
 */
import { describe, expect, it } from 'vitest';
import {
  assessWalServer,
  checkWalServer,
  logWalServerNotes,
  requireLogicalWal,
  type WalServerSettings,
} from '../../../../relay/wal/server-check.js';
import { requireLogicalWal as reexported } from '../../../../relay/wal/wal-relay.js';
import type { Queryable } from '../../../../src/database.js';
import { isOutboxkitError, type OutboxkitError } from '../../../../src/errors.js';
import type { Logger } from '../../../../src/logger.js';

/** A server a relay is happy with: PostgreSQL's defaults, a replication role, a keep size of 1 GB. */
const GOOD: WalServerSettings = {
  walLevel: 'logical',
  role: 'relay',
  rolReplication: true,
  rolSuper: false,
  rdsReplication: false,
  maxWalSenders: 10,
  maxReplicationSlots: 10,
  walSenderTimeoutMs: 60_000,
  maxSlotWalKeepSizeMb: 1_024,
};

const DEFAULT_INTERVAL = { statusIntervalMs: 10_000 };

function assess(overrides: Partial<WalServerSettings>, statusIntervalMs = 10_000) {
  return assessWalServer({ ...GOOD, ...overrides }, { statusIntervalMs });
}

function codes(errors: readonly OutboxkitError[]): string[] {
  return errors.map((e) => e.code);
}

const WAL_LEVEL_MESSAGE = (level: string) =>
  `The WAL relay needs wal_level = logical, and this server runs wal_level = ${level}: ` +
  'set wal_level = logical in postgresql.conf and restart PostgreSQL, or run the table relay (docs/wal-source.md).';

describe('assessWalServer', () => {
  it('finds nothing wrong on a good server, and says what max_slot_wal_keep_size is', () => {
    const { errors, notes } = assessWalServer(GOOD, DEFAULT_INTERVAL);
    expect(errors).toEqual([]);
    expect(notes).toEqual([
      {
        level: 'info',
        fields: { maxSlotWalKeepSizeMb: 1_024 },
        message:
          'max_slot_wal_keep_size is 1024 MB: a slot retaining more WAL is invalidated by PostgreSQL, and the relay ' +
          'then resyncs from the outbox table (docs/wal-source.md, "Slot loss and resync")',
      },
    ]);
  });

  describe('wal_level', () => {
    it.each(['replica', 'minimal'])(
      '%s: UnsupportedServerError, not retriable, with the message requireLogicalWal always gave',
      (level) => {
        const { errors } = assess({ walLevel: level });
        expect(codes(errors)).toEqual(['OUTBOXKIT_UNSUPPORTED_SERVER']);
        expect(errors[0]!.message).toBe(WAL_LEVEL_MESSAGE(level));
        expect(errors[0]!.retriable).toBe(false);
      },
    );
  });

  describe('the role may replicate', () => {
    it('neither REPLICATION nor SUPERUSER: PermissionDeniedError naming the role and ALTER ROLE … WITH REPLICATION', () => {
      const { errors } = assess({ role: 'okit_writer', rolReplication: false });
      expect(codes(errors)).toEqual(['OUTBOXKIT_PERMISSION_DENIED']);
      expect(errors[0]!.retriable).toBe(false);
      expect(errors[0]!.message).toBe(
        'The database role okit_writer may not start replication (it has neither REPLICATION nor SUPERUSER), and the ' +
          'WAL relay reads its slot through a replication connection: as a superuser, run ' +
          'ALTER ROLE okit_writer WITH REPLICATION (on Amazon RDS or Aurora: GRANT rds_replication TO okit_writer) ' +
          '(docs/wal-source.md, "What it needs from PostgreSQL").',
      );
    });

    it('quotes a role name that is not a plain lower-case identifier in the statement', () => {
      const { errors } = assess({ role: 'Relay "A"', rolReplication: false });
      expect(errors[0]!.message).toContain('The database role Relay "A" may not start replication');
      expect(errors[0]!.message).toContain('ALTER ROLE "Relay ""A""" WITH REPLICATION');
    });

    it.each([
      ['REPLICATION', { rolReplication: true }],
      ['SUPERUSER', { rolSuper: true }],
      ['a member of rds_replication (Amazon RDS, Aurora)', { rdsReplication: true }],
    ] as const)('%s is enough', (_name, grant) => {
      const { errors } = assess({ rolReplication: false, rolSuper: false, rdsReplication: false, ...grant });
      expect(errors).toEqual([]);
    });
  });

  describe('max_wal_senders and max_replication_slots', () => {
    it.each([
      ['max_wal_senders', { maxWalSenders: 0 }, 'this server runs max_wal_senders = 0: raise max_wal_senders in'],
      [
        'max_replication_slots',
        { maxReplicationSlots: 0 },
        'this server runs max_replication_slots = 0: raise max_replication_slots in',
      ],
      [
        'both',
        { maxWalSenders: 0, maxReplicationSlots: 0 },
        'this server runs max_wal_senders = 0 and max_replication_slots = 0: raise max_wal_senders and max_replication_slots in',
      ],
    ] as const)('%s at 0: one UnsupportedServerError naming the settings at 0', (_name, settings, names) => {
      const { errors } = assess(settings);
      expect(codes(errors)).toEqual(['OUTBOXKIT_UNSUPPORTED_SERVER']);
      expect(errors[0]!.message).toContain(names);
      expect(errors[0]!.message).toContain('restart PostgreSQL');
    });

    it('1 of each is enough; an unknown value (null) is not judged', () => {
      expect(assess({ maxWalSenders: 1, maxReplicationSlots: 1 }).errors).toEqual([]);
      expect(assess({ maxWalSenders: null, maxReplicationSlots: null }).errors).toEqual([]);
    });
  });

  describe('statusIntervalMs against wal_sender_timeout', () => {
    it('equal to wal_sender_timeout: InvalidOptionsError naming both values and both knobs', () => {
      const { errors, notes } = assess({ walSenderTimeoutMs: 5_000 }, 5_000);
      expect(codes(errors)).toEqual(['OUTBOXKIT_INVALID_OPTIONS']);
      expect(errors[0]!.retriable).toBe(false);
      expect(errors[0]!.message).toBe(
        "statusIntervalMs (--wal-status-interval-ms) is 5000 ms, not below the server's wal_sender_timeout of 5000 ms: " +
          'while the relay waits (a send in flight, Kafka down) its status updates are all that keeps the replication ' +
          'connection alive, and the walsender ends one silent for wal_sender_timeout. Lower statusIntervalMs ' +
          '(--wal-status-interval-ms) to at most 2500 ms, or raise wal_sender_timeout (postgresql.conf, ALTER ROLE or ' +
          'ALTER DATABASE ... SET, or the connection\'s options) (docs/wal-source.md, "Start-up checks").',
      );
      expect(notes.filter((n) => 'statusIntervalMs' in n.fields)).toEqual([]);
    });

    it('above wal_sender_timeout: InvalidOptionsError', () => {
      expect(codes(assess({ walSenderTimeoutMs: 5_000 }, 60_000).errors)).toEqual(['OUTBOXKIT_INVALID_OPTIONS']);
    });

    it('wal_sender_timeout 0 (disabled) or unknown: any interval is fine, without a warning', () => {
      for (const walSenderTimeoutMs of [0, null]) {
        const { errors, notes } = assess({ walSenderTimeoutMs }, 3_600_000);
        expect(errors).toEqual([]);
        expect(notes.map((n) => n.fields)).toEqual([{ maxSlotWalKeepSizeMb: 1_024 }]);
      }
    });

    it('above half of wal_sender_timeout and below it: a warning with both values', () => {
      for (const interval of [2_501, 4_999]) {
        const { errors, notes } = assess({ walSenderTimeoutMs: 5_000 }, interval);
        expect(errors).toEqual([]);
        expect(notes[0]).toEqual({
          level: 'warn',
          fields: { statusIntervalMs: interval, walSenderTimeoutMs: 5_000 },
          message:
            `statusIntervalMs (--wal-status-interval-ms) is ${interval} ms, above half of the server's ` +
            'wal_sender_timeout (5000 ms): one late status update and the walsender ends a relay that waits; lower ' +
            'statusIntervalMs (--wal-status-interval-ms) to at most 2500 ms, or raise wal_sender_timeout ' +
            "(postgresql.conf, ALTER ROLE or ALTER DATABASE ... SET, or the connection's options)",
        });
      }
    });

    it('exactly half of wal_sender_timeout, or less: no warning', () => {
      for (const interval of [2_500, 10]) {
        const { notes } = assess({ walSenderTimeoutMs: 5_000 }, interval);
        expect(notes.filter((n) => 'statusIntervalMs' in n.fields)).toEqual([]);
      }
    });

    it("PostgreSQL's default (60 s) and the relay's (10 s): no warning", () => {
      expect(assess({ walSenderTimeoutMs: 60_000 }, 10_000).notes.map((n) => n.level)).toEqual(['info']);
    });
  });

  describe('max_slot_wal_keep_size', () => {
    it('-1 (no limit): a warning that the slot can fill the disk, naming the docs section', () => {
      const { errors, notes } = assess({ maxSlotWalKeepSizeMb: -1 });
      expect(errors).toEqual([]);
      expect(notes).toEqual([
        {
          level: 'warn',
          fields: { maxSlotWalKeepSizeMb: -1 },
          message:
            "max_slot_wal_keep_size is -1 (no limit): while no relay reads the slot, it retains the server's WAL " +
            "without bound and can fill the server's disk; set max_slot_wal_keep_size in postgresql.conf (a reload " +
            'applies it) to what the disk can spare: past it PostgreSQL invalidates the slot and the relay resyncs ' +
            'from the outbox table (docs/wal-source.md, "Slot loss and resync")',
        },
      ]);
    });

    it('set: an info line with its value in MB; unknown (null): nothing', () => {
      expect(assess({ maxSlotWalKeepSizeMb: 0 }).notes).toMatchObject([
        { level: 'info', fields: { maxSlotWalKeepSizeMb: 0 } },
      ]);
      expect(assess({ maxSlotWalKeepSizeMb: 102_400 }).notes[0]!.message).toMatch(
        /^max_slot_wal_keep_size is 102400 MB: /,
      );
      expect(assess({ maxSlotWalKeepSizeMb: null }).notes).toEqual([]);
    });
  });

  it('lists every error, in the order they are thrown: wal_level, the role, the settings at 0, the interval', () => {
    const { errors, notes } = assess(
      {
        walLevel: 'replica',
        rolReplication: false,
        maxWalSenders: 0,
        walSenderTimeoutMs: 1_000,
        maxSlotWalKeepSizeMb: -1,
      },
      1_000,
    );
    expect(codes(errors)).toEqual([
      'OUTBOXKIT_UNSUPPORTED_SERVER',
      'OUTBOXKIT_PERMISSION_DENIED',
      'OUTBOXKIT_UNSUPPORTED_SERVER',
      'OUTBOXKIT_INVALID_OPTIONS',
    ]);
    expect(errors[0]!.message).toContain('wal_level');
    expect(errors[2]!.message).toContain('max_wal_senders = 0');
    expect(notes.map((n) => n.level)).toEqual(['warn']);
  });
});

/** A fake connection answering every query with `row`, recording the statements. */
function fakeDb(row: Record<string, unknown>): Queryable & { statements: string[] } {
  const statements: string[] = [];
  return {
    statements,
    query: async <R>(text: string) => {
      statements.push(text);
      return { rows: [row as R], rowCount: 1 };
    },
  };
}

const GOOD_ROW = {
  wal_level: 'logical',
  role: 'relay',
  rol_replication: true,
  rol_super: false,
  rds_replication: false,
  max_wal_senders: 10,
  max_replication_slots: 10,
  wal_sender_timeout: 60_000,
  max_slot_wal_keep_size: -1,
};

describe('checkWalServer', () => {
  it('reads everything in one query (pg_settings, pg_roles) and returns the notes', async () => {
    const db = fakeDb(GOOD_ROW);
    const notes = await checkWalServer(db, DEFAULT_INTERVAL);
    expect(db.statements).toHaveLength(1);
    expect(db.statements[0]).toContain('pg_settings');
    expect(db.statements[0]).toContain('pg_roles');
    expect(notes.map((n) => [n.level, n.fields])).toEqual([['warn', { maxSlotWalKeepSizeMb: -1 }]]);
  });

  it('throws the first error', async () => {
    const db = fakeDb({ ...GOOD_ROW, role: 'okit_writer', rol_replication: false, max_wal_senders: 0 });
    const error = await checkWalServer(db, DEFAULT_INTERVAL).catch((err: unknown) => err);
    expect(isOutboxkitError(error, 'OUTBOXKIT_PERMISSION_DENIED')).toBe(true);
    expect((error as Error).message).toContain('ALTER ROLE okit_writer WITH REPLICATION');
  });
});

describe('logWalServerNotes', () => {
  it('logs each note at its level, one line with its fields and the ones given', () => {
    const lines: [string, Record<string, unknown>, string][] = [];
    const logger: Logger = {
      debug: (o, m) => lines.push(['debug', o, m]),
      info: (o, m) => lines.push(['info', o, m]),
      warn: (o, m) => lines.push(['warn', o, m]),
      error: (o, m) => lines.push(['error', o, m]),
    };
    const { notes } = assess({ walSenderTimeoutMs: 5_000 }, 3_000);
    logWalServerNotes(logger, notes, { slot: 'outboxkit_relay' });
    expect(lines.map(([level, fields]) => [level, fields])).toEqual([
      ['warn', { slot: 'outboxkit_relay', statusIntervalMs: 3_000, walSenderTimeoutMs: 5_000 }],
      ['info', { slot: 'outboxkit_relay', maxSlotWalKeepSizeMb: 1_024 }],
    ]);
    expect(lines.every(([, , message]) => !message.includes('\n'))).toBe(true);
  });
});

describe('requireLogicalWal (still exported, from wal-relay.ts too)', () => {
  it('passes at wal_level = logical, and throws the same UnsupportedServerError otherwise', async () => {
    expect(reexported).toBe(requireLogicalWal);
    await expect(requireLogicalWal(fakeDb({ v: 'logical' }))).resolves.toBeUndefined();
    await expect(requireLogicalWal(fakeDb({ v: 'replica' }))).rejects.toMatchObject({
      code: 'OUTBOXKIT_UNSUPPORTED_SERVER',
      message: WAL_LEVEL_MESSAGE('replica'),
    });
  });
});
