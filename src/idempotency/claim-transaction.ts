/**
 * The transaction in which both modes claim a key: its `lock_timeout` bounds how long the claim
 * waits on another request's row lock, for the claim only (the claim statement restores the
 * caller's value for the handler; see `claimKey()`).
 */
import type pg from 'pg';
import {
  isPgPool,
  joinTransaction,
  runTransaction,
  withPgTransaction,
  type DatabaseHandle,
  type Queryable,
  type TransactionHandle,
  type TransactionOf,
} from '../database.js';
import { claimBeginSql, setClaimLockTimeout } from './store.js';

/**
 * Runs `fn` in a new transaction of `db` whose `lock_timeout` is `timeoutMs` (ms): with a
 * `pg.Pool`, set in the BEGIN round trip ({@link claimBeginSql}), and `fn` also gets the pool's
 * client (`pgClient`, for statements sent together in one round trip); with a drizzle database,
 * set by a statement of its own first ({@link setClaimLockTimeout}). Commits when `fn` resolves,
 * rolls back when it throws.
 *
 * @param what - the caller's name, for error messages (`'executeIdempotent()'`).
 */
export async function inClaimTransaction<D extends DatabaseHandle, T>(
  db: D,
  timeoutMs: number,
  what: string,
  fn: (tx: TransactionOf<D>, q: Queryable, pgClient?: pg.PoolClient) => Promise<T>,
): Promise<T> {
  if (isPgPool(db)) {
    return withPgTransaction(db, (client) => fn(client as TransactionOf<D>, joinTransaction(client, what), client), {
      beginSql: claimBeginSql(timeoutMs),
    });
  }
  return runTransaction(db, async (tx) => {
    const q = joinTransaction(tx as TransactionHandle, what);
    await setClaimLockTimeout(q, timeoutMs);
    return fn(tx, q);
  });
}
