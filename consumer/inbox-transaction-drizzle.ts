/**
 * The inbox transaction on a drizzle database, node-postgres or postgres-js driver (see
 * inbox-transaction.ts). The handler gets drizzle's `tx`; with savepoints, each message is a
 * nested `tx.transaction()` (drizzle's savepoint, rolled back when its callback throws) and its
 * handler gets that nested `tx`. Statements take bind parameters; the lock timeout and each claim
 * are statements of their own.
 *
 * A handler that swallowed a failed statement: drizzle answers the COMMIT of an aborted
 * transaction (or the release of an aborted savepoint) without an error, so a `SELECT 1` after
 * each handler proves the transaction still works (SQLSTATE 25P02 otherwise).
 *
 * A handler failure whose rollback fails: drizzle then throws the rollback's error instead of the
 * failure (both drivers, transaction and savepoint alike); it comes out as a
 * `ConnectionLostError`: the consumer's own connection is gone, an outage (classify-error.ts).
 */
import {
  joinTransaction,
  runTransaction,
  type DatabaseHandle,
  type Queryable,
  type TransactionHandle,
} from '../src/database.js';
import { afterFailedRollback, ConnectionLostError, HandlerFailure, swallowedFailure } from './classify-error.js';
import { assertTransactionUsable, bindParameters, isClaimed, lockTimeoutSql, readInboxEntry } from './inbox-sql.js';
import { claimSql } from './inbox-transaction.js';
import type * as inbox from './inbox-transaction.js';

/** A drizzle transaction, whose `transaction()` opens a savepoint. */
interface NestingTransaction {
  transaction<T>(fn: (tx: TransactionHandle) => Promise<T>): Promise<T>;
}

const WHAT = 'the dedup consumer';

/** The inbox transaction of a drizzle database. */
export function drizzleInboxTransaction(
  db: DatabaseHandle,
  options: inbox.InboxTransactionOptions,
): inbox.InboxTransaction<TransactionHandle> {
  const { schemaSql, lockTimeoutMs, savepoints } = options;

  /**
   * Claims `claim` in `tx` and runs its handler there (see inbox.InboxTransactionScope.message).
   *
   * @param failed - called with the handler's failure before it is thrown (to be rolled back).
   */
  async function claimAndRun(
    tx: TransactionHandle,
    claim: inbox.InboxClaim,
    handler: (tx: TransactionHandle) => Promise<void>,
    failed: (failure: HandlerFailure) => void,
  ): Promise<inbox.MessageResult> {
    const q = joinTransaction(tx, WHAT);
    const { text, values } = claimSql(schemaSql, claim, bindParameters());
    if (!isClaimed(await q.query(text, values))) {
      const { groupId, eventId } = claim.row;
      return { outcome: 'duplicate', firstApplied: await readInboxEntry(q, { schemaSql, groupId, eventId }) };
    }
    try {
      await handler(tx);
      try {
        await assertTransactionUsable(q);
      } catch (err) {
        throw swallowedFailure(err);
      }
    } catch (err) {
      if (err instanceof HandlerFailure) failed(err);
      throw err;
    }
    return { outcome: 'applied' };
  }

  /**
   * The messages of one transaction. `failure` holds the handler failure being rolled back: if
   * anything else comes out of the rollback, the rollback failed (drizzle throws its error instead).
   */
  function scopeOf(
    tx: TransactionHandle,
    q: Queryable,
    failure: { current?: HandlerFailure },
  ): inbox.InboxTransactionScope<TransactionHandle> {
    const failed = (f: HandlerFailure) => (failure.current = f);
    return {
      async message(claim, handler) {
        // Without savepoints, a failure rolls back the whole transaction (its one message).
        if (!savepoints) return claimAndRun(tx, claim, handler, failed);
        try {
          return await (tx as unknown as NestingTransaction).transaction((sp) =>
            claimAndRun(sp, claim, handler, failed),
          );
        } catch (error) {
          // The ROLLBACK TO of a handler's failure failed: drizzle threw its error instead.
          if (failure.current !== undefined && error !== failure.current) {
            throw afterFailedRollback(failure.current, error, error);
          }
          failure.current = undefined;
          // drizzle answers the COMMIT of an aborted transaction without an error: prove the
          // ROLLBACK TO worked before the messages run so far are committed.
          await assertTransactionUsable(q);
          return { outcome: 'failed', error };
        }
      },
      // Each message proved itself (SELECT 1), and drizzle released its savepoint at its end.
      settle: () => Promise.resolve(undefined),
    };
  }

  return {
    savepoints,
    async run(_first, body) {
      const failure: { current?: HandlerFailure } = {};
      try {
        return await runTransaction(db, async (tx) => {
          const q = joinTransaction(tx as TransactionHandle, WHAT);
          const { text, values } = lockTimeoutSql(lockTimeoutMs);
          await q.query(text, values);
          return body(scopeOf(tx as TransactionHandle, q, failure));
        });
      } catch (err) {
        // Without savepoints: the ROLLBACK of a handler's failure failed (drizzle threw its error instead).
        if (failure.current !== undefined && err !== failure.current && !(err instanceof ConnectionLostError)) {
          throw afterFailedRollback(failure.current, err, err);
        }
        throw err;
      }
    },
  };
}
