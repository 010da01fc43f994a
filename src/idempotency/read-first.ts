/**
 * The read-first path shared by both modes: before any transaction, one plain SELECT answers a
 * retry whose key has a terminal record within its retention (replay, or 422 on another
 * fingerprint). Everything else (no record, expired, processing, uncertain, not yet committed)
 * goes through the atomic claim as before. Why it is safe: {@link lookupTerminalRecord}.
 *
 * Cost: a replay is one statement with no transaction (no transaction id, no row lock, so no WAL
 * flush at commit), instead of a claim transaction that locks the row; a new key pays one extra
 * indexed read before its claim. (With a `pg.Pool` the claim transaction saves two round trips
 * elsewhere: see `executeIdempotent()`.)
 */
import type { SQL } from 'drizzle-orm';
import {
  drizzleQueryResult,
  isPgPool,
  loadDrizzleSql,
  loadedDrizzleSql,
  pgQuery,
  toDrizzleSql,
  type DatabaseHandle,
  type Queryable,
  type QueryResult,
} from '../database.js';
import type { Fingerprint } from './fingerprint.js';
import { decideOnExisting, type ExistingRecordDecision } from './state-machine.js';
import { lookupTerminalRecord, type RecordRef } from './store.js';

type DrizzleExecutor = { execute(query: SQL): Promise<unknown> };

/**
 * A {@link Queryable} that runs each statement on its own, outside any transaction (autocommit),
 * on a `pg.Pool` (`pool.query`) or a drizzle database (`db.execute`); `undefined` for a handle that
 * offers neither (the read-first path is then skipped, the claim alone decides).
 */
export function autocommitQueryable(db: DatabaseHandle): Queryable | undefined {
  let q = autocommit.get(db);
  if (q === undefined && !autocommit.has(db)) {
    q = makeAutocommitQueryable(db);
    autocommit.set(db, q);
  }
  return q;
}

// One adapter per database handle, built on its first request rather than on every one.
const autocommit = new WeakMap<object, Queryable | undefined>();

function makeAutocommitQueryable(db: DatabaseHandle): Queryable | undefined {
  if (isPgPool(db)) {
    return {
      query: <R>(text: string, values: readonly unknown[] = [], options?: { name?: string }): Promise<QueryResult<R>> =>
        pgQuery<R>(db, text, values, options?.name),
    };
  }
  const drizzleDb = db as Partial<DrizzleExecutor>;
  if (typeof drizzleDb.execute !== 'function') return undefined;
  const execute = drizzleDb.execute.bind(drizzleDb);
  return {
    async query<R>(text: string, values: readonly unknown[] = []): Promise<QueryResult<R>> {
      const sql = loadedDrizzleSql() ?? (await loadDrizzleSql());
      return drizzleQueryResult<R>(await execute(toDrizzleSql(sql, text, values)));
    },
  };
}

/**
 * Reads the key's record if it is terminal and unexpired, and decides: `replay` or `mismatch`.
 * `undefined`: take the claim path. Store errors propagate (the caller maps them to 503).
 */
export async function readFirst(
  db: DatabaseHandle,
  record: RecordRef,
  fingerprint: Fingerprint,
): Promise<Exclude<ExistingRecordDecision, { kind: 'in-progress' }> | undefined> {
  const q = autocommitQueryable(db);
  if (q === undefined) return undefined;
  const stored = await lookupTerminalRecord(q, record);
  if (stored === undefined) return undefined;
  const decision = decideOnExisting(stored, fingerprint);
  // A terminal record is never in progress; should it ever be, the claim path decides.
  return decision.kind === 'in-progress' ? undefined : decision;
}
