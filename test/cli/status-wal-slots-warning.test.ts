/**
 * `outboxkit status` says why it lists no WAL relay slot when it cannot read `<schema>.wal_slots`:
 * the table does not exist (a schema migrated before migration 0006) or the role may not read it.
 * `--json` has `walSlotsWarning` (`{ reason, message }`, null when the slots were read); the text
 * output a warning line on stderr naming the fix. The rest of the status is printed, exit 0.
 * The role is a real one made for the test (trust authentication), dropped after it.
 */
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { finished, spawnCli } from '../helpers/processes.js';
import { asRole, dropRoles } from '../helpers/roles.js';

const cli = (args: string[]) => finished(spawnCli(args));

/** A monitoring role: it may read outboxkit's tables but `wal_slots`. */
const ROLE = `okit_monitor_${randomBytes(4).toString('hex')}`;

let db: TestDatabase;
/** A database whose schema lacks `wal_slots`, as one migrated before 0006. */
let old: TestDatabase;
beforeAll(async () => {
  [db, old] = await Promise.all([createTestDatabase({ poolSize: 1 }), createTestDatabase({ poolSize: 1 })]);
  await old.pool.query('DROP TABLE outboxkit.wal_slots');
  await db.pool.query(`CREATE ROLE ${ROLE} LOGIN`);
  await db.pool.query(`GRANT USAGE ON SCHEMA outboxkit TO ${ROLE}`);
  await db.pool.query(`GRANT SELECT ON ALL TABLES IN SCHEMA outboxkit TO ${ROLE}`);
  await db.pool.query(`REVOKE SELECT ON outboxkit.wal_slots FROM ${ROLE}`);
});
afterAll(async () => {
  await Promise.all([db?.drop(), old?.drop()]);
  // Its grants went with the database: the role owns nothing left.
  await dropRoles(inject('databaseUrl'), [ROLE]);
});

interface Status {
  backlog: { pending: number };
  walSlots: unknown[];
  walSlotsWarning: { reason: string; message: string } | null;
}

describe('outboxkit status without the WAL slots table, or without the right to read it', () => {
  it('a schema migrated before 0006: walSlotsWarning table-missing, naming `outboxkit migrate`', async () => {
    const json = await cli(['status', '--database-url', old.url, '--json']);
    expect(json.code, json.stderr).toBe(0);
    expect(json.stderr).toBe('');
    const status = JSON.parse(json.stdout) as Status;
    expect(status.backlog.pending).toBe(0);
    expect(status.walSlots).toEqual([]);
    expect(status.walSlotsWarning).toEqual({
      reason: 'table-missing',
      message:
        'WAL relay slots not listed: "outboxkit".wal_slots does not exist (a schema migrated before migration 0006); ' +
        'run `outboxkit migrate --schema outboxkit` to create it.',
    });

    const text = await cli(['status', '--database-url', old.url]);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toMatch(/^pending: 0 {2}parked: 0/);
    expect(text.stderr).toBe(`outboxkit: warning: ${status.walSlotsWarning!.message}\n`);
  });

  it('a role that may not read wal_slots: walSlotsWarning permission-denied, naming the GRANT', async () => {
    const json = await cli(['status', '--database-url', asRole(db.url, ROLE), '--json']);
    expect(json.code, json.stderr).toBe(0);
    const status = JSON.parse(json.stdout) as Status;
    expect(status.backlog.pending).toBe(0);
    expect(status.walSlots).toEqual([]);
    expect(status.walSlotsWarning?.reason).toBe('permission-denied');
    expect(status.walSlotsWarning?.message).toMatch(
      /^WAL relay slots not listed: the database role may not read "outboxkit"\.wal_slots \(permission denied for table wal_slots\); grant it: GRANT SELECT ON "outboxkit"\.wal_slots TO <role>\.$/,
    );

    const text = await cli(['status', '--database-url', asRole(db.url, ROLE)]);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stderr).toBe(`outboxkit: warning: ${status.walSlotsWarning!.message}\n`);
  });

  it('a role that may read it: walSlotsWarning null, no warning', async () => {
    await db.pool.query(`GRANT SELECT ON outboxkit.wal_slots TO ${ROLE}`);
    try {
      const json = await cli(['status', '--database-url', asRole(db.url, ROLE), '--json']);
      expect(json.code, json.stderr).toBe(0);
      expect(JSON.parse(json.stdout)).toMatchObject({ walSlots: [], walSlotsWarning: null });
      const text = await cli(['status', '--database-url', asRole(db.url, ROLE)]);
      expect(text.code).toBe(0);
      expect(text.stderr).toBe('');
    } finally {
      await db.pool.query(`REVOKE SELECT ON outboxkit.wal_slots FROM ${ROLE}`);
    }
  });
});
