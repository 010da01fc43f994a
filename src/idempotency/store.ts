/**
 * The idempotency store's SQL: one named function per statement, each with the reason for its
 * concurrency choice. All run inside the request's transaction (`Queryable` from
 * `joinTransaction()`), except {@link deleteExpiredKeys}, which runs in a transaction of its own.
 *
 * `table` is the quoted, validated `"schema".idempotency_keys` from {@link idempotencyTable}.
 */
import { createHash } from 'node:crypto';
import type { Queryable } from '../database.js';
import type { IdempotencyState } from '../schema.js';
import type { Fingerprint } from './fingerprint.js';
import { InvalidOptionsError } from '../errors.js';
import { schemaOfTable, toSchemaMissing } from './pg-errors.js';
import { headersToStore, type IdempotentResponse, type StoredRecord } from './state-machine.js';
import { MAX_OPERATION_BYTES, MAX_TENANT_BYTES, textProblem } from './text.js';

/** The (tenant, operation, key) scope of one record: its primary key. */
export interface KeyScope {
  tenant: string;
  operation: string;
  key: string;
}

/** One record as a statement addresses it: the table and the record's scope. */
export interface RecordRef {
  /** The quoted, validated `"schema".idempotency_keys` ({@link idempotencyTable}). */
  table: string;
  scope: KeyScope;
}

/**
 * One record as the statements of its owner address it, with the owner token that fences each
 * statement (it changes nothing once another execution owns the record).
 */
export interface OwnedRecord extends RecordRef {
  /** The owner token of this execution (a UUID it generated). */
  ownerToken: string;
}

/** What a claim statement writes besides the owner: the request's fingerprint and the retention. */
export interface ClaimRequest extends OwnedRecord {
  fingerprint: Fingerprint;
  /** How long a terminal record is kept, in ms (the claim's `expires_at` until completion). */
  retentionMs: number;
}

/** The values `$1` to `$3` of a statement on one record: its primary key (tenant, operation, key). */
export function scopeValues(scope: KeyScope): unknown[] {
  return [scope.tenant, scope.operation, scope.key];
}

/** The values `$1` to `$4` of a statement fenced by the owner token: the record's key, then the token. */
export function ownedValues(record: OwnedRecord): unknown[] {
  return [...scopeValues(record.scope), record.ownerToken];
}

/**
 * The values `$1` to `$6` of both claim statements ({@link claimKey}, lease mode's): the record's
 * key, the fingerprint's digest and version, the new owner token.
 */
export function claimValues(claim: ClaimRequest): unknown[] {
  return [...scopeValues(claim.scope), claim.fingerprint.digest, claim.fingerprint.version, claim.ownerToken];
}

/** The qualified idempotency table of a quoted schema (see `quoteSchema()`). */
export function idempotencyTable(quotedSchema: string): string {
  return `${quotedSchema}.idempotency_keys`;
}

/**
 * The transaction-local setting in which {@link setClaimLockTimeout} (or {@link claimBeginSql})
 * keeps the caller's `lock_timeout` while the claim runs with its own, and from which
 * {@link claimKey} restores it for the handler. A custom (dotted) setting set with
 * `set_config(..., true)` lives until the end of the transaction, like `SET LOCAL`.
 */
export const RESTORE_LOCK_TIMEOUT_SETTING = 'outboxkit.restore_lock_timeout';

/**
 * Sets `lock_timeout` for the rest of this transaction only (`set_config(..., true)` is
 * `SET LOCAL`; parameterised, unlike `SET`), after keeping the value it replaces in
 * {@link RESTORE_LOCK_TIMEOUT_SETTING}, so that {@link claimKey} can restore it before the handler
 * runs: the claim's short timeout must not apply to the handler's own queries.
 *
 * The previous value is read in a subquery (kept apart by `OFFSET 0`), which produces its row
 * before the outer target list, and so `set_config`, is evaluated.
 *
 * With a `pg.Pool`, {@link claimBeginSql} does the same in the BEGIN round trip instead.
 */
