/**
 * The SQL of lease mode: one named function per statement, each with the reason for its
 * concurrency choice. Each runs in its own short transaction (or, for {@link fenceLease}, in the
 * caller's), never across the handler. Times are taken from the database clock, never from the
 * Node.js process: leases stay consistent across hosts whose clocks drift.
 *
 * Every state change that a waiting duplicate cares about (completed, failed, uncertain,
 * released, reconciled) sends `NOTIFY` on the schema's channel ({@link leaseChannel}) with the
 * record's stored `operation_id` (see {@link operationIdFor}), delivered at commit.
 */
import { createHash, createHmac } from 'node:crypto';
import type { Queryable } from '../database.js';
import type { IdempotencyState } from '../schema.js';
import type { StoredRecord } from './state-machine.js';
import {
  claimValues,
  completionValues,
  ownedValues,
  scopeValues,
  storedRecordOf,
  type ClaimRequest,
  type Completion,
  type KeyScope,
  type OwnedRecord,
  type RecordRef,
  type RecordRow,
} from './store.js';

/** The LISTEN/NOTIFY channel of lease mode in `schema` (unquoted name): `<schema>_idempotency`. */
export function leaseChannel(schema: string): string {
  return `${schema}_idempotency`;
}

/**
 * The id that records claimed before outboxkit stored operation ids were given: the hex SHA-256 of
 * the key alone, the same for every tenant and operation. Migration `0003_operation_id_backfill`
 * stored it in those records' `operation_id`, so their Location URLs keep working.
 *
 * @deprecated Not the id of new records: they get {@link operationIdFor} (a keyed hash), stored
 *   by the claim. Read a record's id from where outboxkit reports it (`ctx.operationId`, the 202's
 *   body and `Location`, `UncertainRecord.operationId`, `outboxkit keys list`).
 */
