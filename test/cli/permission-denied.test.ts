/**
 * A database role that may not use outboxkit's schema (no `USAGE`, SQLSTATE 42501) gets
 * OUTBOXKIT_PERMISSION_DENIED naming the grants it needs, not a bare `42501`: every command with a
 * database pool, the table relay and `relay --source wal`. A WAL relay whose role may read the
 * table but not create the missing publication is told how to create it (the schema's grants would
 * not help). The roles are real ones made for the test (trust authentication), dropped after it.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import * as root from '../../src/index.js';
import { migrate } from '../../src/migrate.js';
import { dropWalSlot, ensureLogicalSlot } from '../../relay/wal/slot-sql.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { finished, jsonError, spawnCli } from '../helpers/processes.js';
import { asRole, dropRoles } from '../helpers/roles.js';
import { createWalTestDatabase, requireWalDatabaseUrl } from '../helpers/wal.js';

const cli = (args: string[]) => finished(spawnCli(args));

const EVENT_ID = '0190d9a5-7e6b-7c1a-9f0e-3b5a1c2d4e6f';
/** A role with no privilege on outboxkit's schema (on both servers: roles belong to a cluster). */
const STRANGER = `okit_stranger_${randomBytes(4).toString('hex')}`;
/**
 * A role that may read outboxkit's tables on the WAL server, but owns none; with `REPLICATION`, as a
 * relay's role has (without it the relay's start-up check refuses it before the publication:
 * test/wal/server-check.test.ts).
 */
const READER = `okit_reader_${randomBytes(4).toString('hex')}`;
/** A role that may change outboxkit's tables on the WAL server, without `REPLICATION`. */
const WRITER = `okit_writer_${randomBytes(4).toString('hex')}`;

/** Every command with a database pool (as test/cli/schema-missing.test.ts). */
const COMMANDS: string[][] = [
  ['status'],
  ['lanes', 'release', 'some-relay'],
  ['parked', 'list'],
  ['parked', 'retry', '--all'],
  ['parked', 'skip', EVENT_ID],
  ['keys', 'list', '--state', 'processing'],
  ['keys', 'cleanup'],
  ['inbox', 'cleanup'],
  ['inbox', 'progress-reset', '--group', 'g'],
  ['wal', 'drop-slot'],
];