export async function setClaimLockTimeout(db: Queryable, timeoutMs: number): Promise<void> {
  await db.query(
    `SELECT set_config('${RESTORE_LOCK_TIMEOUT_SETTING}', p.previous, true) AS kept,
            set_config('lock_timeout', $1, true) AS applied
       FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) p`,
    [`${timeoutMs}ms`],
  );
}

/**
 * The statement that opens a claim transaction on a `pg` client in one round trip: `BEGIN`, then
 * what {@link setClaimLockTimeout} does, as one simple-protocol query (several statements, no
 * parameters: `timeoutMs` is a validated integer, the only value in the text).
 */
export function claimBeginSql(timeoutMs: number): string {
  if (!Number.isSafeInteger(timeoutMs) || timeoutMs < 1)
    throw new InvalidOptionsError(`lockTimeoutMs must be an integer ≥ 1 (ms), got ${timeoutMs}.`);
  return `BEGIN; SELECT set_config('${RESTORE_LOCK_TIMEOUT_SETTING}', p.previous, true), set_config('lock_timeout', '${timeoutMs}ms', true) FROM (SELECT current_setting('lock_timeout') AS previous OFFSET 0) p`;
}

/** A key claimed by this transaction. */
export interface Claim {
  /** Identifies this execution; completing the record requires it (fencing). */
  ownerToken: string;
  /** 1 for a new key; incremented each time an expired record is taken over. */
  generation: number;
}

/**
 * Claims the key in one atomic statement: inserts a fresh `processing` record, or takes over the
 * existing record when its retention has passed. Returns `undefined` when a live record exists
 * (the caller then reads it with {@link readRecord}).
 *
 * Why this shape:
 * - INSERT ... ON CONFLICT on the primary key is the concurrency primitive. A check-then-insert
 *   lets two requests both see "no record" and both execute.
 * - A concurrent duplicate whose transaction has not committed makes this statement wait on that
 *   transaction; `lock_timeout` (see {@link setClaimLockTimeout}) bounds the wait: SQLSTATE 55P03
 *   then means "in progress". When the other transaction commits, the conflict resolves against
 *   its committed record; when it rolls back, this INSERT proceeds and claims the key.
 * - `DO UPDATE ... WHERE` takes over only a terminal (`completed`/`failed`) record past its
 *   `expires_at`; a `processing` or `uncertain` record is never taken over by elapsed time
 *   (docs/guarantees.md, G1: elapsed time alone never deletes a processing record). Even when the WHERE is
 *   false, ON CONFLICT DO UPDATE locks the conflicting row, so the record cannot change or be
 *   cleaned up between this statement and {@link readRecord}.
 * - `set_config` in the outer SELECT runs only for the returned (claimed) row, after the insert
 *   took its lock: it restores the caller's `lock_timeout` (kept by {@link setClaimLockTimeout})
 *   for the handler, without a round trip. When nothing is claimed, no handler runs and the
 *   setting does not matter.
 */
export async function claimKey(db: Queryable, claim: ClaimRequest): Promise<Claim | undefined> {
  const { rows } = await db.query<{ generation: number }>(
    claimSql(claim.table, ['$1', '$2', '$3', '$4::bytea', '$5::smallint', '$6::uuid', '$7::bigint']),
    [...claimValues(claim), claim.retentionMs],
  );
  return claimOf(rows[0], claim.ownerToken);
}

/** The claim of the row the claim statement returned, if it returned one (else a live record exists). */
function claimOf(row: { generation: number } | undefined, ownerToken: string): Claim | undefined {
  return row === undefined ? undefined : { ownerToken, generation: row.generation };
}