export function operationIdOf(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

/** Domain separation of {@link operationIdFor}'s input: a new format gets a new label. */
const OPERATION_ID_LABEL = Buffer.from('outboxkit:operation-id:v1', 'utf8');

/**
 * The public, opaque id of a new lease-mode record (`operationId`): the lower-case hex
 * HMAC-SHA256 (RFC 2104), keyed with `secret`, of the label `outboxkit:operation-id:v1` followed
 * by the tenant, the operation and the key, each as a 4-byte big-endian UTF-8 byte length and its
 * UTF-8 bytes. It names the operation resource (policy `async`) and the NOTIFY payload without
 * revealing the key; it differs between tenants and operations; without the secret, nobody can
 * test a guess of the key against it. The claim stores it in the record (`operation_id`), and
 * every later use reads it from there: a record keeps its id when the secret changes.
 *
 * @param secret - the application's `operationIdSecret` (32 bytes or more). Empty: an unkeyed
 *   hash, which anyone who knows the tenant and operation can test key guesses against (what
 *   lease mode uses, with a process warning, when `operationIdSecret` is not set).
 * @returns 64 lower-case hex digits.
 */
export function operationIdFor(scope: KeyScope, secret: Uint8Array): string {
  const hmac = createHmac('sha256', secret).update(OPERATION_ID_LABEL);
  for (const field of [scope.tenant, scope.operation, scope.key]) {
    const bytes = Buffer.from(field, 'utf8');
    const length = Buffer.alloc(4);
    length.writeUInt32BE(bytes.length);
    hmac.update(length).update(bytes);
  }
  return hmac.digest('hex');
}

/** A record as the statements of its lease owner address it, with the channel they notify on. */
export interface OwnedLease extends OwnedRecord {
  /** The schema's LISTEN/NOTIFY channel ({@link leaseChannel}). */
  channel: string;
}

/** A lease claimed (or taken over) by this execution. */
export interface LeaseClaim {
  ownerToken: string;
  generation: number;
  /** The record's stored public id (kept through a takeover; see {@link operationIdFor}). */
  operationId: string;
  /** `processing` when an expired lease was taken over, a terminal state when an expired record was reused. */
  previousState: IdempotencyState | null;
}

/**
 * Claims the key in one atomic statement and commits it (lease mode): inserts a `processing`
 * record with `lease_expires_at = now() + leaseMs`, or takes over
 * - a `processing` record whose lease has expired **and whose fingerprint is the same** (a retry
 *   of the same request after its owner died or stalled): new owner token, generation + 1;
 * - a terminal record past its retention (a new execution).
 * Returns `undefined` when a live record exists.
 *
 * - INSERT ... ON CONFLICT is the concurrency primitive, as in one-transaction mode: of two
 *   concurrent takeovers, the second sees the first's new lease and does not take over.
 * - An `uncertain` record is never taken over, nor a processing one without a lease (one-
 *   transaction mode): elapsed time alone never hands an execution to someone else unless the
 *   record was leased, and never deletes it.
 * - `prev` reads the state before the statement, for the caller's `takeover`/`expired` metric only.
 * - `operation_id`: a new record, or a new execution of an expired one, stores `operationId`; a
 *   takeover keeps the id the record has, which the first execution's callers may already hold
 *   (a Location URL), even if it was computed under another secret.
 */
export async function claimLease(
  db: Queryable,
  claim: ClaimRequest,
  operationId: string,
  leaseMs: number,
): Promise<LeaseClaim | undefined> {
  const { table, ownerToken } = claim;
  const { rows } = await db.query<{
    generation: number;
    operation_id: string;
    previous_state: IdempotencyState | null;
  }>(
    `WITH prev AS (SELECT state FROM ${table} WHERE tenant = $1 AND operation = $2 AND key = $3),
     claim AS (
       INSERT INTO ${table} AS k
              (tenant, operation, key, fingerprint, fingerprint_version, state, owner_token, operation_id,
               generation, lease_expires_at, expires_at)
       VALUES ($1, $2, $3, $4::bytea, $5::smallint, 'processing', $6::uuid, $9, 1,
               clock_timestamp() + $7::bigint * interval '1 millisecond',
               clock_timestamp() + $8::bigint * interval '1 millisecond')
       ON CONFLICT (tenant, operation, key) DO UPDATE
          SET fingerprint = EXCLUDED.fingerprint,
              fingerprint_version = EXCLUDED.fingerprint_version,
              state = 'processing',
              owner_token = EXCLUDED.owner_token,
              operation_id = CASE WHEN k.state = 'processing' THEN COALESCE(k.operation_id, EXCLUDED.operation_id)
                                  ELSE EXCLUDED.operation_id END,
              generation = k.generation + 1,
              lease_expires_at = EXCLUDED.lease_expires_at,
              response_status = NULL,
              response_headers = NULL,
              response_body = NULL,
              created_at = CASE WHEN k.state = 'processing' THEN k.created_at ELSE clock_timestamp() END,
              updated_at = clock_timestamp(),
              completed_at = NULL,
              expires_at = EXCLUDED.expires_at
        WHERE (k.state IN ('completed', 'failed') AND k.expires_at <= clock_timestamp())
           OR (k.state = 'processing' AND k.lease_expires_at <= clock_timestamp()
               AND k.fingerprint = EXCLUDED.fingerprint AND k.fingerprint_version = EXCLUDED.fingerprint_version)
       RETURNING k.generation, k.operation_id)
     SELECT claim.generation, claim.operation_id, (SELECT state FROM prev) AS previous_state FROM claim`,
    [...claimValues(claim), leaseMs, claim.retentionMs, operationId],
  );
  const row = rows[0];
  return row === undefined
    ? undefined
    : { ownerToken, generation: row.generation, operationId: row.operation_id, previousState: row.previous_state };
}

/** A record as lease mode reads it: the stored response plus its lease. */
export interface LeasedRecord extends StoredRecord {
  generation: number;
  ownerToken: string | null;
  /** Milliseconds left on the lease by the database clock (0 when expired or none). */
  leaseRemainingMs: number;
  /** Age of the record (since its claim), in milliseconds. */
  ageMs: number;
  /** The stored public id; `null` for a record of one-transaction mode. */
  operationId: string | null;
}

interface LeasedRow extends RecordRow {
  generation: number;
  owner_token: string | null;
  lease_remaining_ms: number;
  age_ms: number;
  operation_id: string | null;
}

const LEASED_COLUMNS = `state, fingerprint, fingerprint_version, response_status, response_headers, response_body,
       generation, owner_token::text AS owner_token,
       COALESCE(GREATEST(0, extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000), 0)::float8 AS lease_remaining_ms,
       (extract(epoch FROM clock_timestamp() - created_at) * 1000)::float8 AS age_ms, operation_id`;

function toLeased(r: LeasedRow): LeasedRecord {
  return {
    ...storedRecordOf(r),
    generation: r.generation,
    ownerToken: r.owner_token,
    leaseRemainingMs: r.lease_remaining_ms,
    ageMs: r.age_ms,
    operationId: r.operation_id,
  };
}

/** Reads one record, as lease mode sees it, by the `where` condition on `values` (plain read). */
async function readLeased(
  db: Queryable,
  table: string,
  where: string,
  values: readonly unknown[],
): Promise<LeasedRecord | undefined> {
  const { rows } = await db.query<LeasedRow>(`SELECT ${LEASED_COLUMNS} FROM ${table} WHERE ${where}`, values);
  return rows[0] === undefined ? undefined : toLeased(rows[0]);
}

/** Reads the record that {@link claimLease} could not take (plain read: the claim committed or not). */
export async function readLeasedRecord(db: Queryable, record: RecordRef): Promise<LeasedRecord | undefined> {
  return readLeased(db, record.table, 'tenant = $1 AND operation = $2 AND key = $3', scopeValues(record.scope));
}

/**
 * Reads a record by its stored public id, within one tenant and operation (the operation resource
 * of policy `async`). One probe of `idempotency_keys_operation_id_idx` (tenant, operation,
 * operation_id), whatever the number of records of that tenant and operation.
 */
export async function readRecordByOperationId(
  db: Queryable,
  table: string,
  id: { tenant: string; operation: string; operationId: string },
): Promise<LeasedRecord | undefined> {
  return readLeased(db, table, 'tenant = $1 AND operation = $2 AND operation_id = $3', [
    id.tenant,
    id.operation,
    id.operationId,
  ]);
}

/**
 * Extends the lease to `now() + leaseMs` (database clock). Fenced by the owner token: after a
 * takeover it updates zero rows. A renewal after expiry succeeds while nobody has taken over.
 * @returns whether this execution still owns the record.
 */
export async function renewLease(db: Queryable, lease: OwnedRecord, leaseMs: number): Promise<boolean> {
  const { rowCount } = await db.query(
    `UPDATE ${lease.table}
        SET lease_expires_at = clock_timestamp() + $5::bigint * interval '1 millisecond', updated_at = clock_timestamp()
      WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'processing' AND owner_token = $4::uuid`,
    [...ownedValues(lease), leaseMs],
  );
  return rowCount === 1;
}

/**
 * Locks the record for the rest of the caller's transaction if this execution still owns it
 * (`FOR UPDATE`): a takeover then waits until that transaction ends, so writes made in it can
 * never interleave with a new owner's. Runs in the caller's transaction.
 * @returns whether this execution still owns the record.
 */
export async function fenceLease(db: Queryable, lease: OwnedRecord): Promise<boolean> {
  const { rows } = await db.query(
    `SELECT 1 FROM ${lease.table}
      WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'processing' AND owner_token = $4::uuid
        FOR UPDATE`,
    ownedValues(lease),
  );
  return rows.length === 1;
}

/**
 * Stores the result of a leased execution (`completed` or `failed`), clears the lease and
 * notifies waiters. Fenced by the owner token: a stale owner (after a takeover) updates zero rows,
 * whatever the clock says. Retention counts from completion.
 * @returns whether the record was updated (false: ownership lost).
 */
export async function finishLease(db: Queryable, lease: OwnedLease, completion: Completion): Promise<boolean> {
  return storeFencedResult(db, lease, completion, 'processing');
}

/**
 * Stores a final response on a record that is in `from` and owned by `ownerToken`, clears its lease
 * and notifies waiters, in one statement. The state and token in the WHERE clause are the fence.
 */
async function storeFencedResult(
  db: Queryable,
  lease: OwnedLease,
  completion: Completion,
  from: 'processing' | 'uncertain',
): Promise<boolean> {
  const { rowCount } = await db.query(
    `WITH done AS (
       UPDATE ${lease.table}
          SET state = $5, response_status = $6::smallint, response_headers = $7::jsonb, response_body = $8::bytea,
              lease_expires_at = NULL, completed_at = clock_timestamp(), updated_at = clock_timestamp(),
              expires_at = clock_timestamp() + $9::bigint * interval '1 millisecond'
        WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = $11 AND owner_token = $4::uuid
        RETURNING operation_id)
     SELECT pg_notify($10, operation_id) FROM done`,
    [...completionValues(lease, completion), lease.channel, from],
  );
  return rowCount === 1;
}

/**
 * Marks the record `uncertain`: an external effect's outcome is unknown. The lease is cleared
 * (nobody may take it over by time) and the owner token is kept: the reconciliation fences on it.
 * The reason is kept in `response_body` (UTF-8) until the record is resolved.
 */
export async function markUncertain(db: Queryable, lease: OwnedLease, reason: string): Promise<boolean> {
  const { rowCount } = await db.query(
    `WITH done AS (
       UPDATE ${lease.table}
          SET state = 'uncertain', lease_expires_at = NULL, response_status = NULL, response_headers = NULL,
              response_body = convert_to($5, 'UTF8'), updated_at = clock_timestamp()
        WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'processing' AND owner_token = $4::uuid
        RETURNING operation_id)
     SELECT pg_notify($6, operation_id) FROM done`,
    [...ownedValues(lease), reason, lease.channel],
  );
  return rowCount === 1;
}

/**
 * Deletes the record of an execution that failed before any effect (the key is free again). Only
 * its owner can: a stale owner's release deletes nothing. This is the only delete of a
 * `processing` record, and it is an owner's decision, never a timeout's.
 */
export async function releaseLease(db: Queryable, lease: OwnedLease): Promise<boolean> {
  const { rowCount } = await db.query(
    `WITH gone AS (
       DELETE FROM ${lease.table}
        WHERE tenant = $1 AND operation = $2 AND key = $3 AND state = 'processing' AND owner_token = $4::uuid
        RETURNING operation_id)
     SELECT pg_notify($5, operation_id) FROM gone`,
    [...ownedValues(lease), lease.channel],
  );
  return rowCount === 1;
}

/** An `uncertain` record handed to a reconciliation hook. */
export interface UncertainRecord {
  tenant: string;
  operation: string;
  /** The idempotency key (for the hook's lookup downstream; never log it in full). */
  key: string;
  /** The record's stored public id (what its callers got in `Location` and 202 bodies). */
  operationId: string;
  /** The owner token of the execution whose outcome is unknown (what it may have sent downstream). */
  ownerToken: string;
  generation: number;
  /** What the handler said when it reported the outcome unknown. */
  reason: string;
  createdAt: Date;
  updatedAt: Date;
}

/**
 * Lists up to `limit` uncertain records of `operation`, oldest first. No lock: the hook may call
 * slow external systems; {@link resolveUncertain} fences on the owner token instead.
 */
export async function listUncertain(
  db: Queryable,
  table: string,
  operation: string,
  limit: number,
): Promise<UncertainRecord[]> {
  const { rows } = await db.query<{
    tenant: string;
    operation: string;
    key: string;
    operation_id: string;
    owner_token: string;
    generation: number;
    reason: string | null;
    created_at: Date;
    updated_at: Date;
  }>(
    // A record claimed by a version that stored no id (during a rolling upgrade) has the id that
    // version gave it: the SHA-256 of its key.
    `SELECT tenant, operation, key, owner_token::text AS owner_token, generation,
            COALESCE(operation_id, encode(sha256(convert_to(key, 'UTF8')), 'hex')) AS operation_id,
            convert_from(response_body, 'UTF8') AS reason, created_at, updated_at
       FROM ${table}
      WHERE operation = $1 AND state = 'uncertain'
      ORDER BY updated_at
      LIMIT $2`,
    [operation, limit],
  );
  return rows.map((r) => ({
    tenant: r.tenant,
    operation: r.operation,
    key: r.key,
    operationId: r.operation_id,
    ownerToken: r.owner_token,
    generation: r.generation,
    reason: r.reason ?? '',
    createdAt: r.created_at,
    updatedAt: r.updated_at,
  }));
}

/**
 * Resolves an uncertain record to `completed` or `failed` with the reconciled response. Fenced by
 * state and owner token: two reconcilers never both resolve it (the second updates zero rows).
 */
export async function resolveUncertain(db: Queryable, lease: OwnedLease, completion: Completion): Promise<boolean> {
  return storeFencedResult(db, lease, completion, 'uncertain');
}
