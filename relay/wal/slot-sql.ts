/**
 * The WAL source's setup statements: the logical replication slot the reader reads
 * (docs/wal-source.md); the publication's are src/wal-publication.ts's, re-exported here. One
 * builder per statement returning `{ text, values }`, and the function that runs it; each creator is idempotent and safe
 * to run from several processes at once (it creates, and takes "already exists" as success, rather
 * than checking first: a check-then-create races with a second relay starting beside it).
 */
import type pg from 'pg';
import { withPgTransaction, type Queryable } from '../../src/database.js';
import { InvalidOptionsError, PermissionDeniedError, WalStreamError } from '../../src/errors.js';
import { SQLSTATE, sqlStateOf, type SqlStatement } from '../../src/postgres.js';
import { parseLsn } from './lsn.js';
import { deleteSlotLeaseSql, lockSlotLeaseSql, readSlotLeases } from './slot-lease.js';
import { checkReplicationName } from '../../src/wal-publication.js';

export { checkReplicationName, createPublicationSql, ensurePublication } from '../../src/wal-publication.js';

/**
 * `pg_create_logical_replication_slot(slot, 'pgoutput')`: a persistent slot (not temporary: it
 * must outlive the reader's connection, so a restarted reader resumes where the last one
 * confirmed). The call waits for transactions running at that moment to end (it needs a
 * consistent starting point), so it is not run on a hot path.
 */
export function createLogicalSlotSql(slot: string): SqlStatement {
  return {
    text: `SELECT lsn::text AS lsn FROM pg_create_logical_replication_slot($1, 'pgoutput')`,
    values: [checkReplicationName(slot, 'slot')],
  };
}

/**
 * Creates the logical slot (plugin pgoutput) in the connected database unless it exists. The slot
 * retains WAL from then on until a reader confirms past it, so create it where a WAL relay will
 * read it; rows inserted before it existed are not streamed. Needs a role with `REPLICATION` (or
 * a superuser); waits for the transactions running at that moment to end.
 *
 * @param slot - 1-63 of `[a-z0-9_]`, not starting with a digit; unique in the whole cluster.
 * @returns whether this call created it.
 * @throws {@link InvalidOptionsError} when the name is invalid, or a slot of that name exists
 *   with another plugin or in another database (it cannot be read as this one).
 * @throws pg's error when PostgreSQL refuses (no `REPLICATION`: SQLSTATE 42501; `wal_level` not
 *   logical: 55000; no free slot: 53400).
 */
export async function ensureLogicalSlot(db: Queryable, slot: string): Promise<boolean> {
  const { text, values } = createLogicalSlotSql(slot);
  try {
    await db.query(text, values);
    return true;
  } catch (err) {
    // Same reason as ensurePublication(): "already exists" (42710) is success, but only for a
    // slot this reader can use.
    if (sqlStateOf(err) !== SQLSTATE.DUPLICATE_OBJECT) throw err;
  }
  const state = await readSlot(db, slot);
  if (state !== undefined && (state.plugin !== 'pgoutput' || !state.inThisDatabase)) {
    throw new InvalidOptionsError(
      `Replication slot ${slot} exists ${state.inThisDatabase ? `with plugin ${state.plugin}` : 'in another database'}; ` +
        'the WAL source needs a pgoutput slot in its own database. Choose another slot name.',
    );
  }
  return false;
}

/** A replication slot as pg_replication_slots shows it. */
export interface SlotState {
  plugin: string;
  /** Whether the slot belongs to the database of the connection that read it. */
  inThisDatabase: boolean;
  /** Where a new reader starts (the last confirmed commit end), in bytes. */
  confirmedFlushLsn: bigint;
  /** Whether a walsender holds it now. */
  active: boolean;
  /** The PID of that walsender (for pg_terminate_backend), if any. */
  activePid: number | null;
  /** `reserved`, `extended`, `unreserved` or `lost` (PostgreSQL 13+). */
  walStatus: string | null;
}

