/**
 * Every command that reads outboxkit's tables reports a database that was never migrated, or a
 * `--schema` with no tables, as OUTBOXKIT_SCHEMA_MISSING with the hint `outboxkit migrate --schema
 * <schema>` (never a bare SQLSTATE such as 42P01), and so do the relay's operator functions in
 * relay/sql.ts for library users. `lanes release` of a relay id that holds no lanes is an error
 * (exit 1), like `parked skip` of an id that is not a parked event.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { backlog, laneOwners, listParked, releaseOwner, retryParked, skipParked } from '../../relay/sql.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { finished, jsonError, spawnCli } from '../helpers/processes.js';

const cli = (args: string[]) => finished(spawnCli(args));

const EVENT_ID = '0190d9a5-7e6b-7c1a-9f0e-3b5a1c2d4e6f';

/** Every command with a database pool: all read or change outboxkit's tables. */
const COMMANDS: string[][] = [
  ['status'],
  ['lanes', 'release', 'some-relay'],
  ['parked', 'list'],
  ['parked', 'retry', '--all'],
  ['parked', 'retry', EVENT_ID],
  ['parked', 'skip', EVENT_ID],
  ['keys', 'list', '--state', 'processing'],
  ['keys', 'cleanup'],
  ['inbox', 'cleanup'],
  ['inbox', 'progress-reset', '--group', 'g'],
  ['wal', 'drop-slot'],
];
const CASES = COMMANDS.map((args) => [args.join(' '), args] as const);

let db: TestDatabase;
/** A database without outboxkit's schema, as one never migrated. */
let bare: TestDatabase;
beforeAll(async () => {
  [db, bare] = await Promise.all([createTestDatabase({ poolSize: 2 }), createTestDatabase({ poolSize: 1 })]);
  await bare.pool.query('DROP SCHEMA outboxkit CASCADE');
});
afterAll(async () => {
  await Promise.all([db?.drop(), bare?.drop()]);
});

describe('outboxkit tables missing: OUTBOXKIT_SCHEMA_MISSING with `migrate --schema <schema>`, exit 1', () => {
  it.each(CASES)('%s: a database never migrated (default schema)', async (_name, args) => {
    const r = await cli([...args, '--database-url', bare.url, '--json']);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    const error = jsonError(r);
    expect(error.code, error.message).toBe('OUTBOXKIT_SCHEMA_MISSING');
    expect(error.message).toContain('in schema "outboxkit"');
    expect(error.message).toContain('run `outboxkit migrate --schema outboxkit`');
  });

  it.each(CASES)('%s: --schema nosuchschema on a migrated database', async (_name, args) => {
    const r = await cli([...args, '--database-url', db.url, '--schema', 'nosuchschema', '--json']);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    const error = jsonError(r);
    expect(error.code, error.message).toBe('OUTBOXKIT_SCHEMA_MISSING');
    expect(error.message).toContain('run `outboxkit migrate --schema nosuchschema`');
  });

  it('without --json: the typed error once on stderr', async () => {
    const r = await cli(['status', '--database-url', db.url, '--schema', 'nosuchschema']);
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(
      'outboxkit: OUTBOXKIT_SCHEMA_MISSING: outboxkit\'s tables are missing in schema "nosuchschema" ' +
        '(relation "nosuchschema.outbox_events" does not exist); run `outboxkit migrate --schema nosuchschema` ' +
        'or migrate() first.\n',
    );
  });

  it("relay/sql.ts's operator functions throw SchemaMissingError naming the schema", async () => {
    const schema = '"nosuchschema"';
    for (const call of [
      () => backlog(db.pool, schema),
      () => laneOwners(db.pool, schema),
      () => releaseOwner(db.pool, schema, 'some-relay'),
      () => listParked(db.pool, schema),
      () => retryParked(db.pool, schema, 'all'),
      () => skipParked(db.pool, schema, [EVENT_ID]),
    ]) {
      const err = await call().then(
        () => undefined,
        (e: unknown) => e as { code?: string; message?: string; cause?: { code?: string } },
      );
      expect(err?.code, String(call)).toBe('OUTBOXKIT_SCHEMA_MISSING');
      expect(err?.message).toContain('--schema nosuchschema');
      expect(err?.cause?.code).toBe('42P01');
    }
    // Any other error is left as it is.
    await expect(skipParked(db.pool, '"outboxkit"', ['not-a-uuid'])).rejects.toMatchObject({ code: '22P02' });
  });
});

describe('lanes release of a relay that holds no lanes', () => {
  it('exit 1 with the relays that do hold lanes; a relay that holds some: exit 0 and the count', async () => {
    await db.pool.query(
      'INSERT INTO outboxkit.relay_lanes (lane) SELECT generate_series(0, 63) ON CONFLICT DO NOTHING',
    );
    await db.pool.query(
      `UPDATE outboxkit.relay_lanes SET owner_id = CASE WHEN lane < 40 THEN 'relay-a' ELSE 'relay-b' END,
              lease_expires_at = now() + interval '1 hour'`,
    );
    const typo = await cli(['lanes', 'release', 'relay-c', '--database-url', db.url]);
    expect(typo.code).toBe(1);
    expect(typo.stdout).toBe('');
    expect(typo.stderr).toBe(
      'outboxkit: relay "relay-c" holds no lanes: nothing was released (a mistyped id, or its lanes were already ' +
        'released or taken over); lanes are held by relay-a (40 lanes), relay-b (24 lanes). ' +
        'See `outboxkit status --schema outboxkit`.\n',
    );

    const released = await cli(['lanes', 'release', 'relay-b', '--database-url', db.url, '--json']);
    expect(released.code).toBe(0);
    expect(released.stderr).toBe('');
    expect(JSON.parse(released.stdout)).toEqual({ relayId: 'relay-b', released: 24 });

    // Released already: nothing left to release, the usual JSON with released 0, and exit 1.
    const again = await cli(['lanes', 'release', 'relay-b', '--database-url', db.url, '--json']);
    expect(again.code).toBe(1);
    expect(again.stderr).toBe('');
    expect(JSON.parse(again.stdout)).toEqual({ relayId: 'relay-b', released: 0 });
  });
});
