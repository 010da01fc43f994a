/**
 * How outboxkit joins the application's own transaction.
 *
 * outboxkit never opens a connection of its own for the application's writes: `enqueue()` and the
 * idempotency layer run their SQL inside the transaction the caller already holds, so that the
 * business rows, the idempotency record and the outbox events commit together (docs/guarantees.md, G2).
 *
 * Supported transaction handles (a small structural interface, like pg-boss's drizzle adapter):
 * - a `pg` client (`pg.Client` or a `pg.PoolClient`) inside `BEGIN`;
 * - a drizzle-orm transaction (`db.transaction(async (tx) => ...)`), node-postgres or postgres-js
 *   driver.
 *
 * What is refused, by type and at run time (test/outbox/enqueue.test.ts, "phantom events"): a `pg.Pool`, a `pg` client outside a
 * transaction or in an aborted one, a top-level drizzle database, and a finished drizzle
 * node-postgres transaction. What cannot be detected: a finished drizzle **postgres-js**
 * transaction handle (the driver exposes no transaction status); do not keep `tx` past its callback.
 */
import type { SQL, sql as drizzleSql } from 'drizzle-orm';
import type { PgTransaction } from 'drizzle-orm/pg-core';
import type pg from 'pg';
import { isDrizzleTransaction } from './drizzle-entity.js';
import { NotInTransactionError, schemaMissingOr } from './errors.js';
import { SQLSTATE } from './postgres.js';
import { preparedStatementName } from './prepared-statements.js';

/** The result shape outboxkit needs from a query. */
export interface QueryResult<R> {
  rows: R[];
  rowCount: number;
}

/** A connection that runs parameterised SQL (`$1`, `$2`, ...) inside one transaction. */
export interface Queryable {
  /**
   * @param options.name - a statement name: where the driver supports it (node-postgres), the
   *   statement is prepared once per connection and reused, which saves a parse and plan on hot
   *   paths. A session reset seen on the connection (`DEALLOCATE ALL`, `DISCARD ALL`) makes
   *   node-postgres parse it again; where outboxkit cannot tell what the session holds, it runs
   *   unnamed (src/prepared-statements.ts). The name must always go with the same text.
   */
  query<R = Record<string, unknown>>(
    text: string,
    values?: readonly unknown[],
    options?: { name?: string },
  ): Promise<QueryResult<R>>;
}

/** The subset of `pg.ClientBase` outboxkit uses. */
export interface PgClientLike {
  query(text: string, values?: unknown[]): Promise<{ rows: unknown[]; rowCount: number | null }>;
  query(config: {
    name?: string;
    text: string;
    values?: unknown[];
  }): Promise<{ rows: unknown[]; rowCount: number | null }>;
  getTransactionStatus?(): string | null;
}

// drizzle's transaction class is generic over the driver's result type; `any` keeps the
// structural check independent of the driver the application chose.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type DrizzleTransaction = PgTransaction<any, any, any>;

/**
 * A transaction handle outboxkit accepts: a `pg` client inside BEGIN, or a drizzle transaction.
 * A `pg.Pool` is rejected by type (it has `totalCount`) and at run time.
 */
export type TransactionHandle = DrizzleTransaction | (PgClientLike & { totalCount?: never });

/** Whether `value` is a `pg.Pool`, by its shape (an application may load two copies of pg). @internal */
export function isPgPool(value: unknown): value is pg.Pool {
  // pg.Pool (and pools shaped like it) expose these counters; clients do not.
  return (
    typeof value === 'object' &&
    value !== null &&
    'totalCount' in value &&
    'idleCount' in value &&
    typeof (value as { connect?: unknown }).connect === 'function'
  );
}

function abortedError(what: string, cause?: unknown): NotInTransactionError {
  return new NotInTransactionError(
    `${what} was given a transaction that has already failed (aborted); roll it back and retry the whole transaction.`,
    { cause },
  );
}

/**
 * Runs a query, turning "transaction is aborted" and "no transaction block" into
 * {@link NotInTransactionError}.
 */