/** Reads one slot's row of pg_replication_slots. */
export function readSlotSql(slot: string): SqlStatement {
  return {
    text: `SELECT plugin, database = current_database() AS in_this_database,
                  confirmed_flush_lsn::text AS confirmed_flush_lsn, active, active_pid, wal_status
             FROM pg_replication_slots WHERE slot_name = $1`,
    values: [slot],
  };
}

/** The slot's state, or `undefined` when no slot has that name. */
export async function readSlot(db: Queryable, slot: string): Promise<SlotState | undefined> {
  const { text, values } = readSlotSql(slot);
  const { rows } = await db.query<{
    plugin: string | null;
    in_this_database: boolean | null;
    confirmed_flush_lsn: string | null;
    active: boolean;
    active_pid: number | null;
    wal_status: string | null;
  }>(text, values);
  const row = rows[0];
  if (row === undefined) return undefined;
  return {
    plugin: row.plugin ?? '',
    inThisDatabase: row.in_this_database === true,
    // NULL for a physical slot only; a logical one always has a confirmed position.
    confirmedFlushLsn: row.confirmed_flush_lsn === null ? 0n : parseLsn(row.confirmed_flush_lsn),
    active: row.active,
    activePid: row.active_pid,
    walStatus: row.wal_status,
  };
}

/** `pg_drop_replication_slot(slot)`: fails with 55006 while a walsender holds it, 42704 when it is gone. */
export function dropSlotSql(slot: string): SqlStatement {
  return { text: 'SELECT pg_drop_replication_slot($1)', values: [checkReplicationName(slot, 'slot')] };
}

/** A slot's row of `<schema>.wal_slots` (migration 0006): the WAL relay's durable resync marker. */
export interface WalSlotMarker {
  /** Set before the slot is (re)created, cleared once the resync published the table's rows. */
  resyncPending: boolean;
  /** Why the last resync began. */
  resyncReason: string | null;
}

/** Reads `slot`'s row of `<schema>.wal_slots`; `schema` is quoted. */
export function readSlotMarkerSql(schema: string, slot: string): SqlStatement {
  return {
    text: `SELECT resync_pending, resync_reason FROM ${schema}.wal_slots WHERE slot_name = $1`,
    values: [slot],
  };
}

/** The slot's marker, or `undefined` when no relay recorded the slot. */
export async function readSlotMarker(db: Queryable, schema: string, slot: string): Promise<WalSlotMarker | undefined> {
  const { text, values } = readSlotMarkerSql(schema, slot);
  const { rows } = await db.query<{ resync_pending: boolean; resync_reason: string | null }>(text, values);
  const row = rows[0];
  return row === undefined ? undefined : { resyncPending: row.resync_pending, resyncReason: row.resync_reason };
}

/**
 * Marks a resync of `slot` pending (inserting its row if need be), with its reason and start time.
 * Committed before the slot is created, so a relay that dies before the resync ends finds it.
 */
export function markResyncPendingSql(schema: string, slot: string, reason: string): SqlStatement {
  return {
    text: `INSERT INTO ${schema}.wal_slots (slot_name, resync_pending, resync_reason, resync_started_at)
           VALUES ($1, true, $2, now())
           ON CONFLICT (slot_name) DO UPDATE
             SET resync_pending = true, resync_reason = excluded.resync_reason, resync_started_at = now()`,
    values: [slot, reason],
  };
}

/** Clears the pending resync of `slot` once every row it had to publish is published or parked. */
export function clearResyncPendingSql(schema: string, slot: string): SqlStatement {
  return {
    text: `UPDATE ${schema}.wal_slots SET resync_pending = false, resynced_at = now() WHERE slot_name = $1`,
    values: [slot],
  };
}

/**
 * A WAL relay's slot as `outboxkit status` and the relay's metrics report it (docs/wal-source.md,
 * "Slot loss and resync"): the slot of pg_replication_slots with what it holds back, and its resync marker.
 */
