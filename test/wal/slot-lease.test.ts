/**
 * The WAL relay's reader lease (relay/wal/slot-lease.ts) against the real PostgreSQL: one owner at
 * a time when many relays race for a free or an expired lease; the fencing token grows on each
 * change of owner and never on a renewal; a relay whose lease was taken over renews and releases
 * nothing; a released lease is free at once; a standby learns who holds it and for how long yet.
 * The lease ends by the database clock (the test moves it into the past by hand).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { acquireSlotLease, releaseSlotLease, renewSlotLease } from '../../relay/wal/slot-lease.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';

const SCHEMA = '"outboxkit"';
let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase({ poolSize: 8 });
}, 60_000);
afterAll(async () => {
  await db?.drop();
});

/** Each relay id runs as one relay object (instance) unless `instanceId` is given. */
const acquire = (slot: string, ownerId: string, leaseMs = 60_000, instanceId = `${ownerId}-instance`) =>
  acquireSlotLease(db.pool, SCHEMA, { slot, ownerId, instanceId, leaseMs });

/** Ends the lease now, as if its owner had stopped renewing it long ago. */
const expire = (slot: string) =>
  db.pool.query(
    `UPDATE outboxkit.wal_slot_leases SET lease_expires_at = now() - interval '1 second' WHERE slot_name = $1`,
    [slot],
  );

describe('the WAL slot lease', () => {
  // Breach caught: two relays reading one slot (both think they hold its lease).
  it('goes to exactly one of many relays racing for it, free or expired', async () => {
    for (const round of ['free', 'expired'] as const) {
      const slot = `race_${round}`;
      if (round === 'expired') {
        await acquire(slot, 'old-owner');
        await expire(slot);
      }
      const results = await Promise.all(Array.from({ length: 8 }, (_, i) => acquire(slot, `relay-${i}`)));
      const winners = results.filter((r) => r.acquired);
      expect(winners, round).toHaveLength(1);
      const losers = results.filter((r) => !r.acquired);
      const owner = `relay-${results.findIndex((r) => r.acquired)}`;
      for (const l of losers) expect(l).toMatchObject({ acquired: false, owner });
      expect(winners[0]).toMatchObject({
        acquired: true,
        fencingToken: round === 'free' ? '1' : '2',
        tookOverFrom: round === 'free' ? undefined : 'old-owner',
      });
    }
  });

  // Breach caught: a renewal that bumps the token (fencing its own holder), or a former owner
  // that renews or releases a lease another relay took over.
  it('fences a former owner: it renews and releases nothing once another relay took over', async () => {
    const slot = 'fenced';
    const first = await acquire(slot, 'a');
    expect(first).toMatchObject({ acquired: true, fencingToken: '1', tookOverFrom: undefined });
    // Taking it again (a renewal by acquire) keeps the token.
    expect(await acquire(slot, 'a')).toMatchObject({ acquired: true, fencingToken: '1' });
    expect(await renewSlotLease(db.pool, SCHEMA, { slot, ownerId: 'a', fencingToken: '1', leaseMs: 60_000 })).toBe(
      true,
    );
    // Live: another relay waits, told who holds it and for about how long.
    const busy = await acquire(slot, 'b');
    expect(busy).toMatchObject({ acquired: false, owner: 'a' });
    expect(busy.acquired === false && busy.remainingMs).toBeGreaterThan(50_000);

    await expire(slot);
    const taken = await acquire(slot, 'b');
    expect(taken).toMatchObject({ acquired: true, fencingToken: '2', tookOverFrom: 'a' });
    expect(await renewSlotLease(db.pool, SCHEMA, { slot, ownerId: 'a', fencingToken: '1', leaseMs: 60_000 })).toBe(
      false,
    );
    expect(await releaseSlotLease(db.pool, SCHEMA, { slot, ownerId: 'a', fencingToken: '1' })).toBe(false);
    expect(await acquire(slot, 'a')).toMatchObject({ acquired: false, owner: 'b' });
  });

  // Breach caught: a relay that stopped holding its lease until it expires (a standby waiting a
  // whole lease after a clean stop).
  it('is free at once once released; the next owner gets a new token', async () => {
    const slot = 'released';
    await acquire(slot, 'a');
    expect(await releaseSlotLease(db.pool, SCHEMA, { slot, ownerId: 'a', fencingToken: '1' })).toBe(true);
    expect(await acquire(slot, 'b')).toMatchObject({ acquired: true, fencingToken: '2', tookOverFrom: undefined });
    // The same id again after a crash (a restart with a stable relayId: another instance) takes it
    // back at once while no walsender reads the slot (none of that name exists here); a new token.
    expect(await acquire(slot, 'b', 60_000, 'b-restarted')).toMatchObject({ acquired: true, fencingToken: '3' });
    // Renewals by that instance keep it.
    expect(await acquire(slot, 'b', 60_000, 'b-restarted')).toMatchObject({ acquired: true, fencingToken: '3' });
  });
});