/** The claim statement of {@link claimKey}, with the given SQL expressions as its seven values. */
function claimSql(table: string, v: readonly string[]): string {
  return `WITH claim AS (
       INSERT INTO ${table} AS k
              (tenant, operation, key, fingerprint, fingerprint_version, state, owner_token, generation, expires_at)
       VALUES (${v[0]}, ${v[1]}, ${v[2]}, ${v[3]}, ${v[4]}, 'processing', ${v[5]}, 1, now() + ${v[6]} * interval '1 millisecond')
       ON CONFLICT (tenant, operation, key) DO UPDATE
          SET fingerprint = EXCLUDED.fingerprint,
              fingerprint_version = EXCLUDED.fingerprint_version,
              state = 'processing',
              owner_token = EXCLUDED.owner_token,
              generation = k.generation + 1,
              lease_expires_at = NULL,
              response_status = NULL,
              response_headers = NULL,
              response_body = NULL,
              created_at = now(),
              updated_at = now(),
              completed_at = NULL,
              expires_at = EXCLUDED.expires_at
        WHERE k.expires_at <= now() AND k.state IN ('completed', 'failed')
       RETURNING k.generation)
     SELECT claim.generation,
            set_config('lock_timeout', current_setting('${RESTORE_LOCK_TIMEOUT_SETTING}'), true) AS lock_timeout
       FROM claim`;
}

/** The part of a node-postgres client that {@link claimKeyWithSavepoint} uses. */
export interface SimpleQueryClient {
  query(text: string): Promise<unknown>;
}

/**
 * {@link claimKey} followed by {@link setClaimSavepoint} in ONE round trip, for a node-postgres
 * client (`pg.PoolClient`): both statements go in one simple-protocol query, which cannot carry
 * parameters, so the values are written as SQL literals:
 * - tenant, operation and key with `escapeLiteral` of node-postgres (quotes doubled; a backslash
 *   makes it an `E'...'` literal, correct whatever `standard_conforming_strings` is);
 * - the fingerprint as `decode('<hex>', 'hex')`, the owner token (a UUID we generated) escaped
 *   too, the fingerprint version and the retention as validated integers.
 *
 * When the claim fails (lock timeout), PostgreSQL skips the SAVEPOINT; when it claims nothing (a
 * live record), the SAVEPOINT is harmless: no handler runs. A savepoint costs no lock and no WAL.
 */
export async function claimKeyWithSavepoint(
  client: SimpleQueryClient,
  escapeLiteral: (value: string) => string,
  claim: ClaimRequest,
): Promise<Claim | undefined> {
  const { scope, fingerprint, retentionMs } = claim;
  if (!Number.isSafeInteger(fingerprint.version) || !Number.isSafeInteger(retentionMs)) {
    throw new InvalidOptionsError('The fingerprint version and retentionMs must be safe integers.');
  }
  const text = `${claimSql(claim.table, [
    escapeLiteral(scope.tenant),
    escapeLiteral(scope.operation),
    escapeLiteral(scope.key),
    `decode('${fingerprint.digest.toString('hex')}', 'hex')`,
    `${fingerprint.version}::smallint`,
    `${escapeLiteral(claim.ownerToken)}::uuid`,
    `${retentionMs}::bigint`,
  ])}; SAVEPOINT ${CLAIM_SAVEPOINT}`;
  const results = (await client.query(text)) as { rows: { generation: number }[] }[];
  return claimOf(results[0]?.rows[0], claim.ownerToken);
}

/** The savepoint taken right after a successful claim (see {@link setClaimSavepoint}). */
export const CLAIM_SAVEPOINT = 'outboxkit_claim';

/**
 * Takes a SAVEPOINT right after the claim, so that a stored business rejection can undo the
 * handler's writes (business rows, outbox events) while keeping the claim, and store the
 * rejection in the same transaction ({@link rollbackToClaimSavepoint}). A savepoint costs one round
 * trip and no lock; the name is outboxkit's own, so it never collides with drizzle's nested
 * transactions (`sp1`, `sp2`, ...).
 */
