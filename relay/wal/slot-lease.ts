/**
 * The WAL relay's reader lease (docs/wal-source.md, "One reader per slot, standbys, and scaling"):
 * one row of `<schema>.wal_slot_leases` per slot (migration 0007). The relay holding the lease is
 * the only one that reads the slot; a standby takes an expired lease over, which raises the
 * fencing token, then ends the former reader's walsender (a paused reader keeps it, and so the
 * slot, until `wal_sender_timeout`). Lease ends are times of the database clock, so the relays'
 * clocks never decide who reads. One builder per statement returning `{ text, values }`, and the
 * function that runs it; `schema` is quoted by the caller.
 */
import type { Queryable } from '../../src/database.js';
import type { SqlStatement } from '../../src/postgres.js';

/** A lease this relay holds: its fencing token (a decimal string: bigint) and whom it took it from. */
export interface SlotLeaseHeld {
  acquired: true;
  fencingToken: string;
  /** The former owner when this call took an expired lease over; undefined when it was free or ours. */
  tookOverFrom: string | undefined;
}

/**
 * A lease another relay holds, and for how long yet by the database clock, in ms. `sameId`: that
 * relay runs with this relay's own `relayId` (two running relays given one id), and a walsender
 * still reads the slot.
 */
export interface SlotLeaseBusy {
  acquired: false;
  owner: string;
  remainingMs: number;
  sameId: boolean;
}

/** The row, so that the `UPDATE` below has one to lock; a no-op when it exists. */
export function insertSlotLeaseSql(schema: string, slot: string): SqlStatement {
  return {
    text: `INSERT INTO ${schema}.wal_slot_leases (slot_name) VALUES ($1) ON CONFLICT (slot_name) DO NOTHING`,
    values: [slot],
  };
}

/**
 * Takes the lease when it is free (no owner: never held, or released by a relay that stopped),
 * this relay object's (`instanceId`), expired by the database clock, or held under this relay's
 * `relayId` by another instance while no walsender reads the slot (the same relay restarted after
 * a crash: it takes its lease back at once; a second running relay given the same id does not,
 * while the first one streams). For `leaseMs` from now. The fencing token grows when the holder
 * (`relayId` and instance) changes. The sub-select locks the row first and returns its former
 * owner: two standbys racing for an expired lease queue on that lock, and the second one's `WHERE`
 * sees the first one's fresh lease (READ COMMITTED re-checks the updated row), so at most one wins.
 */
export function acquireSlotLeaseSql(
  schema: string,
  o: { slot: string; ownerId: string; instanceId: string; leaseMs: number },
): SqlStatement {
  return {
    text: `UPDATE ${schema}.wal_slot_leases l
              SET owner_id = $2, instance_id = $4,
                  fencing_token = l.fencing_token
                    + CASE WHEN l.owner_id IS NOT DISTINCT FROM $2 AND l.instance_id IS NOT DISTINCT FROM $4 THEN 0 ELSE 1 END,
                  lease_expires_at = now() + $3 * interval '1 millisecond'
             FROM (SELECT slot_name, owner_id, lease_expires_at FROM ${schema}.wal_slot_leases
                    WHERE slot_name = $1 FOR UPDATE) former
            WHERE l.slot_name = former.slot_name
              AND (l.owner_id IS NULL OR l.lease_expires_at IS NULL OR l.lease_expires_at <= now()
                   OR (l.owner_id = $2 AND l.instance_id IS NOT DISTINCT FROM $4)
                   OR (l.owner_id = $2
                       AND NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active)))
        RETURNING l.fencing_token::text AS fencing_token, former.owner_id AS former_owner`,
    values: [o.slot, o.ownerId, o.leaseMs, o.instanceId],
  };
}

/** Who holds the leases of `slots` and for how long yet (ms, database clock; 0 when expired); `owner_id` NULL when free. */
export function readSlotLeasesSql(schema: string, slots: readonly string[]): SqlStatement {
  return {
    text: `SELECT slot_name, owner_id,
                  GREATEST(0, CEIL(EXTRACT(EPOCH FROM (lease_expires_at - now())) * 1000))::float8 AS remaining_ms
             FROM ${schema}.wal_slot_leases WHERE slot_name = ANY($1)`,
    values: [slots],
  };
}

/**
 * Locks the lease row of `slot` (if any) and reads it, for dropping the slot
 * (`dropWalSlot()`, relay/wal/slot-sql.ts): a relay taking or renewing the lease (its `UPDATE`
 * locks the row first) waits until that transaction ends, and then finds no row. `remaining_ms`
 * is 0 once the lease has expired (database clock); `owner_id` NULL when released.
 */
export function lockSlotLeaseSql(schema: string, slot: string): SqlStatement {
  return {
    text: `SELECT owner_id,
                  GREATEST(0, CEIL(EXTRACT(EPOCH FROM (lease_expires_at - now())) * 1000))::float8 AS remaining_ms
             FROM ${schema}.wal_slot_leases WHERE slot_name = $1 FOR UPDATE`,
    values: [slot],
  };
}

