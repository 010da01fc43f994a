/**
 * The dedup consumer's transaction, once for every driver: {@link InboxTransaction} is what a
 * driver provides (inbox-transaction-pg.ts for a `pg.Pool`, inbox-transaction-drizzle.ts for a
 * drizzle database; the consumer picks one when it is created), and
 * {@link runInboxTransaction} runs the messages of one transaction through it.
 *
 * A transaction holds one message (`transactionScope: 'message'`) or a run of consecutive
 * messages of one fetched batch (`'batch'`), each inside a savepoint of its own: a message whose
 * claim or handler fails rolls back to its savepoint only, and the messages before it commit.
 * For each message: claim (group, event id) in the inbox; when the claim inserted the row, run the
 * handler with the driver's own transaction object; else read the row the group applied
 * (a duplicate). Then COMMIT. The consumer resolves offsets only after the COMMIT.
 */
import type { SqlStatement } from '../src/postgres.js';
import { inboxClaimSql, type InboxEntry, type InboxRow, type SqlValueWriter } from './inbox-sql.js';
import { claimWithProgressSql, type StoredProgress } from './progress-sql.js';

/** One message's claim: its inbox row, and the partition progress row it writes (`recordProgress`). */
export interface InboxClaim {
  row: InboxRow;
  progress?: StoredProgress;
}

/** The claim's statement: the inbox claim, or the progress claim built on it. */
export function claimSql(schemaSql: string, claim: InboxClaim, values: SqlValueWriter): SqlStatement {
  const { row, progress } = claim;
  return progress
    ? claimWithProgressSql({ schemaSql, row, progress }, values)
    : inboxClaimSql({ schemaSql, row }, values);
}

/** What became of one message of a transaction (see {@link InboxTransactionScope.message}). */
export type MessageResult =
  /** The claim inserted the inbox row and the handler returned. */
  | { outcome: 'applied' }
  /** The group applied the event before: the handler did not run. `firstApplied`: its inbox row. */
  | { outcome: 'duplicate'; firstApplied: InboxEntry | null }
  /** The claim, the handler or the read of the duplicate's row failed; rolled back to its savepoint. */
  | { outcome: 'failed'; error: unknown }
  | PreviousFailed;

/**
 * The statement that ends the previous message's savepoint found that message's transaction
 * failed (its handler swallowed a failed statement): rolled back to its savepoint.
 */
export interface PreviousFailed {
  outcome: 'previous-failed';
  error: unknown;
}

/** Settings of an {@link InboxTransaction}. */
export interface InboxTransactionOptions {
  /** The quoted schema of the inbox (`quoteSchema()`). */
  schemaSql: string;
  /** PostgreSQL `lock_timeout` of each transaction, in ms (0: none). */
  lockTimeoutMs: number;
  /** A savepoint per message (`transactionScope: 'batch'`); without, a transaction holds one message. */
  savepoints: boolean;
}

/** One driver's transaction for the dedup consumer. `Tx` is the driver's transaction object. */
export interface InboxTransaction<Tx> {
  /** Whether each message runs inside a savepoint of its own, so that a transaction may hold several. */
  readonly savepoints: boolean;
  /**
   * Opens a transaction (with the lock timeout), runs `body`, and commits when it resolves; rolls
   * back when it (or the COMMIT) throws, and rethrows. `first` is the claim of the first message,
   * which may travel with the BEGIN; `body` passes it to its first
   * {@link InboxTransactionScope.message} call.
   *
   * @throws what `body` threw, or the driver's error (BEGIN, COMMIT, the connection). A
   *   `HandlerFailure` (classify-error.ts) when the COMMIT showed that the handler of the one
   *   message of a transaction without savepoints swallowed a failed statement. A
   *   `HandlerFailure` only ever comes out after its rollback succeeded (the connection lives);
   *   when that rollback failed, a `ConnectionLostError` comes out instead.
   */
  run<T>(first: InboxClaim, body: (scope: InboxTransactionScope<Tx>) => Promise<T>): Promise<T>;
}

