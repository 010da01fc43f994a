/**
 * The WAL relay's start-up check of the server (relay/wal/server-check.ts; docs/wal-source.md,
 * "Start-up checks") against the PostgreSQL at wal_level=logical (test/helpers/wal.ts), with roles
 * made for the test (trust authentication), dropped after it:
 * - a role without REPLICATION gets PermissionDeniedError naming the role and the fix from
 *   `start()`, before any slot, lease or `wal_slots` row exists; `outboxkit relay --source wal`
 *   prints it as one line and exits 1;
 * - a role whose `wal_sender_timeout` is 5 s (`ALTER ROLE … SET`: the setting is user-settable,
 *   so the relay's sessions, its walsender's too, see it) is refused `statusIntervalMs` 5000 with
 *   InvalidOptionsError naming both values and both knobs, by the library and by the CLI;
 * - `statusIntervalMs` above half of `wal_sender_timeout` (set through the connection's options)
 *   is a warning, and `max_slot_wal_keep_size` a warning at -1, else an info line with its value:
 *   logged by the relay that holds the slot, not by a standby (it tries again often), and through
 *   the CLI's pino logger.
 * The unit test (test/unit/relay/wal/server-check.test.ts) covers every branch of the rule.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { ensurePublication } from '../../relay/wal/slot-sql.js';
import { createWalRelay, type WalRelay, type WalRelayOptions } from '../../relay/wal/wal-relay.js';
import { isOutboxkitError } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';
import { migrate } from '../../src/migrate.js';
import type { TestDatabase } from '../helpers/db.js';
import { finished, kill, spawnCli, type Spawned } from '../helpers/processes.js';
import { asRole, dropRoles } from '../helpers/roles.js';
import { waitFor } from '../helpers/wait-for.js';
import { createWalTestDatabase, randomSlotName, requireWalDatabaseUrl } from '../helpers/wal.js';

const PUBLICATION = 'server_check_pub';
/** May change outboxkit's tables (so it could take a slot's lease), without REPLICATION. */
const NO_REPLICATION = `okit_norepl_${randomBytes(4).toString('hex')}`;
/** REPLICATION, the same grants, and `wal_sender_timeout` 5 s for its sessions. */
const SHORT_TIMEOUT = `okit_short_${randomBytes(4).toString('hex')}`;

let wal: TestDatabase;
let walUrl: string;
const relays: WalRelay[] = [];
const children: Spawned[] = [];