export async function setClaimSavepoint(db: Queryable): Promise<void> {
  await db.query(`SAVEPOINT ${CLAIM_SAVEPOINT}`);
}

/**
 * Rolls the transaction back to {@link setClaimSavepoint}: every write made after the claim is
 * undone (also after a failed statement the handler caught: ROLLBACK TO SAVEPOINT leaves the
 * aborted state), and the claim's row lock is kept.
 */
export async function rollbackToClaimSavepoint(db: Queryable): Promise<void> {
  await db.query(`ROLLBACK TO SAVEPOINT ${CLAIM_SAVEPOINT}`);
}

/** The columns of a record that every read of the store selects (lease mode's select more). */
export interface RecordRow {
  state: IdempotencyState;
  fingerprint: Buffer;
  fingerprint_version: number;
  response_status: number | null;
  response_headers: Record<string, string> | null;
  response_body: Buffer | null;
}

/**
 * Reads the record that {@link claimKey} could not take. Under READ COMMITTED (PostgreSQL's
 * default, which outboxkit expects) this statement's snapshot includes the record committed by
 * the transaction the claim may have waited for.
 */
export async function readRecord(db: Queryable, record: RecordRef): Promise<StoredRecord | undefined> {
  const { rows } = await db.query<RecordRow>(
    `SELECT state, fingerprint, fingerprint_version, response_status, response_headers, response_body
       FROM ${record.table}
      WHERE tenant = $1 AND operation = $2 AND key = $3`,
    scopeValues(record.scope),
  );
  return rows[0] === undefined ? undefined : storedRecordOf(rows[0]);
}

/**
 * The read-first path: reads the record only if it is terminal (`completed`/`failed`) and still
 * within its retention, with ONE plain SELECT outside any transaction (autocommit: no
 * transaction id, no row lock, no WAL flush). `undefined` means "go through the claim": no record,
 * an expired one, a `processing` or `uncertain` one, or one that is not committed yet.
 *
 * Why it is safe: a terminal record within its retention is immutable until it expires. Nothing
 * changes it: the claims take over only an expired terminal record (or, in lease mode, an expired
 * lease of a `processing` one), completion, renewal and reconciliation update only `processing`
 * or `uncertain` records, and cleanup deletes only expired records. So what this read returns is
 * exactly what the claim would have read after locking the row.
 *
 * Expiry rule: `expires_at > now()` is decided by the database clock at this read. A record that
 * expires between this read and the reply is still replayed (or answered 422): it was valid when
 * read, as if the request had arrived a moment earlier. Retention is therefore "replayed at least
 * until `expires_at`"; the first request read after it starts a new execution.
 */
export async function lookupTerminalRecord(db: Queryable, record: RecordRef): Promise<StoredRecord | undefined> {
  const statement = lookupStatement(record.table);
  const { rows } = await db.query<RecordRow>(statement.text, scopeValues(record.scope), statement);
  return rows[0] === undefined ? undefined : storedRecordOf(rows[0]);
}

/** A statement's text and the stable name under which node-postgres prepares it per connection. */
interface NamedStatement {
  readonly text: string;
  readonly name: string;
}

/**
 * Names a hot-path statement of `table` (once per table and statement): the name is derived from
 * the text, so one name always goes with one text, as node-postgres requires. With a `pg` client,
 * a named statement is parsed and planned once per connection instead of once per request (the
 * read-first SELECT of every replay, the completion of every new key); drizzle ignores the name.
 * After a session reset on the connection (a pool that runs `DISCARD ALL` on release) it is parsed
 * again, never assumed (src/prepared-statements.ts). Behind PgBouncer in transaction
 * mode this needs PgBouncer 1.21 or later with `max_prepared_statements` set (as `enqueue()`).
 */