async function guarded<T>(what: string, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (err) {
    // drizzle wraps the driver's error (DrizzleQueryError, the driver's as its cause).
    const code = (err as { code?: unknown }).code ?? (err as { cause?: { code?: unknown } }).cause?.code;
    if (code === SQLSTATE.IN_FAILED_SQL_TRANSACTION) throw abortedError(what, err);
    if (code === SQLSTATE.NO_ACTIVE_SQL_TRANSACTION) {
      throw new NotInTransactionError(
        `${what} ran outside a transaction block: call it with the client that holds your transaction, ` +
          'after BEGIN and before COMMIT (or with a drizzle `tx`).',
        { cause: err },
      );
    }
    throw schemaMissingOr(err);
  }
}

function checkPgClient(client: PgClientLike, what: string): void {
  // node-postgres before 8.21, or another object with a query() method: joinTransaction's
  // `verifyInTransaction` statement asks the database instead.
  if (typeof client.getTransactionStatus !== 'function') return;
  const status = client.getTransactionStatus();
  if (status === 'T') return;
  // node-postgres updates the status when ReadyForQuery arrives, which can be just after a failed
  // query's promise rejected; `guarded()` catches the aborted case the status misses.
  if (status === 'E') throw abortedError(what);
  throw new NotInTransactionError(
    `${what} needs a pg client inside BEGIN (transaction status is ${JSON.stringify(status)}); ` +
      'call it with the client that holds your transaction, after BEGIN and before COMMIT.',
  );
}

/**
 * Runs one statement on a node-postgres client or pool, as a {@link Queryable} runs it: prepared
 * once per connection under `name` where outboxkit has seen every command that could have removed
 * it from the session (`preparedStatementName()`), unnamed otherwise, so that a session reset
 * never fails the statement (case C33). On a pool it takes a client for the statement and gives it
 * back, as `pool.query()` does (a client whose statement failed is destroyed, not reused).
 */
export async function pgQuery<R>(
  client: PgClientLike | pg.Pool,
  text: string,
  values: readonly unknown[],
  name: string | undefined,
): Promise<QueryResult<R>> {
  if (isPgPool(client)) return poolQuery<R>(client, text, values, name);
  const prepared = preparedStatementName(client, name);
  const r = prepared
    ? await client.query({ name: prepared, text, values: values as unknown[] })
    : await client.query(text, values as unknown[]);
  return { rows: r.rows as R[], rowCount: r.rowCount ?? r.rows.length };
}

/**
 * {@link pgQuery} on a client of `pool`: the name is decided on the client that runs it. Written
 * as pg-pool's own `query()` is (callbacks, one promise, the same release and 'error' handling),
 * so that the relay's statements cost what they cost through `pool.query()` (a promise-based
 * version, await connect, await query and release in finally, ran 7-9 % fewer trivial statements
 * per second on 3 connections).
 */
function poolQuery<R>(
  pool: pg.Pool,
  text: string,
  values: readonly unknown[],
  name: string | undefined,
): Promise<QueryResult<R>> {
  return new Promise((resolve, reject) => {
    pool.connect((connectError, client, release) => {
      if (connectError || client === undefined) {
        reject(connectError ?? new Error('pg.Pool.connect() gave no client'));
        return;
      }
      let released = false;
      // As pool.query(): a checked-out client has no 'error' listener of the pool's.
      const onError = (err: Error) => {
        if (released) return;
        released = true;
        release(err);
        reject(err);
      };
      client.once('error', onError);
      const prepared = preparedStatementName(client, name);
      const config: pg.QueryConfig = prepared
        ? { name: prepared, text, values: values as unknown[] }
        : { text, values: values as unknown[] };
      try {
        client.query(config, (err: Error | null, r: pg.QueryResult) => {
          client.removeListener('error', onError);
          if (released) return;
          released = true;
          // A client whose statement failed is destroyed, not reused (as pool.query()).
          release(err ?? undefined);
          if (err) reject(err);
          else resolve({ rows: r.rows as R[], rowCount: r.rowCount ?? r.rows.length });
        });
      } catch (err) {
        client.removeListener('error', onError);
        released = true;
        release(err as Error);
        reject(err);
      }
    });
  });
}

/** The {@link QueryResult} of what drizzle's `execute()` returned, whichever driver it runs on. */
export function drizzleQueryResult<R>(result: unknown): QueryResult<R> {
  if (Array.isArray(result)) {
    // postgres-js: an array of rows with a `count`.
    const count = (result as unknown as { count?: number }).count;
    return { rows: result as R[], rowCount: count ?? result.length };
  }
  const r = result as { rows: R[]; rowCount: number | null };
  return { rows: r.rows, rowCount: r.rowCount ?? r.rows.length };
}