export interface WalSlotStatus {
  /** The slot's name. */
  slot: string;
  /** Whether pg_replication_slots has it (false: missing, the next relay start creates it and resyncs). */
  exists: boolean;
  /** Whether a walsender reads it now. */
  active: boolean;
  /** The PID of that walsender, if any. */
  activePid: number | null;
  /** `reserved`, `extended`, `unreserved` or `lost` (past `max_slot_wal_keep_size`); null when missing. */
  walStatus: string | null;
  /**
   * WAL the slot keeps on disk: from its `restart_lsn` to the server's current WAL position, in
   * bytes. Null when the slot is missing or lost, or the server is a standby.
   */
  retainedBytes: number | null;
  /**
   * How far the slot's confirmed position (`confirmed_flush_lsn`: Kafka acknowledged everything
   * before it) is behind the server's current WAL position, in bytes. Null as `retainedBytes`.
   */
  confirmedLagBytes: number | null;
  /** A resync began and did not end (the next relay start resyncs again). */
  resyncPending: boolean;
  /** Why the last resync began (`missing`, `lost`, `unrecorded`, `interrupted`); null if none ran. */
  resyncReason: string | null;
  /** When the last resync began, in ms since the epoch (database clock); null if none ran. */
  resyncStartedAt: number | null;
  /** When the last resync ended, in ms since the epoch (database clock); null if none ended. */
  resyncedAt: number | null;
  /**
   * The relay holding the slot's reader lease (`wal_slot_leases`, its `relayId`), also when the
   * lease has expired; null when no relay holds it (never taken, or released at a stop), or when
   * the lease table cannot be read (before migration 0007, or without `SELECT` on it).
   */
  leaseOwner: string | null;
  /** How long the lease lasts yet, in ms of the database clock (0: expired, a standby may take it over); null as `leaseOwner`. */
  leaseRemainingMs: number | null;
}

/**
 * The WAL slots of `schema` (quoted): every slot a relay recorded in `<schema>.wal_slots`, and
 * `defaultSlot` when pg_replication_slots has it (a slot made by hand before the first relay).
 * On a standby (`pg_is_in_recovery()`) the byte figures are null: it has no current WAL position
 * of its own.
 */
export function walSlotsStatusSql(schema: string, defaultSlot: string): SqlStatement {
  const behind = (lsn: string) =>
    `CASE WHEN s.${lsn} IS NULL OR s.wal_status = 'lost' OR pg_is_in_recovery() THEN NULL
          ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), s.${lsn})::bigint END`;
  return {
    text: `SELECT coalesce(w.slot_name, s.slot_name::text) AS slot, s.slot_name IS NOT NULL AS exists,
                  coalesce(s.active, false) AS active, s.active_pid, s.wal_status,
                  ${behind('restart_lsn')} AS retained_bytes, ${behind('confirmed_flush_lsn')} AS confirmed_lag_bytes,
                  coalesce(w.resync_pending, false) AS resync_pending, w.resync_reason,
                  w.resync_started_at, w.resynced_at
             FROM ${schema}.wal_slots w
             FULL JOIN (SELECT * FROM pg_replication_slots WHERE database = current_database()) s
               ON s.slot_name = w.slot_name
            WHERE w.slot_name IS NOT NULL OR s.slot_name = $1
            ORDER BY 1`,
    values: [defaultSlot],
  };
}