let db: TestDatabase;
let wal: TestDatabase;
let walUrl: string;
beforeAll(async () => {
  walUrl = await requireWalDatabaseUrl();
  [db, wal] = await Promise.all([createTestDatabase({ poolSize: 1 }), createWalTestDatabase({ poolSize: 1 })]);
  await migrate({ connectionString: wal.url });
  await db.pool.query(`CREATE ROLE ${STRANGER} LOGIN`);
  await wal.pool.query(`CREATE ROLE ${STRANGER} LOGIN`);
  await wal.pool.query(`CREATE ROLE ${READER} LOGIN REPLICATION`);
  await wal.pool.query(`GRANT USAGE ON SCHEMA outboxkit TO ${READER}`);
  await wal.pool.query(`GRANT SELECT ON ALL TABLES IN SCHEMA outboxkit TO ${READER}`);
  await wal.pool.query(`CREATE ROLE ${WRITER} LOGIN`);
  await wal.pool.query(`GRANT USAGE ON SCHEMA outboxkit TO ${WRITER}`);
  await wal.pool.query(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outboxkit TO ${WRITER}`);
}, 60_000);
afterAll(async () => {
  await Promise.all([db?.drop(), wal?.drop()]);
  // Their grants went with the databases: the roles own nothing left.
  for (const [url, roles] of [
    [inject('databaseUrl'), [STRANGER]],
    [walUrl, [STRANGER, READER, WRITER]],
  ] as const) {
    if (url !== undefined) await dropRoles(url, roles);
  }
});

const GRANTS =
  'As the schema\'s owner, grant it: GRANT USAGE ON SCHEMA "outboxkit" TO <role>; then the privileges on the tables, ' +
  'GRANT SELECT ON ALL TABLES IN SCHEMA "outboxkit" TO <role> for `outboxkit status` and `parked list`, ' +
  'or GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "outboxkit" TO <role> for a relay ' +
  'and the commands that change rows (docs/configuration.md, "Database privileges").';

describe('PermissionDeniedError', () => {
  it('is exported from outboxkit, its code in ERROR_CODES, not retriable', () => {
    const err = new root.PermissionDeniedError('denied');
    expect(root.isOutboxkitError(err, 'OUTBOXKIT_PERMISSION_DENIED')).toBe(true);
    expect(err.retriable).toBe(false);
    expect(root.ERROR_CODES).toContain('OUTBOXKIT_PERMISSION_DENIED');
  });
});

describe('a role without USAGE on the schema: OUTBOXKIT_PERMISSION_DENIED naming the grants, exit 1', () => {
  it.each(COMMANDS.map((args) => [args.join(' '), args] as const))('%s', async (_name, args) => {
    const r = await cli([...args, '--database-url', asRole(db.url, STRANGER), '--json']);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    const error = jsonError(r);
    expect(error.code, error.message).toBe('OUTBOXKIT_PERMISSION_DENIED');
    expect(error.message).toBe(
      `The database role may not use outboxkit's schema "outboxkit" (permission denied for schema outboxkit). ${GRANTS}`,
    );
  });

  it('the table relay and relay --source wal, as text on stderr', async () => {
    const [table, walRelay] = await Promise.all([
      cli(['relay', '--database-url', asRole(db.url, STRANGER), '--metrics-port', '-1', '--log-level', 'silent']),
      cli([
        'relay',
        '--source',
        'wal',
        '--database-url',
        asRole(wal.url, STRANGER),
        '--metrics-port',
        '-1',
        '--log-level',
        'silent',
      ]),
    ]);
    for (const r of [table, walRelay]) {
      expect({ code: r.code, stderr: r.stderr }).toEqual({
        code: 1,
        stderr:
          'outboxkit: OUTBOXKIT_PERMISSION_DENIED: The database role may not use outboxkit\'s schema "outboxkit" ' +
          `(permission denied for schema outboxkit). ${GRANTS}\n`,
      });
    }
  });

  it('relay --source wal with a role that may read the table but not create the publication: how to create it', async () => {
    const r = await cli([
      'relay',
      '--source',
      'wal',
      '--database-url',
      asRole(wal.url, READER),
      '--metrics-port',
      '-1',
      '--log-level',
      'silent',
    ]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /^outboxkit: OUTBOXKIT_PERMISSION_DENIED: The database role may not create publication outboxkit_outbox_events \(permission denied for database outboxkit_w_[0-9a-f]+\): that takes CREATE on the database and the ownership of "outboxkit"\.outbox_events\. Create it as the tables' owner: `outboxkit migrate --schema outboxkit --wal-publication outboxkit_outbox_events`\.\n$/,
    );
    const { rowCount } = await wal.pool.query('SELECT 1 FROM pg_publication');
    expect(rowCount).toBe(0);
  });
});

describe('wal drop-slot with a role without REPLICATION', () => {
  it('is refused with PermissionDeniedError naming REPLICATION, not the schema grants', async () => {
    await ensureLogicalSlot(wal.pool, 'outboxkit_relay');
    const pool = new pg.Pool({ connectionString: asRole(wal.url, WRITER), max: 1 });
    try {
      await expect(dropWalSlot(pool, '"outboxkit"', 'outboxkit_relay')).rejects.toMatchObject({
        code: 'OUTBOXKIT_PERMISSION_DENIED',
        message:
          'The database role may not drop replication slot outboxkit_relay (must be superuser or replication role to use replication slots): ' +
          'run it as a role with REPLICATION (ALTER ROLE <role> REPLICATION), as the WAL relay runs, or as a superuser.',
      });
    } finally {
      await pool.end();
    }
  });
});