/** drizzle-orm's `sql` tag. */
export type DrizzleSqlTag = typeof drizzleSql;

/** drizzle-orm's `sql` tag once loaded, for the statements that follow without waiting. */
let drizzleSqlTag: DrizzleSqlTag | undefined;
let drizzleSqlLoading: Promise<DrizzleSqlTag> | undefined;

/**
 * drizzle-orm's `sql` tag, loaded on first use: only a drizzle handle needs it, and the application
 * that handed outboxkit one has loaded drizzle-orm already. No module of outboxkit's runtime imports
 * drizzle-orm at load (src/drizzle-entity.ts says why). One promise for every caller, so that the
 * statements that wait for the load go out in the order they were asked for.
 */
export function loadDrizzleSql(): Promise<DrizzleSqlTag> {
  drizzleSqlLoading ??= import('drizzle-orm').then(
    (drizzle) => (drizzleSqlTag = drizzle.sql),
    (err: unknown) => {
      // Not installed, or not resolvable from outboxkit: the next statement tries again.
      drizzleSqlLoading = undefined;
      throw err;
    },
  );
  return drizzleSqlLoading;
}

/** drizzle-orm's `sql` tag if {@link loadDrizzleSql} has loaded it, `undefined` before. */
export function loadedDrizzleSql(): DrizzleSqlTag | undefined {
  return drizzleSqlTag;
}

/**
 * Turns `text` with `$n` placeholders and `values` into a drizzle `SQL` object, with drizzle-orm's
 * `sql` tag (from {@link loadDrizzleSql}).
 */
export function toDrizzleSql(sql: DrizzleSqlTag, text: string, values: readonly unknown[]): SQL {
  const chunks: SQL[] = [];
  const re = /\$(\d+)/g;
  let last = 0;
  for (let m = re.exec(text); m !== null; m = re.exec(text)) {
    chunks.push(sql.raw(text.slice(last, m.index)));
    chunks.push(sql`${sql.param(values[Number(m[1]) - 1])}`);
    last = m.index + m[0].length;
  }
  chunks.push(sql.raw(text.slice(last)));
  return sql.join(chunks);
}

function fromDrizzleTransaction(tx: DrizzleTransaction, what: string, verifyInTransaction?: string): Queryable {
  // node-postgres driver: the session holds the pg client, whose status tells a finished handle.
  // Without one that can (postgres-js, node-postgres before 8.21), the database is asked.
  const client = (tx as unknown as { session?: { client?: PgClientLike } }).session?.client;
  const tellsStatus = client !== undefined && typeof client.getTransactionStatus === 'function';
  let verify = tellsStatus ? undefined : verifyInTransaction;
  return {
    async query<R>(text: string, values: readonly unknown[] = []): Promise<QueryResult<R>> {
      if (tellsStatus) checkPgClient(client, what);
      const sql = drizzleSqlTag ?? (await loadDrizzleSql());
      if (verify !== undefined) {
        const statement = verify;
        verify = undefined;
        await guarded(what, () => tx.execute(sql.raw(statement)));
      }
      return drizzleQueryResult<R>(await guarded(what, () => tx.execute(toDrizzleSql(sql, text, values))));
    },
  };
}

/**
 * Wraps the caller's transaction handle so outboxkit can run SQL in it.
 *
 * @param tx - a `pg` client inside BEGIN, or a drizzle transaction.
 * @param what - the caller's name, for error messages (for example `'enqueue()'`).
 * @param options.verifyInTransaction - for a handle the caller got from the application: a
 *   statement that PostgreSQL refuses outside a transaction block (SQLSTATE 25P01, for example
 *   `LOCK TABLE t IN ROW EXCLUSIVE MODE` on a table the caller then writes anyway), run before the
 *   first query when the handle cannot tell its transaction status itself (node-postgres before
 *   8.21 has no `getTransactionStatus()`, nor has an object that only offers `query()`, nor a
 *   drizzle postgres-js transaction). Without it such a handle is trusted: the caller opened the
 *   transaction itself.
 * @throws {@link NotInTransactionError} when `tx` is a pool, a top-level drizzle database, or a
 *   client that is not inside a live transaction (at once, or from its first query when the
 *   database has to be asked).
 */
