/**
 * Marking acknowledged batches published, off the path of the next events' latency.
 *
 * One marking statement runs at a time. Batches acknowledged while it runs wait in the queue and
 * go together in the next statement, so the relay never waits for the database to commit the
 * previous mark before it sends the next batch, and at high rates it spends one statement on
 * several sends. Each batch is marked with the fencing tokens it was read under (batches read
 * under other leases go in a statement of their own), so the fencing check is the same as for a
 * batch marked alone.
 */
import type { HeldLane } from './sql.js';

/**
 * One acknowledged batch, waiting to be marked: its rows' seqs and lanes only, so the queue never
 * holds payloads.
 */
export interface MarkBatch {
  seqs: readonly string[];
  /** The lanes of the rows (each once). */
  lanes: readonly number[];
  /** The leases the rows were read under, as `lane:token,...` (batches of equal leases share a statement). */
  leases: string;
  held: readonly HeldLane[];
}

/**
 * A queue of acknowledged batches marked one statement at a time.
 *
 * @param mark - marks `seqs` under the fencing tokens of `held`; resolves to the rows marked.
 * @param onMarked - called after each statement with the batches it marked and the rows marked
 *   (fewer than the batches' rows when the fencing check refused some). A throw counts as a failed
 *   marking.
 */
export class MarkQueue {
  private queued: MarkBatch[] = [];
  private inFlight: { batches: MarkBatch[]; done: Promise<void> } | undefined;
  private failure: Error | undefined;

  constructor(
    private readonly mark: (seqs: string[], held: readonly HeldLane[]) => Promise<number>,
    private readonly onMarked: (batches: readonly MarkBatch[], marked: number) => void,
  ) {}

  /** Seqs acknowledged and not marked yet (in flight or queued): a read skips them, they are still pending. */
  pendingSeqs(): string[] {
    const seqs: string[] = [];
    for (const b of [...(this.inFlight?.batches ?? []), ...this.queued]) seqs.push(...b.seqs);
    return seqs;
  }

  /** Rows acknowledged and not marked yet. */
  get size(): number {
    let n = 0;
    for (const b of [...(this.inFlight?.batches ?? []), ...this.queued]) n += b.seqs.length;
    return n;
  }

  /** Queues an acknowledged batch; it is marked now, or with the next statement if one runs. */
  add(batch: MarkBatch): void {
    if (batch.seqs.length === 0) return;
    this.queued.push(batch);
    this.pump();
  }

  /**
   * Throws the error of a marking that failed since the last call (once). Its rows stay pending
   * and are published again: at least once.
   */
  takeFailure(): void {
    const failure = this.failure;
    this.failure = undefined;
    if (failure) throw failure;
  }

  /** Waits until at most `maxRows` rows wait for their marking (the running statement is never cut short). */
  async drainTo(maxRows: number): Promise<void> {
    while (this.inFlight && this.size > maxRows) await this.inFlight.done;
  }

  /** Waits until every queued batch is marked; then throws like {@link takeFailure}. */
  async settle(): Promise<void> {
    while (this.inFlight) await this.inFlight.done;
    this.takeFailure();
  }

  private pump(): void {
    if (this.inFlight || this.queued.length === 0) return;
    const leases = this.queued[0]!.leases;
    let n = 1;
    while (n < this.queued.length && this.queued[n]!.leases === leases) n++;
    const batches = this.queued.splice(0, n);
    const seqs = batches.flatMap((b) => b.seqs);
    const done = this.mark(seqs, batches[0]!.held)
      .then((marked) => this.onMarked(batches, marked))
      .catch((err: unknown) => {
        this.failure ??= err instanceof Error ? err : new Error(String(err));
      })
      .finally(() => {
        this.inFlight = undefined;
        this.pump();
      });
    this.inFlight = { batches, done };
  }
}
