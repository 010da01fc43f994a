/**
 * The WAL source's publication: the one that streams the outbox table's inserts to a WAL relay
 * (docs/wal-source.md), created by `migrate({ walPublication })` and by the relay's tests, and the
 * rule for replication slot and publication names. Here, on the writer's side, because migrate()
 * creates it; the slot is the relay's (relay/wal/slot-sql.ts). Creating is idempotent and safe
 * from several processes at once (it creates, and takes "already exists" as success, rather than
 * checking first: a check-then-create races with a second creator).
 */
import pg from 'pg';
import type { Queryable } from './database.js';
import { InvalidOptionsError } from './errors.js';
import { SQLSTATE, sqlStateOf, type SqlStatement } from './postgres.js';

/**
 * Replication slot and publication names outboxkit accepts: PostgreSQL allows only lower-case
 * letters, digits and underscores in slot names (63 bytes at most), and pg-logical-replication
 * splices both names into `START_REPLICATION` without escaping; one rule for both keeps them safe.
 */
const REPLICATION_NAME = /^[a-z_][a-z0-9_]{0,62}$/;

/**
 * @returns `name` when it is a valid slot or publication name.
 * @throws {@link InvalidOptionsError} otherwise.
 */
export function checkReplicationName(name: string, what: 'slot' | 'publication'): string {
  if (typeof name !== 'string' || !REPLICATION_NAME.test(name)) {
    throw new InvalidOptionsError(
      `Invalid ${what} name ${JSON.stringify(name)}: use 1-63 lower-case letters, digits or underscores, not starting with a digit.`,
    );
  }
  return name;
}

/** A table as `schema.table` or `table`, each part quoted. */
function quoteTable(table: string): string {
  const parts = table.split('.');
  if (parts.length > 2 || parts.some((p) => p === '')) {
    throw new InvalidOptionsError(`Invalid table name ${JSON.stringify(table)}: use "table" or "schema.table".`);
  }
  return parts.map((p) => pg.escapeIdentifier(p)).join('.');
}

/**
 * `CREATE PUBLICATION … FOR TABLE … WITH (publish = 'insert')`. Inserts only: the relay deletes
 * the durable rows after Kafka acknowledged them, and those deletes must not come back through
 * the stream (docs/wal-source.md, "Removing the durable copies"). DDL takes no parameters, so the
 * names are validated and quoted here.
 */
export function createPublicationSql(publication: string, tables: readonly string[]): SqlStatement {
  checkReplicationName(publication, 'publication');
  if (tables.length === 0) throw new InvalidOptionsError('A publication needs at least one table.');
  return {
    text: `CREATE PUBLICATION ${pg.escapeIdentifier(publication)} FOR TABLE ${tables.map(quoteTable).join(', ')} WITH (publish = 'insert')`,
    values: [],
  };
}

/**
 * Creates the publication unless it exists. An existing one is kept as it is (its tables and
 * `publish` list are the operator's to change with ALTER PUBLICATION). Creating needs the `CREATE`
 * privilege on the database and ownership of the tables.
 *
 * @param publication - 1-63 of `[a-z0-9_]`, not starting with a digit.
 * @param tables - `table` or `schema.table` names (quoted here); at least one.
 * @returns whether this call created it.
 * @throws {@link InvalidOptionsError} for an invalid publication or table name, or no table.
 * @throws pg's error when PostgreSQL refuses (a missing table: SQLSTATE 42P01; no privilege: 42501).
 */
export async function ensurePublication(
  db: Queryable,
  publication: string,
  tables: readonly string[],
): Promise<boolean> {
  const { text, values } = createPublicationSql(publication, tables);
  try {
    await db.query(text, values);
    return true;
  } catch (err) {
    // CREATE PUBLICATION has no IF NOT EXISTS; "already exists" (42710) from a concurrent or an
    // earlier creator is success, which a check-then-create could not promise.
    if (sqlStateOf(err) === SQLSTATE.DUPLICATE_OBJECT) return false;
    throw err;
  }
}
