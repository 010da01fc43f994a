/**
 * A relay's lanes (relay/lanes.ts) against an in-memory lane table that behaves like relay_lanes
 * (tokens grow on every takeover, leases end at a time): renewal, fair share, takeovers, the
 * ownership check before a send, fencing, release. The clock is injected.
 */
import { describe, expect, it } from 'vitest';
import { fairShare, Lanes, type LaneStore } from '../../../relay/lanes.js';
import type { HeldLane } from '../../../relay/sql.js';

/** relay_lanes in memory: 64 lanes, each with an owner, a lease end and a fencing token. */
class LaneTable {
  readonly lanes = Array.from({ length: 64 }, () => ({ owner: '', until: 0, token: 0 }));
  live = new Map<string, number>();
  constructor(readonly clock: { t: number }) {}

  store(owner: string): LaneStore {
    return {
      heartbeat: async (leaseMs) => {
        this.live.set(owner, this.clock.t + leaseMs);
        return [...this.live.values()].filter((until) => until > this.clock.t).length;
      },
      renew: async (held, leaseMs) =>
        held.filter((h) => {
          const l = this.lanes[h.lane]!;
          if (l.owner !== owner || String(l.token) !== h.token) return false;
          l.until = this.clock.t + leaseMs;
          return true;
        }),
      acquire: async (count, leaseMs) => {
        const taken: HeldLane[] = [];
        for (const [lane, l] of this.lanes.entries()) {
          if (taken.length === count) break;
          if (l.owner !== '' && l.until > this.clock.t) continue;
          l.owner = owner;
          l.until = this.clock.t + leaseMs;
          l.token++;
          taken.push({ lane, token: String(l.token) });
        }
        return taken;
      },
      release: async (released) => {
        for (const lane of released) {
          const l = this.lanes[lane]!;
          if (l.owner === owner) Object.assign(l, { owner: '', until: 0 });
        }
      },
    };
  }
}

const LEASE_MS = 10_000;
const noWait = async () => {};

function setup() {
  const clock = { t: 1_000 };
  const table = new LaneTable(clock);
  const lanes = (owner: string) => new Lanes(table.store(owner), LEASE_MS, () => clock.t);
  return { clock, table, lanes };
}

describe('Lanes', () => {
  it('the fair share is 64 lanes over the live relays, rounded up', () => {
    expect([1, 2, 3, 4, 64, 65].map(fairShare)).toEqual([64, 32, 22, 16, 1, 1]);
    expect(fairShare(0)).toBe(64);
  });

  it('a lone relay takes every lane; each lease is valid for 80 % of a lease from before its renewal', async () => {
    const { clock, lanes } = setup();
    const a = lanes('a');
    expect(await a.maintain(noWait)).toEqual({ acquired: 64 });
    expect(a.list()).toHaveLength(64);
    expect(a.valid()).toHaveLength(64);
    clock.t += LEASE_MS * 0.8 - 1;
    expect(a.valid()).toHaveLength(64);
    clock.t += 1;
    expect(a.valid()).toHaveLength(0); // not renewed in time: nothing is sent on them
    expect(a.list()).toHaveLength(64); // still held until the renewal says otherwise
    await a.maintain(noWait);
    expect(a.valid()).toHaveLength(64);
  });

  it('a second relay takes the free half after the first gives back its extra lanes, waiting for its pass first', async () => {
    const { lanes } = setup();
    const a = lanes('a');
    const b = lanes('b');
    await a.maintain(noWait);
    expect((await b.maintain(noWait)).acquired).toBe(0); // all held by a
    const order: string[] = [];
    await a.maintain(async () => {
      order.push('pass settled');
    });
    expect(order).toEqual(['pass settled']);
    expect(a.list()).toEqual(Array.from({ length: 32 }, (_, i) => i));
    expect((await b.maintain(noWait)).acquired).toBe(32);
    expect(b.list()).toEqual(Array.from({ length: 32 }, (_, i) => i + 32));
  });

  it('a lane taken over after its lease expired is dropped at the next renewal, and its rows are no longer owned', async () => {
    const { clock, table, lanes } = setup();
    const a = lanes('a');
    await a.maintain(noWait);
    const readUnder = a.valid().filter((l) => l.lane === 5);
    const rows = [{ lane: 5 }, { lane: 6 }];
    // a pauses past its lease; b takes lane 5 with a new token.
    clock.t += LEASE_MS + 1;
    table.live.delete('a');
    const b = lanes('b');
    await b.maintain(noWait);
    expect(b.list()).toContain(5);
    await a.maintain(noWait);
    expect(a.has(5)).toBe(false);
    expect(a.stillOwned(rows, readUnder)).toEqual([]);
  });

  it('stillOwned checks the lease as held now, with the token the rows were read under', async () => {
    const { clock, lanes } = setup();
    const a = lanes('a');
    await a.maintain(noWait);
    const readUnder = a.valid();
    const rows = [{ lane: 1 }, { lane: 2 }];
    // The pass outlives the validity it started with, but a renewal kept the same tokens.
    clock.t += LEASE_MS * 0.7;
    await a.maintain(noWait);
    clock.t += LEASE_MS * 0.5;
    expect(a.stillOwned(rows, readUnder)).toEqual(rows);
    // Read under another token (a lane taken again since): not owned.
    expect(a.stillOwned(rows, [{ lane: 1, token: '999' }])).toEqual([]);
  });

  it('fenceOut stops sends on those lanes until the next renewal', async () => {
    const { lanes } = setup();
    const a = lanes('a');
    await a.maintain(noWait);
    const readUnder = a.valid();
    a.fenceOut([3, 4]);
    expect(a.stillOwned([{ lane: 3 }, { lane: 5 }], readUnder)).toEqual([{ lane: 5 }]);
    expect(a.valid().map((l) => l.lane)).not.toContain(3);
    await a.maintain(noWait); // the renewal says they are still ours
    expect(a.stillOwned([{ lane: 3 }], a.valid())).toEqual([{ lane: 3 }]);
  });

  it('releaseAll drops the lanes at once and gives them back after beforeRelease', async () => {
    const { table, lanes } = setup();
    const a = lanes('a');
    await a.maintain(noWait);
    let heldDuringWait = -1;
    const released = await a.releaseAll(async () => {
      heldDuringWait = a.size;
      expect(table.lanes.every((l) => l.owner === 'a')).toBe(true);
    });
    expect(heldDuringWait).toBe(0);
    expect(released).toHaveLength(64);
    expect(table.lanes.every((l) => l.owner === '')).toBe(true);
    expect(await a.releaseAll()).toEqual([]);
  });
});