export function joinTransaction(
  tx: TransactionHandle,
  what: string,
  options: { verifyInTransaction?: string } = {},
): Queryable {
  if (typeof tx !== 'object' || tx === null) {
    throw new NotInTransactionError(`${what} needs a transaction handle, got ${tx === null ? 'null' : typeof tx}.`);
  }
  if (isDrizzleTransaction(tx))
    return fromDrizzleTransaction(tx as DrizzleTransaction, what, options.verifyInTransaction);
  if (isPgPool(tx)) {
    throw new NotInTransactionError(
      `${what} was given a pool; pass the client (or drizzle \`tx\`) that holds your transaction, ` +
        'so the outbox rows commit or roll back with your business rows.',
    );
  }
  if ('dialect' in tx && 'session' in tx && typeof (tx as { transaction?: unknown }).transaction === 'function') {
    throw new NotInTransactionError(
      `${what} was given a top-level drizzle database; call it with the \`tx\` of db.transaction(async (tx) => ...).`,
    );
  }
  const client = tx as PgClientLike;
  if (typeof client.query !== 'function') {
    throw new NotInTransactionError(`${what} needs a pg client inside BEGIN or a drizzle transaction.`);
  }
  checkPgClient(client, what);
  let verify = typeof client.getTransactionStatus === 'function' ? undefined : options.verifyInTransaction;
  return {
    async query<R>(
      text: string,
      values: readonly unknown[] = [],
      options?: { name?: string },
    ): Promise<QueryResult<R>> {
      if (verify !== undefined) {
        const statement = verify;
        verify = undefined;
        await guarded(what, () => client.query(statement));
      }
      return guarded(what, () => pgQuery<R>(client, text, values, options?.name));
    },
  };
}

/**
 * Runs `fn` in a transaction on a client taken from `pool`, and returns the client to the pool in a
 * clean state whatever happens: COMMIT on success, ROLLBACK on error, and a client whose ROLLBACK
 * failed is destroyed rather than returned (test/database.test.ts: a pooled client left in an aborted
 * transaction would fail every later query on it).
 *
 * @param pool - a `pg.Pool`.
 * @param fn - the work; receives the client inside BEGIN, and what `beginSql` returned (an array of
 *   results when it holds several statements: the simple query protocol answers each).
 * @param options.beginSql - the statement that opens the transaction; it may go on with more
 *   statements of the transaction (one round trip). If it fails, the transaction is rolled back.
 *   @defaultValue 'BEGIN'
 * @param options.onRollbackFailed - when the ROLLBACK after a failure fails too (the connection
 *   is gone), called with the failure and the ROLLBACK's error; what it returns is thrown instead
 *   of the failure. @defaultValue the failure is thrown
 */