/** Deletes the lease row of `slot` (the slot was dropped: the next relay inserts a new one). */
export function deleteSlotLeaseSql(schema: string, slot: string): SqlStatement {
  return { text: `DELETE FROM ${schema}.wal_slot_leases WHERE slot_name = $1`, values: [slot] };
}

/**
 * Runs {@link readSlotLeasesSql}: the leases of `slots` a relay holds (expired ones included), by
 * slot, with the time left in ms (0 when expired).
 *
 * @throws pg's error (SQLSTATE 42P01 before migration 0007, 42501 without `SELECT` on the table).
 */
export async function readSlotLeases(
  db: Queryable,
  schema: string,
  slots: readonly string[],
): Promise<Map<string, { owner: string; remainingMs: number }>> {
  const { text, values } = readSlotLeasesSql(schema, slots);
  const { rows } = await db.query<{ slot_name: string; owner_id: string | null; remaining_ms: number }>(text, values);
  const leases = new Map<string, { owner: string; remainingMs: number }>();
  for (const r of rows) {
    if (r.owner_id !== null) leases.set(r.slot_name, { owner: r.owner_id, remainingMs: Number(r.remaining_ms) });
  }
  return leases;
}

/**
 * Takes or renews the lease of `slot` for `ownerId` and its `instanceId` (a random id of the
 * relay object) (both in one call: a relay takes it before reading, and calls again to renew). Runs {@link insertSlotLeaseSql} then
 * {@link acquireSlotLeaseSql}, and {@link readSlotLeases} when another relay holds it.
 *
 * @param o.leaseMs - how long the lease lasts past this call, in ms (database clock).
 * @throws pg's error when PostgreSQL fails (SQLSTATE 42P01 before migration 0007).
 */
export async function acquireSlotLease(
  db: Queryable,
  schema: string,
  o: { slot: string; ownerId: string; instanceId: string; leaseMs: number },
): Promise<SlotLeaseHeld | SlotLeaseBusy> {
  const insert = insertSlotLeaseSql(schema, o.slot);
  await db.query(insert.text, insert.values);
  const acquire = acquireSlotLeaseSql(schema, o);
  const { rows } = await db.query<{ fencing_token: string; former_owner: string | null }>(acquire.text, acquire.values);
  const row = rows[0];
  if (row !== undefined) {
    const former = row.former_owner;
    return {
      acquired: true,
      fencingToken: row.fencing_token,
      tookOverFrom: former !== null && former !== o.ownerId ? former : undefined,
    };
  }
  const busy = (await readSlotLeases(db, schema, [o.slot])).get(o.slot);
  const owner = busy?.owner ?? '?';
  return { acquired: false, owner, remainingMs: busy?.remainingMs ?? 0, sameId: owner === o.ownerId };
}

/**
 * Extends the lease by `leaseMs` from now, only while `ownerId` holds it with `fencingToken`: a
 * relay whose lease was taken over renews nothing.
 *
 * @returns whether the lease is still this relay's.
 */
export async function renewSlotLease(
  db: Queryable,
  schema: string,
  o: { slot: string; ownerId: string; fencingToken: string; leaseMs: number },
): Promise<boolean> {
  const { rowCount } = await db.query(
    `UPDATE ${schema}.wal_slot_leases SET lease_expires_at = now() + $4 * interval '1 millisecond'
      WHERE slot_name = $1 AND owner_id = $2 AND fencing_token = $3::bigint`,
    [o.slot, o.ownerId, o.fencingToken, o.leaseMs],
  );
  return rowCount === 1;
}

/** Gives the lease up (a relay that stops), so a standby takes over at once; only with its token. */
export async function releaseSlotLease(
  db: Queryable,
  schema: string,
  o: { slot: string; ownerId: string; fencingToken: string },
): Promise<boolean> {
  const { rowCount } = await db.query(
    `UPDATE ${schema}.wal_slot_leases SET owner_id = NULL, lease_expires_at = NULL
      WHERE slot_name = $1 AND owner_id = $2 AND fencing_token = $3::bigint`,
    [o.slot, o.ownerId, o.fencingToken],
  );
  return rowCount === 1;
}

/**
 * Ends the walsender that reads `slot` (a former reader's, held past its lease: a paused process
 * keeps its connection, and so the slot, until `wal_sender_timeout`), waiting up to `waitMs` for it
 * to exit. Only a WAL relay's kind of slot: a pgoutput slot of the connection's own database (a
 * slot of that name in another database or of another plugin is someone else's reader, left
 * alone; the relay's slot check then refuses it). Needs the right to signal it: a superuser, a
 * member of `pg_signal_backend`, or a member of the walsender's role (the relays' own role).
 *
 * @returns the PID it ended, or undefined when no process reads such a slot.
 * @throws pg's error (SQLSTATE 42501) without the right to signal it.
 */
export async function endSlotReader(db: Queryable, slot: string, waitMs: number): Promise<number | undefined> {
  const { rows } = await db.query<{ pid: number }>(
    `SELECT active_pid AS pid, pg_terminate_backend(active_pid, $2::bigint) AS ended
       FROM pg_replication_slots
      WHERE slot_name = $1 AND active_pid IS NOT NULL AND plugin = 'pgoutput' AND database = current_database()`,
    [slot, waitMs],
  );
  return rows[0]?.pid;
}