/** Runs {@link walSlotsStatusSql}; `schema` is quoted. */
export async function walSlotsStatus(db: Queryable, schema: string, defaultSlot: string): Promise<WalSlotStatus[]> {
  const { text, values } = walSlotsStatusSql(schema, defaultSlot);
  const { rows } = await db.query<{
    slot: string;
    exists: boolean;
    active: boolean;
    active_pid: number | null;
    wal_status: string | null;
    retained_bytes: string | null;
    confirmed_lag_bytes: string | null;
    resync_pending: boolean;
    resync_reason: string | null;
    resync_started_at: Date | null;
    resynced_at: Date | null;
  }>(text, values);
  const bytes = (v: string | null) => (v === null ? null : Number(v));
  const leases = await slotLeases(
    db,
    schema,
    rows.map((r) => r.slot),
  );
  return rows.map((r) => ({
    slot: r.slot,
    exists: r.exists,
    active: r.active,
    activePid: r.active_pid,
    walStatus: r.wal_status,
    retainedBytes: bytes(r.retained_bytes),
    confirmedLagBytes: bytes(r.confirmed_lag_bytes),
    resyncPending: r.resync_pending,
    resyncReason: r.resync_reason,
    resyncStartedAt: r.resync_started_at?.getTime() ?? null,
    resyncedAt: r.resynced_at?.getTime() ?? null,
    leaseOwner: leases.get(r.slot)?.owner ?? null,
    leaseRemainingMs: leases.get(r.slot)?.remainingMs ?? null,
  }));
}

/**
 * The reader leases of `slots` ({@link readSlotLeases}); empty when the lease table does not exist
 * (a schema before migration 0007) or may not be read: the status lists the slots without their
 * lease then.
 */
async function slotLeases(
  db: Queryable,
  schema: string,
  slots: readonly string[],
): Promise<Map<string, { owner: string; remainingMs: number }>> {
  if (slots.length === 0) return new Map();
  try {
    return await readSlotLeases(db, schema, slots);
  } catch (err) {
    const state = sqlStateOf(err);
    if (state !== SQLSTATE.UNDEFINED_TABLE && state !== SQLSTATE.INSUFFICIENT_PRIVILEGE) throw err;
    return new Map();
  }
}

/**
 * The key of the session advisory lock under which a WAL relay checks and resyncs `slot`
 * (`pg_try_advisory_lock(hashtextextended(key, 0))` in relay/wal/wal-relay.ts): whoever holds it
 * is the only one creating, dropping or resyncing the slot. The text must stay the relay's.
 */
export function slotCheckLockKey(slot: string): string {
  return `outboxkit.wal_slots:${slot}`;
}

/** What {@link dropWalSlot} did. */
export interface DroppedWalSlot {
  /** The slot's name. */
  slot: string;
  /** Whether this call dropped the slot (false: no slot of that name existed). */
  dropped: boolean;
  /** Rows of `<schema>.wal_slots` and `<schema>.wal_slot_leases` deleted (0 to 2). */
  forgotten: number;
}

/** Deletes the slot's row of `<schema>.wal_slots` (its resync marker); `schema` is quoted. */
export function deleteSlotMarkerSql(schema: string, slot: string): SqlStatement {
  return { text: `DELETE FROM ${schema}.wal_slots WHERE slot_name = $1`, values: [slot] };
}

/**
 * Drops a WAL relay's replication slot and forgets it (its rows of `<schema>.wal_slots` and
 * `<schema>.wal_slot_leases`), for going back to the table relay (docs/runbooks.md, "Switching
 * between table mode and WAL mode"): a slot that no relay reads keeps every WAL segment written
 * after its confirmed position on the server's disk (up to `max_slot_wal_keep_size`), and a WAL
 * relay started on it later would stream everything written since (the table relay's events
 * again). A WAL relay started after the drop creates a new slot and resyncs the table's
 * unpublished rows. `outboxkit wal drop-slot` runs it.
 *
 * In one transaction on one connection of `pool`: takes the relay's slot-check lock
 * ({@link slotCheckLockKey}), refuses while a relay holds the slot's lease or a walsender reads
 * the slot, drops the slot (`pg_drop_replication_slot`, not transactional: it stays dropped if the
 * transaction fails after it) and deletes its rows.
 *
 * @param schema - outboxkit's schema, quoted (`quoteSchema()`).
 * @param slot - the slot's name (`[a-z_][a-z0-9_]{0,62}`).
 * @returns the slot, whether it was dropped (false when it did not exist: its rows are deleted
 *   all the same) and how many of its rows were deleted.
 * @throws {@link WalStreamError} (retriable) when a WAL relay holds the slot's lease (unexpired,
 *   database clock), a walsender reads the slot (SQLSTATE 55006), or a relay is checking or
 *   resyncing it: stop every WAL relay of the slot, standbys included, and run it again.
 * @throws {@link InvalidOptionsError} when `slot` is not a valid name, or the slot belongs to
 *   another plugin or database (not a WAL relay's slot of this database: left alone).
 * @throws {@link PermissionDeniedError} when the role may not drop the slot (no `REPLICATION`).
 * @throws pg's error otherwise (SQLSTATE 42P01 before migrations 0006 and 0007, 42501 without the
 *   right to change those tables: the CLI names both fixes).
 */