function namedStatement(
  cache: Map<string, NamedStatement>,
  table: string,
  build: (t: string) => string,
): NamedStatement {
  let statement = cache.get(table);
  if (statement === undefined) {
    const text = build(table);
    const name = `outboxkit_idem_${createHash('sha1').update(text).digest('hex').slice(0, 16)}`;
    statement = Object.freeze({ text, name });
    cache.set(table, statement);
  }
  return statement;
}

const lookupStatements = new Map<string, NamedStatement>();
const completeStatements = new Map<string, NamedStatement>();

function lookupStatement(table: string): NamedStatement {
  return namedStatement(
    lookupStatements,
    table,
    (t) => `SELECT state, fingerprint, fingerprint_version, response_status, response_headers, response_body
       FROM ${t}
      WHERE tenant = $1 AND operation = $2 AND key = $3
        AND state IN ('completed', 'failed') AND expires_at > now()`,
  );
}

/** The record a {@link RecordRow} holds. */
export function storedRecordOf(r: RecordRow): StoredRecord {
  return {
    state: r.state,
    fingerprint: r.fingerprint,
    fingerprintVersion: r.fingerprint_version,
    responseStatus: r.response_status,
    responseHeaders: r.response_headers,
    responseBody: r.response_body,
  };
}

/** The stored outcome of an execution, and how long it is kept. */
export interface Completion {
  state: Extract<IdempotencyState, 'completed' | 'failed'>;
  status: number;
  headers: Record<string, string>;
  body: Buffer;
  /** How long the record is kept and replayed, in ms, counted from completion. */
  retentionMs: number;
}

/**
 * What is stored of `response` as a record in `state`: its status, its headers that
 * `replayHeaders` allows, its body, and the retention (both from the resolved options).
 */
export function completionOf(
  response: IdempotentResponse,
  state: Completion['state'],
  opts: { readonly replayHeaders: ReadonlySet<string>; readonly retentionMs: number },
): Completion {
  return {
    state,
    status: response.status,
    headers: headersToStore(response.headers, opts.replayHeaders),
    body: response.body,
    retentionMs: opts.retentionMs,
  };
}

/**
 * The values `$1` to `$9` of a statement that stores `completion` on a record fenced by its owner
 * token ({@link completeKey}, and lease mode's): tenant, operation, key, owner token, state,
 * status, headers (JSON), body, retention (ms).
 */
export function completionValues(record: OwnedRecord, completion: Completion): unknown[] {
  return [
    ...ownedValues(record),
    completion.state,
    completion.status,
    JSON.stringify(completion.headers),
    completion.body,
    completion.retentionMs,
  ];
}

/**
 * Stores the result and moves the record from `processing` to `completed`/`failed`, in the
 * request's transaction, so that it commits with the business rows (docs/guarantees.md, G2).
 *
 * Fenced by the owner token: it updates zero rows when the record is no longer this execution's
 * (lease mode: a takeover issued a new token). The retention is counted from completion.
 *
 * @returns whether the record was updated (false: ownership lost).
 */
export async function completeKey(db: Queryable, record: OwnedRecord, completion: Completion): Promise<boolean> {
  const statement = namedStatement(
    completeStatements,
    record.table,
    (t) => `UPDATE ${t}
        SET state = $5,
            response_status = $6::smallint,
            response_headers = $7::jsonb,
            response_body = $8::bytea,
            completed_at = clock_timestamp(),
            updated_at = clock_timestamp(),
            expires_at = clock_timestamp() + $9::bigint * interval '1 millisecond'
      WHERE tenant = $1 AND operation = $2 AND key = $3
        AND state = 'processing' AND owner_token = $4::uuid`,
  );
  const { rowCount } = await db.query(statement.text, completionValues(record, completion), statement);
  return rowCount === 1;
}