/** The messages of one open transaction, one after the other. */
export interface InboxTransactionScope<Tx> {
  /**
   * The next message: in its own savepoint (if the transaction has savepoints), claims its inbox
   * row and, when the claim inserted it, runs `handler` with the driver's transaction object;
   * then proves the transaction still works (a handler that swallowed a failed statement fails
   * as its own `HandlerFailure`). Without savepoints, call it once.
   *
   * @returns `failed` when the claim, the handler or the read of the duplicate's row failed (rolled
   *   back to its savepoint; the messages before it are intact), `previous-failed` when the
   *   statement that began it showed the previous message failed (this one did not begin).
   * @throws when the transaction as a whole failed (a ROLLBACK TO, the connection), and without
   *   savepoints on any failure: then only the whole transaction can roll back. A
   *   `ConnectionLostError` when the ROLLBACK TO of a handler's failure failed.
   */
  message(claim: InboxClaim, handler: (tx: Tx) => Promise<void>): Promise<MessageResult>;
  /**
   * Ends the last message before the COMMIT: with savepoints, releases its savepoint, which
   * proves it sound.
   *
   * @returns the last message's failure, rolled back to its savepoint, or undefined.
   */
  settle(): Promise<PreviousFailed | undefined>;
}

/** A message the consumer runs in an inbox transaction: its claim, and whatever else it needs. */
export interface ClaimedMessage {
  claim: InboxClaim;
}

/** What one transaction did (see {@link runInboxTransaction}). */
export interface InboxRun<M> {
  /** The messages committed, in order. */
  done: {
    message: M;
    outcome: 'applied' | 'duplicate';
    /**
     * Its part of the transaction, in ms: from its claim (the first message's from before the
     * BEGIN) to the end of its handler; the last one's also holds the end of its savepoint and the
     * COMMIT. So the messages committed add up to their transaction (less the time of a failed
     * message that ended it), and a transaction of one message is timed whole.
     */
    durationMs: number;
    /** A duplicate's inbox row (see `readInboxEntry()`). */
    firstApplied?: InboxEntry | null;
  }[];
  /** The message that failed and ended the transaction, rolled back, and its error. */
  failure?: { message: M; error: unknown };
}

/**
 * Runs `first` and the messages `next()` returns, in one transaction of `inbox` (one message when
 * it has no savepoints), and commits. The transaction ends before a message when `next()`
 * returns null, and after a message that failed (rolled back to its savepoint): the messages
 * before it commit.
 *
 * @param next - the message that joins the transaction next, or null to commit; called after
 *   each message that succeeded.
 * @param handle - runs the handler of a claimed message with the driver's transaction object.
 * @returns the messages committed, and the failed one (if any). When the transaction as a whole
 *   failed (BEGIN, a ROLLBACK TO, COMMIT), nothing is committed and the failure is `first`'s.
 */
export async function runInboxTransaction<M extends ClaimedMessage, Tx>(
  inbox: InboxTransaction<Tx>,
  first: M,
  next: () => M | null,
  handle: (message: M, tx: Tx) => Promise<void>,
): Promise<InboxRun<M>> {
  const openedAt = performance.now();
  const done: InboxRun<M>['done'] = [];
  let failure: InboxRun<M>['failure'];
  let committingAt = openedAt;
  try {
    await inbox.run(first.claim, async (scope) => {
      let startedAt = openedAt;
      for (let message: M | null = first; message !== null;) {
        const current: M = message;
        const result = await scope.message(current.claim, (tx) => handle(current, tx));
        if (result.outcome === 'failed' || result.outcome === 'previous-failed') {
          // The transaction ends here; what is in `done` commits.
          failure = { message: result.outcome === 'failed' ? current : done.pop()!.message, error: result.error };
          committingAt = performance.now();
          return;
        }
        done.push({
          message: current,
          outcome: result.outcome,
          durationMs: performance.now() - startedAt,
          firstApplied: result.outcome === 'duplicate' ? result.firstApplied : undefined,
        });
        // Without savepoints only the whole transaction can roll back: it holds one message.
        message = inbox.savepoints ? next() : null;
        startedAt = performance.now();
      }
      // Ending the last savepoint, like the COMMIT, counts with the last message.
      committingAt = performance.now();
      const last = await scope.settle();
      if (last) failure = { message: done.pop()!.message, error: last.error };
    });
  } catch (err) {
    // The transaction as a whole rolled back: none of the run is applied.
    return { done: [], failure: { message: first, error: err } };
  }
  const last = done.at(-1);
  if (last) last.durationMs += performance.now() - committingAt;
  return { done, failure };
}
