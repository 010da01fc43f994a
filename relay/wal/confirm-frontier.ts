/**
 * Which LSN the WAL reader may confirm to PostgreSQL: the highest commit end LSN up to which every
 * transaction handed to the caller has been confirmed by it. The caller settles transactions in any
 * order (Kafka acknowledges partitions independently), but the slot has one position: confirming a
 * later commit while an earlier one is unsettled would move the slot past the earlier one, and a
 * crash would then lose it (docs/wal-source.md, "Confirming"). Pure logic, no I/O.
 */
import { InvalidOptionsError } from '../../src/errors.js';
import { formatLsn } from './lsn.js';

export class ConfirmFrontier {
  /** Commit end LSNs handed over and not yet under the frontier, ascending, with their state. */
  readonly #open: { lsn: bigint; confirmed: boolean }[] = [];
  #frontier: bigint;

  /** @param start - the slot's `confirmed_flush_lsn` when reading began (nothing below it comes). */
  constructor(start: bigint) {
    this.#frontier = start;
  }

  /** The LSN that may be confirmed: every transaction that ended at or before it is settled. */
  get frontier(): bigint {
    return this.#frontier;
  }

  /** Transactions handed over and not yet under the frontier (confirmed out of order included). */
  get open(): number {
    return this.#open.length;
  }

  /**
   * Records a transaction handed to the caller (`settled: false`), or one with nothing to hand
   * over (`settled: true`: an empty frame after filtering, which only waits for the earlier ones).
   * A commit at or below the frontier (a redelivery the server should not send) is ignored: it is
   * already confirmed.
   *
   * @returns the new frontier when it moved, else `undefined`.
   */
  add(lsn: bigint, settled: boolean): bigint | undefined {
    if (lsn <= this.#frontier) return undefined;
    const last = this.#open.at(-1);
    // The stream delivers commits in ascending end LSN; anything else is a bug upstream, and
    // treating it as settled could move the slot past an unsettled transaction.
    if (last !== undefined && lsn <= last.lsn) {
      throw new InvalidOptionsError(`Commit end LSN ${formatLsn(lsn)} arrived after ${formatLsn(last.lsn)}.`);
    }
    this.#open.push({ lsn, confirmed: settled });
    return this.#advance();
  }

  /**
   * The caller settled the transaction that ended at `lsn`. Idempotent; a commit at or below the
   * frontier is already confirmed.
   *
   * @returns the new frontier when it moved, else `undefined`.
   * @throws {@link InvalidOptionsError} when no transaction handed over ended at `lsn`.
   */
  confirm(lsn: bigint): bigint | undefined {
    if (lsn <= this.#frontier) return undefined;
    const entry = this.#find(lsn);
    if (entry === undefined) {
      throw new InvalidOptionsError(
        `confirm(${formatLsn(lsn)}): no transaction handed over by this reader ended at that LSN; ` +
          "pass a transaction's commitEndLsn as it was handed over.",
      );
    }
    entry.confirmed = true;
    return this.#advance();
  }

  /**
   * Moves the frontier to `lsn`, a position the server says it has sent everything before (a
   * keepalive's WAL end), when no transaction handed over is open: the caller received and settled
   * every transaction that ended before it. PostgreSQL 15's pgoutput sends nothing for a
   * transaction without a change of the publication, so without this an idle outbox never moves
   * the slot, and the slot keeps the WAL of every other write (docs/wal-source.md).
   *
   * @returns the new frontier when it moved, else `undefined` (transactions open, or `lsn` not ahead).
   */
  skipTo(lsn: bigint): bigint | undefined {
    if (this.#open.length > 0 || lsn <= this.#frontier) return undefined;
    this.#frontier = lsn;
    return lsn;
  }

  #find(lsn: bigint): { lsn: bigint; confirmed: boolean } | undefined {
    // Binary search: the open list is ascending and may be long when one early transaction lags.
    let lo = 0;
    let hi = this.#open.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const entry = this.#open[mid]!;
      if (entry.lsn === lsn) return entry;
      if (entry.lsn < lsn) lo = mid + 1;
      else hi = mid - 1;
    }
    return undefined;
  }

  #advance(): bigint | undefined {
    let n = 0;
    while (n < this.#open.length && this.#open[n]!.confirmed) n += 1;
    if (n === 0) return undefined;
    this.#frontier = this.#open[n - 1]!.lsn;
    this.#open.splice(0, n);
    return this.#frontier;
  }
}