beforeAll(async () => {
  walUrl = await requireWalDatabaseUrl();
  wal = await createWalTestDatabase({ poolSize: 2 });
  await migrate({ connectionString: wal.url });
  await ensurePublication(wal.pool, PUBLICATION, ['outboxkit.outbox_events']);
  await wal.pool.query(`CREATE ROLE ${NO_REPLICATION} LOGIN`);
  await wal.pool.query(`CREATE ROLE ${SHORT_TIMEOUT} LOGIN REPLICATION`);
  await wal.pool.query(`ALTER ROLE ${SHORT_TIMEOUT} SET wal_sender_timeout = '5s'`);
  for (const role of [NO_REPLICATION, SHORT_TIMEOUT]) {
    await wal.pool.query(`GRANT USAGE ON SCHEMA outboxkit TO ${role}`);
    await wal.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outboxkit TO ${role}`);
  }
}, 60_000);

afterEach(async () => {
  for (const child of children.splice(0)) await kill(child.proc, 'SIGKILL');
  for (const relay of relays.splice(0)) await relay.stop({ timeoutMs: 2_000 });
});

afterAll(async () => {
  // The database first (it drops the relays' slots): the roles' grants go with it.
  await wal?.drop();
  if (walUrl !== undefined) await dropRoles(walUrl, [NO_REPLICATION, SHORT_TIMEOUT]);
});

/** A relay on the test database, the publication and the test broker, stopped after the test. */
function relay(slot: string, overrides: Partial<WalRelayOptions> = {}): WalRelay {
  const r = createWalRelay({
    connection: wal.url,
    slot,
    publication: PUBLICATION,
    brokers: inject('kafkaBrokers'),
    brokerTimeoutMs: 3_000,
    retryInitialMs: 50,
    retryMaxMs: 500,
    ...overrides,
  });
  relays.push(r);
  return r;
}

/** A logger recording every line as `[level, fields, message]`. */
function recordingLogger(): { logger: Logger; lines: [string, Record<string, unknown>, string][] } {
  const lines: [string, Record<string, unknown>, string][] = [];
  const at = (level: string) => (fields: Record<string, unknown>, message: string) =>
    void lines.push([level, fields, message]);
  return { logger: { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }, lines };
}

/** What the database holds of `slot`: the slot itself, its lease row, its `wal_slots` row. */
async function traces(slot: string): Promise<{ slot: number; lease: number; recorded: number }> {
  const count = async (sql: string) => (await wal.pool.query(sql, [slot])).rowCount ?? 0;
  return {
    slot: await count('SELECT 1 FROM pg_replication_slots WHERE slot_name = $1'),
    lease: await count('SELECT 1 FROM outboxkit.wal_slot_leases WHERE slot_name = $1'),
    recorded: await count('SELECT 1 FROM outboxkit.wal_slots WHERE slot_name = $1'),
  };
}

/** The server's `max_slot_wal_keep_size`, in MB (-1: no limit). */
async function maxSlotWalKeepSizeMb(): Promise<number> {
  const { rows } = await wal.pool.query<{ mb: number }>(
    `SELECT setting::int AS mb FROM pg_settings WHERE name = 'max_slot_wal_keep_size'`,
  );
  return rows[0]!.mb;
}

const NO_REPLICATION_MESSAGE =
  `The database role ${NO_REPLICATION} may not start replication (it has neither REPLICATION nor SUPERUSER), and ` +
  'the WAL relay reads its slot through a replication connection: as a superuser, run ' +
  `ALTER ROLE ${NO_REPLICATION} WITH REPLICATION (on Amazon RDS or Aurora: GRANT rds_replication TO ${NO_REPLICATION}) ` +
  '(docs/wal-source.md, "What it needs from PostgreSQL").';

const TIMEOUT_MESSAGE_START =
  "statusIntervalMs (--wal-status-interval-ms) is 5000 ms, not below the server's wal_sender_timeout of 5000 ms: ";

/** `outboxkit relay --source wal` on `url` for `slot` and the test's publication, without metrics. */
function walRelayCli(url: string, slot: string, extra: string[] = [], logLevel = 'silent') {
  return spawnCli([
    'relay',
    '--source',
    'wal',
    '--database-url',
    url,
    '--wal-slot',
    slot,
    '--wal-publication',
    PUBLICATION,
    ...extra,
    '--metrics-port',
    '-1',
    '--log-level',
    logLevel,
  ]);
}

describe('a role without REPLICATION', () => {
  // Before the check, such a relay took the slot's lease and failed creating the slot with
  // PostgreSQL's bare 42501, which the CLI reported as a missing grant on the schema.
  it('start() rejects with PermissionDeniedError naming the role and the fix, before any slot or lease', async () => {
    const slot = randomSlotName('check_norepl');
    const error = await relay(slot, { connection: asRole(wal.url, NO_REPLICATION) })
      .start()
      .then(
        () => undefined,
        (err: unknown) => err,
      );
    expect(isOutboxkitError(error, 'OUTBOXKIT_PERMISSION_DENIED'), String(error)).toBe(true);
    expect((error as Error).message).toBe(NO_REPLICATION_MESSAGE);
    expect((error as { retriable: boolean }).retriable).toBe(false);
    expect(await traces(slot)).toEqual({ slot: 0, lease: 0, recorded: 0 });
  });

  it('outboxkit relay --source wal prints it as one line and exits 1, creating no slot', async () => {
    const slot = randomSlotName('check_norepl_cli');
    const r = await finished(walRelayCli(asRole(wal.url, NO_REPLICATION), slot));
    expect({ code: r.code, stderr: r.stderr }).toEqual({
      code: 1,
      stderr: `outboxkit: OUTBOXKIT_PERMISSION_DENIED: ${NO_REPLICATION_MESSAGE}\n`,
    });
    expect(await traces(slot)).toEqual({ slot: 0, lease: 0, recorded: 0 });
  });
});

describe("statusIntervalMs against the role's wal_sender_timeout", () => {
  it('wal_sender_timeout is user-settable, and the role sees 5 s', async () => {
    const { rows } = await wal.pool.query<{ context: string }>(
      `SELECT context FROM pg_settings WHERE name = 'wal_sender_timeout'`,
    );
    expect(rows[0]!.context).toBe('user');
    const asShort = new pg.Client({ connectionString: asRole(wal.url, SHORT_TIMEOUT) });
    await asShort.connect();
    try {
      const seen = await asShort.query<{ wal_sender_timeout: string }>('SHOW wal_sender_timeout');
      expect(seen.rows[0]!.wal_sender_timeout).toBe('5s');
    } finally {
      await asShort.end();
    }
  });

  it('statusIntervalMs equal to it: start() rejects with InvalidOptionsError naming both, before any slot or lease', async () => {
    const slot = randomSlotName('check_timeout');
    const error = await relay(slot, { connection: asRole(wal.url, SHORT_TIMEOUT), statusIntervalMs: 5_000 })
      .start()
      .then(
        () => undefined,
        (err: unknown) => err,
      );
    expect(isOutboxkitError(error, 'OUTBOXKIT_INVALID_OPTIONS'), String(error)).toBe(true);
    const message = (error as Error).message;
    expect(message.startsWith(TIMEOUT_MESSAGE_START), message).toBe(true);
    expect(message).toContain('to at most 2500 ms, or raise wal_sender_timeout');
    expect(await traces(slot)).toEqual({ slot: 0, lease: 0, recorded: 0 });
  });

  it('outboxkit relay --source wal --wal-status-interval-ms 5000: one line, exit 1', async () => {
    const slot = randomSlotName('check_timeout_cli');
    const r = await finished(walRelayCli(asRole(wal.url, SHORT_TIMEOUT), slot, ['--wal-status-interval-ms', '5000']));
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr.startsWith(`outboxkit: OUTBOXKIT_INVALID_OPTIONS: ${TIMEOUT_MESSAGE_START}`), r.stderr).toBe(true);
    expect(r.stderr.split('\n')).toHaveLength(2); // one line, and its end
    expect(await traces(slot)).toEqual({ slot: 0, lease: 0, recorded: 0 });
  });
});

describe('warnings and the max_slot_wal_keep_size line', () => {
  it('logged once by the relay that holds the slot, not by a standby', async () => {
    const slot = randomSlotName('check_notes');
    // wal_sender_timeout 5 s through the connection's options (its replication connection's too).
    const connection = { connectionString: wal.url, options: '-c wal_sender_timeout=5000' };
    const reader = recordingLogger();
    await relay(slot, { connection, statusIntervalMs: 3_000, logger: reader.logger }).start();

    const keepMb = await maxSlotWalKeepSizeMb();
    const notes = reader.lines.filter(
      ([, fields]) => 'walSenderTimeoutMs' in fields || 'maxSlotWalKeepSizeMb' in fields,
    );
    expect(notes.map(([level, fields]) => [level, fields])).toEqual([
      ['warn', { slot, statusIntervalMs: 3_000, walSenderTimeoutMs: 5_000 }],
      [keepMb === -1 ? 'warn' : 'info', { slot, maxSlotWalKeepSizeMb: keepMb }],
    ]);
    expect(notes[1]![2]).toContain('(docs/wal-source.md, "Slot loss and resync")');
    if (keepMb === -1) expect(notes[1]![2]).toContain("can fill the server's disk");
    else expect(notes[1]![2]).toMatch(new RegExp(`^max_slot_wal_keep_size is ${keepMb} MB: `));

    const standby = recordingLogger();
    const error = await relay(slot, { connection, statusIntervalMs: 3_000, logger: standby.logger })
      .start()
      .then(
        () => undefined,
        (err: unknown) => err,
      );
    expect(isOutboxkitError(error, 'OUTBOXKIT_WAL_STREAM_FAILED') && error.retriable, String(error)).toBe(true);
    expect(standby.lines.filter(([, fields]) => 'maxSlotWalKeepSizeMb' in fields)).toEqual([]);
  });

  it('outboxkit relay --source wal logs the max_slot_wal_keep_size line through pino', async () => {
    const slot = randomSlotName('check_notes_cli');
    const keepMb = await maxSlotWalKeepSizeMb();
    const child = walRelayCli(wal.url, slot, [], 'info');
    children.push(child);
    const line = await waitFor(
      () =>
        child.stdout
          .join('')
          .split('\n')
          .find((l) => l.includes('max_slot_wal_keep_size is')),
      { timeoutMs: 20_000, message: () => `no max_slot_wal_keep_size line (${child.output.join('').slice(-3000)})` },
    );
    const entry = JSON.parse(line) as Record<string, unknown>;
    // pino's levels: 40 warn, 30 info.
    expect(entry).toMatchObject({ level: keepMb === -1 ? 40 : 30, slot, maxSlotWalKeepSizeMb: keepMb });
    await waitFor(() => child.stdout.join('').includes('"msg":"WAL relay started"'), {
      timeoutMs: 20_000,
      message: () => `the relay did not start (${child.output.join('').slice(-3000)})`,
    });
    child.proc.kill('SIGTERM');
    expect(await child.exited).toEqual({ code: 0, signal: null });
  });
});

describe('other replication slots of the same outbox', () => {
  // Breach caught: two WAL relays given different slots of one outbox each publish every event
  // (the dedup consumer absorbs it, other consumers see everything twice), and a slot nobody
  // reads keeps WAL on the server; before this, nothing said so.
  it('the reader warns at start about the other slots WAL relays recorded, not about its own', async () => {
    const first = randomSlotName('check_other_a');
    const second = randomSlotName('check_other_b');
    const a = relay(first);
    await a.start();
    await a.stop({ timeoutMs: 2_000 });

    const reader = recordingLogger();
    await relay(second, { logger: reader.logger }).start();
    const warnings = reader.lines.filter(([level, fields]) => level === 'warn' && 'otherSlots' in fields);
    expect(warnings).toHaveLength(1);
    const [, fields, message] = warnings[0]!;
    expect(fields.slot).toBe(second);
    const others = fields.otherSlots as { slot: string; active: boolean; retainedBytes: number | null }[];
    expect(others).toContainEqual(expect.objectContaining({ slot: first, active: false }));
    expect(others.map((o) => o.slot)).not.toContain(second);
    expect(message).toContain(first);
    expect(message).toContain('outboxkit wal drop-slot');
  });
});