/**
 * Deletes up to `limit` expired terminal records and returns how many it deleted.
 *
 * - Only `completed`/`failed` records: a `processing` or `uncertain` record is never deleted for
 *   its age (an old one raises an alert, not a delete).
 * - `FOR UPDATE SKIP LOCKED`: a record that a request is taking over right now is skipped instead
 *   of waited for, and several cleaners never block each other.
 * - Bounded batches keep each transaction (and its WAL and locks) small.
 * - Ordered by `expires_at` so the index `idempotency_keys_expires_idx` serves the scan.
 */
export async function deleteExpiredKeys(db: Queryable, table: string, limit: number): Promise<number> {
  const { rowCount } = await db.query(
    `DELETE FROM ${table} d
      USING (SELECT tenant, operation, key FROM ${table}
              WHERE expires_at <= now() AND state IN ('completed', 'failed')
              ORDER BY expires_at
              LIMIT $1
              FOR UPDATE SKIP LOCKED) e
      WHERE d.tenant = e.tenant AND d.operation = e.operation AND d.key = e.key`,
    [limit],
  );
  return rowCount;
}

/** A record as the operator listing shows it: never the full key. */
export interface KeyListing {
  tenant: string;
  operation: string;
  /** The key redacted by `redactKey()`. */
  key: string;
  /**
   * The record's stored public id (lease mode), to find the record again without the key; `null`
   * for a record of one-transaction mode.
   */
  operationId: string | null;
  state: IdempotencyState;
  generation: number;
  responseStatus: number | null;
  createdAt: Date;
  updatedAt: Date;
  leaseExpiresAt: Date | null;
  expiresAt: Date;
  ageSeconds: number;
}

/** Filters of {@link listKeys}. */
export interface KeyFilter {
  state: IdempotencyState;
  tenant?: string | undefined;
  operation?: string | undefined;
  limit: number;
}

/**
 * Lists records of one state, oldest first (the stuck ones an operator looks for). The primary
 * key serves the tenant/operation filters; a full scan otherwise, bounded by `limit`. Returns full
 * keys: the caller redacts them before printing.
 */
export async function listKeys(
  db: Queryable,
  table: string,
  filter: KeyFilter,
): Promise<(Omit<KeyListing, 'key'> & { fullKey: string })[]> {
  // Filters come from operators (CLI flags): refused before any SQL when PostgreSQL text cannot
  // hold them (a NUL character) or they could not match anything stored.
  for (const [name, value, max] of [
    ['tenant', filter.tenant, MAX_TENANT_BYTES],
    ['operation', filter.operation, MAX_OPERATION_BYTES],
  ] as const) {
    const problem = value === undefined ? undefined : textProblem(value, max);
    if (problem !== undefined) throw new InvalidOptionsError(`The ${name} filter ${problem}.`);
  }
  const { rows } = await db
    .query<{
      tenant: string;
      operation: string;
      key: string;
      operation_id: string | null;
      state: IdempotencyState;
      generation: number;
      response_status: number | null;
      created_at: Date;
      updated_at: Date;
      lease_expires_at: Date | null;
      expires_at: Date;
      age_seconds: number;
    }>(
      `SELECT tenant, operation, key, operation_id, state, generation, response_status, created_at, updated_at, lease_expires_at,
            expires_at, extract(epoch FROM clock_timestamp() - created_at)::float8 AS age_seconds
       FROM ${table}
      WHERE state = $1 AND ($2::text IS NULL OR tenant = $2) AND ($3::text IS NULL OR operation = $3)
      ORDER BY created_at
      LIMIT $4`,
      [filter.state, filter.tenant ?? null, filter.operation ?? null, filter.limit],
    )
    .catch((err: unknown) => {
      throw toSchemaMissing(err, schemaOfTable(table));
    });
  return rows.map((r) => ({
    tenant: r.tenant,
    operation: r.operation,
    fullKey: r.key,
    operationId: r.operation_id,
    state: r.state,
    generation: r.generation,
    responseStatus: r.response_status,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    leaseExpiresAt: r.lease_expires_at,
    expiresAt: r.expires_at,
    ageSeconds: r.age_seconds,
  }));
}