export async function withPgTransaction<T>(
  pool: pg.Pool,
  fn: (client: pg.PoolClient, begun: pg.QueryResult | pg.QueryResult[]) => Promise<T>,
  options: { beginSql?: string; onRollbackFailed?: (error: unknown, rollbackError: Error) => unknown } = {},
): Promise<T> {
  guardPool(pool);
  const client = await pool.connect();
  let destroy: Error | undefined;
  // A checked-out client has no 'error' listener of the pool's: a backend terminated while the
  // transaction sits between statements would otherwise emit an unhandled 'error' and crash the
  // process. Record it instead; the next statement fails and the client is destroyed.
  const onError = (err: Error) => {
    destroy ??= err;
  };
  client.on('error', onError);
  try {
    try {
      const begun = (await client.query(options.beginSql ?? 'BEGIN')) as pg.QueryResult | pg.QueryResult[];
      const result = await fn(client, begun);
      // COMMIT of a transaction that already failed (a statement error that `fn` caught and
      // swallowed) is answered with ROLLBACK, not an error: that must not pass for success.
      const commit = await client.query('COMMIT');
      if (commit.command === 'ROLLBACK') {
        throw abortedError('the transaction callback', new Error('COMMIT was answered with ROLLBACK'));
      }
      return result;
    } catch (err) {
      try {
        await client.query('ROLLBACK');
      } catch (rollbackErr) {
        destroy = rollbackErr instanceof Error ? rollbackErr : new Error(String(rollbackErr));
        if (options.onRollbackFailed) throw options.onRollbackFailed(err, destroy);
      }
      throw err;
    }
  } catch (err) {
    // BEGIN or COMMIT failed: the connection's state is unknown, so it is not reused.
    destroy ??= client.getTransactionStatus() === 'I' ? undefined : (err as Error);
    throw err;
  } finally {
    client.off('error', onError);
    client.release(destroy ?? false);
  }
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyDrizzleDb = { transaction: (fn: (tx: any) => Promise<any>, config?: any) => Promise<any> };

/** The transaction type that `db.transaction()` of a drizzle database hands to its callback. */
export type DrizzleTransactionOf<D extends AnyDrizzleDb> = Parameters<Parameters<D['transaction']>[0]>[0];

/**
 * Where outboxkit opens transactions of its own (the consumer's handler transaction, the
 * idempotency layer's request transaction): a `pg.Pool` or a drizzle database. The callback
 * receives the natural handle of each: a `pg.PoolClient` inside BEGIN, or drizzle's `tx`.
 */
export type DatabaseHandle = pg.Pool | AnyDrizzleDb;

/** The transaction handle that `runTransaction(db, ...)` passes to its callback. */
export type TransactionOf<D extends DatabaseHandle> = D extends pg.Pool
  ? pg.PoolClient
  : D extends AnyDrizzleDb
    ? DrizzleTransactionOf<D>
    : never;

const guardedPools = new WeakSet<pg.Pool>();

/**
 * A `pg.Pool` emits 'error' when PostgreSQL terminates one of its idle connections (a restart, a
 * failover, `pg_terminate_backend`); without a listener Node.js turns that into a crash. The pool
 * already discards the broken connection and the next query opens a new one, so outboxkit adds one
 * listener (once per pool) that keeps the process alive. An application's own listeners still run.
 */
function guardPool(pool: pg.Pool): void {
  if (guardedPools.has(pool)) return;
  guardedPools.add(pool);
  pool.on('error', () => {});
}

const guardedCheckouts = new WeakSet<pg.Pool>();
const guardedClients = new WeakSet<object>();

/**
 * drizzle over node-postgres checks a client out of its `pg.Pool` for each transaction, and a
 * checked-out client has no 'error' listener of the pool's: a backend terminated during the
 * transaction (a failover, `pg_terminate_backend`, a restart) makes it emit an unhandled 'error',
 * which crashes the process. So outboxkit gives each client of the drizzle database's pool (its
 * `$client`, once per pool, on the pool's 'acquire' event) one 'error' listener that keeps the
 * process alive: the client's queries still fail, and the pool discards it when it is released
 * (pg-pool drops a client that is no longer queryable). An application's own listeners still run.
 * A drizzle database over one `pg.Client` gets the same listener on that client.
 */
function guardDrizzleClient(db: AnyDrizzleDb): void {
  const client = (db as { $client?: unknown }).$client;
  if (isPgPool(client)) {
    if (guardedCheckouts.has(client)) return;
    guardedCheckouts.add(client);
    guardPool(client);
    client.on('acquire', (checkedOut) => guardClient(checkedOut));
  } else if (isEmitter(client) && typeof (client as { query?: unknown }).query === 'function') {
    guardClient(client);
  }
}

function guardClient(client: { on(event: 'error', listener: (err: Error) => void): unknown }): void {
  if (guardedClients.has(client)) return;
  guardedClients.add(client);
  client.on('error', () => {});
}

function isEmitter(value: unknown): value is { on(event: 'error', listener: (err: Error) => void): unknown } {
  return typeof value === 'object' && value !== null && typeof (value as { on?: unknown }).on === 'function';
}

/**
 * Runs `fn` in a new transaction of `db` (a `pg.Pool` through {@link withPgTransaction}, or a
 * drizzle database through `db.transaction()`), committing when it resolves and rolling back when
 * it throws. A connection lost during the transaction fails it, never the process (see
 * `guardDrizzleClient` for drizzle over node-postgres).
 */
export async function runTransaction<D extends DatabaseHandle, T>(
  db: D,
  fn: (tx: TransactionOf<D>) => Promise<T>,
): Promise<T> {
  if (isPgPool(db)) return withPgTransaction(db, fn as (c: pg.PoolClient) => Promise<T>);
  if (typeof (db as AnyDrizzleDb).transaction === 'function') {
    guardDrizzleClient(db as AnyDrizzleDb);
    return (db as AnyDrizzleDb).transaction(fn) as Promise<T>;
  }
  throw new NotInTransactionError('Expected a pg.Pool or a drizzle database to open transactions on.');
}
