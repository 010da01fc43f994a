/**
 * The inbox transaction on a `pg.Pool` (see inbox-transaction.ts). The handler gets the
 * `pg.PoolClient` inside BEGIN; the transaction is run by `withPgTransaction()`, which rolls back
 * on any error and never returns a client left in a failed transaction to the pool
 * (test/consumer/c24-aborted-transaction.test.ts).
 *
 * **Round trips.** The first message's claim travels with BEGIN, in one simple-protocol query
 * string whose values are inlined (`inlineLiterals()`): `BEGIN; SELECT set_config('lock_timeout',
 * ...); [SAVEPOINT outboxkit_0;] <claim>`. A transaction of one message then costs the handler's
 * statements plus two round trips, as many as a bare BEGIN ... COMMIT. Each later message of a
 * batch costs one more: `RELEASE SAVEPOINT outboxkit_<n-1>; SAVEPOINT outboxkit_<n>; <claim>`, and
 * the last one's RELEASE goes before the COMMIT. If such a string fails (a lock timeout on the
 * inbox row), the transaction, or the message's savepoint, is rolled back.
 *
 * **Savepoint names.** `outboxkit_<n>`, a new name per message, so that a ROLLBACK TO can only
 * ever undo the message it belongs to: it fails, and the whole transaction rolls back, if that
 * savepoint was never made.
 *
 * **A handler that swallowed a failed statement** is seen without a round trip when the
 * connection already reports the transaction failed (status 'E'). pg learns the status from
 * ReadyForQuery, which may arrive after the failed statement's answer; a miss is caught by the
 * next statement, which fails with SQLSTATE 25P02 (the RELEASE of the message's savepoint), or by
 * the COMMIT, which PostgreSQL answers with ROLLBACK (`withPgTransaction()` turns that into an
 * error). Either way it is the handler's failure, not a database error.
 *
 * **A handler failure whose rollback fails** (the ROLLBACK, or the ROLLBACK TO of its savepoint)
 * comes out as a `ConnectionLostError`: the consumer's own connection is gone, an outage, whatever
 * the handler threw (classify-error.ts).
 */
import type pg from 'pg';
import { joinTransaction, withPgTransaction } from '../src/database.js';
import { isOutboxkitError } from '../src/errors.js';
import { SQLSTATE, sqlStateOf } from '../src/postgres.js';
import { afterFailedRollback, swallowedFailure, type HandlerFailure } from './classify-error.js';
import { claimedByLast, inlineLiterals, lockTimeoutSql, readInboxEntry } from './inbox-sql.js';
import {
  claimSql,
  type InboxClaim,
  type InboxTransaction,
  type InboxTransactionOptions,
  type InboxTransactionScope,
  type MessageResult,
  type PreviousFailed,
} from './inbox-transaction.js';

/** The inbox transaction of a `pg.Pool`. */
export function pgPoolInboxTransaction(
  pool: pg.Pool,
  options: InboxTransactionOptions,
): InboxTransaction<pg.PoolClient> {
  const { schemaSql, savepoints } = options;
  const inline = inlineLiterals();
  const claimText = (claim: InboxClaim): string => claimSql(schemaSql, claim, inline).text;
  const begin = `BEGIN; ${lockTimeoutSql(options.lockTimeoutMs, inline).text}; ${savepoints ? 'SAVEPOINT outboxkit_0; ' : ''}`;
  return {
    savepoints,
    async run(first, body) {
      let scope: PgScope | undefined;
      try {
        return await withPgTransaction(
          pool,
          (client, begun) => body((scope = new PgScope(client, begun, claimText, schemaSql, savepoints))),
          {
            beginSql: begin + claimText(first),
            onRollbackFailed: (err, rollbackErr) => afterFailedRollback(err, rollbackErr, err),
          },
        );
      } catch (err) {
        // Without savepoints nothing after the handler proved the transaction sound but the
        // COMMIT: answered with ROLLBACK, it is the only NotInTransactionError after the handler.
        if (!savepoints && scope?.handlerReturned && isOutboxkitError(err, 'OUTBOXKIT_NOT_IN_TRANSACTION')) {
          throw swallowedFailure(err);
        }
        throw err;
      }
    },
  };
}

