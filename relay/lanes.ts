/**
 * The lanes a relay holds: leases in `relay_lanes` (database clock), each with a fencing token that
 * grows on every takeover, renewed every third of a lease, shared fairly among the live relays,
 * and checked before each send (docs/relay-fencing.md).
 *
 * Lease validity on this side is measured with the process's monotonic clock (`now`, injected for
 * tests): a lane is acted on only until 80 % of a lease after its renewal was sent, so the
 * database's lease, which starts when the renewal arrives, always outlasts it.
 */
import { OUTBOX_LANES } from '../src/constants.js';
import type { HeldLane } from './sql.js';

/** A held lane, with the time (of `now`, ms) until which this process may act on it. */
export interface LaneLease extends HeldLane {
  validUntil: number;
}

/** The lane statements of one relay (relay/sql.ts, bound to its pool, schema and id). */
export interface LaneStore {
  /** Registers the relay as live (or renews that for `leaseMs`); resolves to the number of live relays. */
  heartbeat(leaseMs: number): Promise<number>;
  /** Renews the leases of `held`; resolves to those still held with the same token. */
  renew(held: readonly HeldLane[], leaseMs: number): Promise<HeldLane[]>;
  /** Takes up to `count` free or expired lanes, each with a new fencing token. */
  acquire(count: number, leaseMs: number): Promise<HeldLane[]>;
  /** Gives `lanes` back (their leases end now). */
  release(lanes: readonly number[]): Promise<void>;
}

/** Share of the lanes each live relay holds at most: 64 lanes over `live` relays, rounded up. */
export function fairShare(live: number): number {
  return Math.ceil(OUTBOX_LANES / Math.max(1, live));
}

/** Part of a lease during which a renewed lane is acted on (the rest is margin for clock rates and delays). */
const VALID_PART = 0.8;

/**
 * The lanes of one relay. One maintenance at a time (the relay chains them): `maintain()` renews,
 * then takes or gives back lanes toward the fair share.
 */
export class Lanes {
  private readonly held = new Map<number, LaneLease>();

  /**
   * @param store - the lane statements.
   * @param leaseMs - lease length, in ms.
   * @param now - a monotonic clock, in ms. @defaultValue `performance.now`
   */
  constructor(
    private readonly store: LaneStore,
    private readonly leaseMs: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** The lanes held, in increasing order. */
  list(): number[] {
    return [...this.held.keys()].sort((a, b) => a - b);
  }

  /** How many lanes are held. */
  get size(): number {
    return this.held.size;
  }

  has(lane: number): boolean {
    return this.held.has(lane);
  }

  /** The leases valid now (a pass reads only their rows). */
  valid(): LaneLease[] {
    const now = this.now();
    return [...this.held.values()].filter((l) => l.validUntil > now);
  }

  /**
   * Renews the held leases and moves toward the fair share of the live relays: takes free lanes
   * when below it; when above, gives back the highest lanes after `beforeRelease()` (the pass in
   * flight may still be publishing their rows, and its marking must finish under their tokens: a
   * late mark would fail the fencing check and the rows would go out again).
   *
   * @returns how many lanes were taken (their backlog comes with no notification: wake the loop).
   */
  async maintain(beforeRelease: () => Promise<void>): Promise<{ acquired: number }> {
    // Valid until slightly before the lease ends by our clock, measured from before the renewal
    // was sent: the database's lease is at least that long.
    const validUntil = this.now() + this.leaseMs * VALID_PART;
    const live = await this.store.heartbeat(this.leaseMs);
    const renewed = await this.store.renew([...this.held.values()], this.leaseMs);
    const keep = new Set(renewed.map((r) => r.lane));
    for (const lane of this.held.keys()) if (!keep.has(lane)) this.held.delete(lane);
    for (const r of renewed) this.held.set(r.lane, { ...r, validUntil });
    const share = fairShare(live);
    let acquired = 0;
    if (this.held.size < share) {
      for (const r of await this.store.acquire(share - this.held.size, this.leaseMs)) {
        this.held.set(r.lane, { ...r, validUntil });
        acquired++;
      }
    } else if (this.held.size > share) {
      const extra = this.list().slice(share);
      for (const lane of extra) this.held.delete(lane);
      await beforeRelease();
      await this.store.release(extra);
    }
    return { acquired };
  }

  /**
   * Rows whose lane this relay still holds with the token it read them under, by the lease as held
   * now, not as it was when the pass began: a pass that waited (for a read ahead, a slow read) may
   * outlive the validity it started with while the lanes were renewed meanwhile. Renewal keeps the
   * fencing token; taking a lane changes it, so the same token means nobody else held the lane
   * since these rows were read.
   */
  stillOwned<R extends { lane: number }>(rows: readonly R[], readUnder: readonly HeldLane[]): R[] {
    const now = this.now();
    const valid = new Set(
      readUnder
        .filter((l) => {
          const current = this.held.get(l.lane);
          return current !== undefined && current.token === l.token && current.validUntil > now;
        })
        .map((l) => l.lane),
    );
    return rows.filter((r) => valid.has(r.lane));
  }

  /**
   * The fencing check refused a marking on `lanes`: another relay holds (or held) some of them (a
   * takeover, or `outboxkit lanes release` on this live relay). Until the next renewal says which
   * are still ours, nothing more is sent on them: otherwise every pass would send their
   * still-pending rows again (at least once, but a copy per pass).
   */
  fenceOut(lanes: Iterable<number>): void {
    for (const lane of lanes) {
      const held = this.held.get(lane);
      if (held) this.held.set(lane, { ...held, validUntil: 0 });
    }
  }

  /**
   * Drops every lane at once (nothing is sent on them from now on) and gives them back after
   * `beforeRelease()`; resolves to the lanes given back.
   */
  async releaseAll(beforeRelease: () => Promise<void> = async () => {}): Promise<number[]> {
    const lanes = this.list();
    this.held.clear();
    if (lanes.length === 0) return lanes;
    await beforeRelease();
    await this.store.release(lanes);
    return lanes;
  }

  /** Forgets every lane without giving it back (their leases run out). */
  clear(): void {
    this.held.clear();
  }
}