export async function dropWalSlot(pool: pg.Pool, schema: string, slot: string): Promise<DroppedWalSlot> {
  checkReplicationName(slot, 'slot');
  return withPgTransaction(pool, async (client) => {
    const db: Queryable = {
      query: async <R>(text: string, values: readonly unknown[] = []) => {
        const r = await client.query(text, [...values]);
        return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
      },
    };
    const locked = await db.query<{ locked: boolean }>(
      'SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)) AS locked',
      [slotCheckLockKey(slot)],
    );
    if (locked.rows[0]?.locked !== true) {
      throw new WalStreamError(`A WAL relay is checking or resyncing slot ${slot}; stop every WAL relay of it first.`);
    }
    const leaseSql = lockSlotLeaseSql(schema, slot);
    const lease = (
      await db.query<{ owner_id: string | null; remaining_ms: number | null }>(leaseSql.text, leaseSql.values)
    ).rows[0];
    if (lease?.owner_id != null && Number(lease.remaining_ms ?? 0) > 0) {
      throw new WalStreamError(
        `WAL relay ${lease.owner_id} holds the lease of replication slot ${slot} (${Number(lease.remaining_ms)} ms left): ` +
          'stop every WAL relay of this slot, standbys included, then drop it.',
      );
    }
    const state = await readSlot(db, slot);
    if (state !== undefined && (state.plugin !== 'pgoutput' || !state.inThisDatabase)) {
      throw new InvalidOptionsError(
        `Replication slot ${slot} exists ${state.inThisDatabase ? `with plugin ${state.plugin}` : 'in another database'}; ` +
          'it is not a WAL relay slot of this database: left alone.',
      );
    }
    if (state?.active === true) {
      throw new WalStreamError(
        `Replication slot ${slot} is read by walsender PID ${state.activePid ?? '?'}: stop every WAL relay of this slot first.`,
      );
    }
    let dropped = false;
    if (state !== undefined) {
      const drop = dropSlotSql(slot);
      try {
        await db.query(drop.text, drop.values);
        dropped = true;
      } catch (err) {
        // A reader that started, or another drop, between the read and the drop.
        const code = sqlStateOf(err);
        if (code === SQLSTATE.OBJECT_IN_USE) {
          throw new WalStreamError(`Replication slot ${slot} is read now: stop every WAL relay of this slot first.`, {
            cause: err,
          });
        }
        if (code === SQLSTATE.INSUFFICIENT_PRIVILEGE) {
          // Not a grant on outboxkit's tables: dropping a slot takes the REPLICATION attribute.
          throw new PermissionDeniedError(
            `The database role may not drop replication slot ${slot} (${(err as Error).message}): ` +
              'run it as a role with REPLICATION (ALTER ROLE <role> REPLICATION), as the WAL relay runs, or as a superuser.',
            { cause: err },
          );
        }
        if (code !== SQLSTATE.UNDEFINED_OBJECT) throw err;
      }
    }
    let forgotten = 0;
    for (const forget of [deleteSlotMarkerSql(schema, slot), deleteSlotLeaseSql(schema, slot)]) {
      forgotten += (await db.query(forget.text, forget.values)).rowCount;
    }
    return { slot, dropped, forgotten };
  });
}