class PgScope implements InboxTransactionScope<pg.PoolClient> {
  /** The message in flight, from 0; its savepoint is `outboxkit_<n>`. */
  #n = -1;
  /** The last message's handler returned (and the status did not show it failed). */
  handlerReturned = false;

  constructor(
    private readonly client: pg.PoolClient,
    /** What the BEGIN string answered; the first message's claim ends it. */
    private readonly begun: pg.QueryResult | pg.QueryResult[],
    private readonly claimText: (claim: InboxClaim) => string,
    private readonly schemaSql: string,
    private readonly savepoints: boolean,
  ) {}

  async message(claim: InboxClaim, handler: (tx: pg.PoolClient) => Promise<void>): Promise<MessageResult> {
    const { client } = this;
    const n = ++this.#n;
    let claimed: boolean;
    if (n === 0) {
      claimed = claimedByLast(this.begun);
    } else {
      try {
        const results = await client.query(
          `RELEASE SAVEPOINT outboxkit_${n - 1}; SAVEPOINT outboxkit_${n}; ${this.claimText(claim)}`,
        );
        claimed = claimedByLast(results as pg.QueryResult | pg.QueryResult[]);
      } catch (err) {
        // RELEASE failed: nothing of the string ran, savepoint n - 1 is still there.
        const swallowed = await this.#swallowedIn(err, n - 1);
        if (swallowed) return { outcome: 'previous-failed', error: swallowed };
        return this.#failed(n, err);
      }
    }
    this.handlerReturned = false;
    try {
      if (!claimed) {
        const { schemaSql } = this;
        const firstApplied = await readInboxEntry(joinTransaction(client, 'the dedup consumer'), {
          schemaSql,
          groupId: claim.row.groupId,
          eventId: claim.row.eventId,
        });
        return { outcome: 'duplicate', firstApplied };
      }
      await handler(client);
      // 'E': a statement failed inside the handler, which caught it. A miss here (ReadyForQuery
      // not yet read) is caught by the RELEASE or the COMMIT (see the file comment).
      if (client.getTransactionStatus() === 'E') throw swallowedFailure(new Error('Transaction status E'));
      this.handlerReturned = true;
      return { outcome: 'applied' };
    } catch (err) {
      return this.#failed(n, err);
    }
  }

  async settle(): Promise<PreviousFailed | undefined> {
    if (!this.savepoints || this.#n < 0) return undefined;
    try {
      // Proves the last message's savepoint sound before the COMMIT.
      await this.client.query(`RELEASE SAVEPOINT outboxkit_${this.#n}`);
    } catch (err) {
      const swallowed = await this.#swallowedIn(err, this.#n);
      if (swallowed) return { outcome: 'previous-failed', error: swallowed };
      throw err;
    }
    return undefined;
  }

  /** Message `n` failed: rolled back to its savepoint, or, without savepoints, the whole transaction. */
  async #failed(n: number, error: unknown): Promise<MessageResult> {
    if (!this.savepoints) throw error;
    try {
      await this.client.query(`ROLLBACK TO SAVEPOINT outboxkit_${n}`);
    } catch (rollbackErr) {
      throw afterFailedRollback(error, rollbackErr, rollbackErr);
    }
    return { outcome: 'failed', error };
  }

  /**
   * When `err` is SQLSTATE 25P02 (in_failed_sql_transaction: the transaction is aborted), the
   * handler of the message of savepoint `n` swallowed a failed statement: only that savepoint is
   * rolled back, and it fails as the handler's failure (an attempt), not as a database error.
   */
  async #swallowedIn(err: unknown, n: number): Promise<HandlerFailure | undefined> {
    if (sqlStateOf(err) !== SQLSTATE.IN_FAILED_SQL_TRANSACTION) return undefined;
    await this.client.query(`ROLLBACK TO SAVEPOINT outboxkit_${n}`);
    return swallowedFailure(err);
  }
}
