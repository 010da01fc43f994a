/**
 * The relay's SQL: the home of its statements on `relay_lanes`, `relay_instances` and
 * `outbox_events` (after the writer's INSERT, src/outbox/sql.ts). One builder per statement
 * (`xxxSql(schema, params)` returning `{ text, values }`, and `name` for the prepared ones), each
 * with the reason for its concurrency choice, and the function that runs it. `schema` is quoted
 * (from `quoteSchema()`). All run on a pool in autocommit mode (each statement its own
 * transaction). Each run throws `SchemaMissingError` (code `OUTBOXKIT_SCHEMA_MISSING`, naming the
 * schema) when outboxkit's schema or tables do not exist: run `outboxkit migrate --schema <schema>`
 * (or `migrate()`) first.
 */
import type { Queryable, QueryResult } from '../src/database.js';
import { EVENT_ID_REUSE_WINDOW_MS, KEY_LOCK_HASH_SEED, OUTBOX_LANES } from '../src/constants.js';
import { schemaMissingOr } from '../src/errors.js';
import { statementName, type SqlStatement } from '../src/postgres.js';
import type { BlockedPartition } from './partitions.js';
import type { OutboxRecordRow } from './record.js';

// The read and the mark of every pass are named prepared statements (statementName()): PostgreSQL
// skips the parse and, once it settles on a generic plan, the planning (about 0.5 ms of the
// server's CPU per read; the read's round trip on an idle database went from 1.2-1.3 ms to
// 0.4-0.5 ms). The generic plan of the read has the same shape as the custom one (the pending
// index in seq order, the blocked index), and PostgreSQL keeps planning each execution when a
// generic plan would cost more (a large backlog). After a session reset on the connection (an
// application pool given as `pool` that runs DISCARD ALL on release) they are parsed again, never
// assumed (src/prepared-statements.ts).

/**
 * Runs one of this file's statements on `schema` (quoted, from `quoteSchema()`). Every statement
 * goes through here, so that a schema or table that does not exist (SQLSTATE 42P01 or 3F000: never
 * migrated, or the wrong `schema`) is reported as `SchemaMissingError` naming the schema, by the
 * relay and by the operator functions (`backlog()`, `laneOwners()`, `releaseOwner()`, the parked
 * operations) alike, instead of the driver's raw error. Any other error is thrown unchanged.
 */
async function run<R = Record<string, unknown>>(
  db: Queryable,
  schema: string,
  statement: SqlStatement,
): Promise<QueryResult<R>> {
  const { text, values, name } = statement;
  try {
    return await (name === undefined ? db.query<R>(text, values) : db.query<R>(text, values, { name }));
  } catch (err) {
    throw schemaMissingOr(err, unquoted(schema));
  }
}

/** Where the relay's own statements run: its pool, its schema (quoted) and its id. */
export interface RelayScope {
  db: Queryable;
  schema: string;
  relayId: string;
}

/** The schema's name as the user gives it (`"outboxkit"` → `outboxkit`), for messages. */
function unquoted(schema: string): string {
  return /^"(.+)"$/.exec(schema)?.[1] ?? schema;
}

/** A pending outbox row as the relay reads it. */
export interface PendingRow {
  seq: string;
  event_id: string;
  topic: string;
  key: string | null;
  lane: number;
  type: string;
  payload: Buffer;
  headers: Record<string, string>;
  attempts: number;
  /**
   * Rows the read found before its byte bound (at most `maxRows`): more than the rows returned, or
   * `maxRows` itself, means more rows may be pending now.
   */
  page_rows: number;
}

/** A lane this instance holds, with the fencing token of that ownership. */
export interface HeldLane {
  lane: number;
  token: string;
}

/** Creates the lane rows once; concurrent relays may run it at once (ON CONFLICT DO NOTHING). */
export function seedLanesSql(schema: string): SqlStatement {
  return {
    text: `INSERT INTO ${schema}.relay_lanes (lane) SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING`,
    values: [OUTBOX_LANES],
  };
}

/** Runs {@link seedLanesSql}. */
export async function seedLanes(db: Queryable, schema: string): Promise<void> {
  await run(db, schema, seedLanesSql(schema));
}

/**
 * Renews the leases of the lanes this relay holds and returns those it still holds. A lane whose
 * token changed was taken over after our lease expired: it is not returned, and its rows are left
 * to the new owner. Lease times come from the database clock, never this process's.
 */
export function renewLanesSql(
  schema: string,
  p: { relayId: string; held: readonly HeldLane[]; leaseMs: number },
): SqlStatement {
  return {
    text: `UPDATE ${schema}.relay_lanes l
        SET lease_expires_at = now() + make_interval(secs => $2::double precision / 1000)
       FROM unnest($3::smallint[], $4::bigint[]) AS h(lane, token)
      WHERE l.lane = h.lane AND l.fencing_token = h.token AND l.owner_id = $1
      RETURNING l.lane, l.fencing_token::text AS token`,
    values: [p.relayId, p.leaseMs, p.held.map((h) => h.lane), p.held.map((h) => h.token)],
  };
}

/** Runs {@link renewLanesSql}: the lanes still held. */
export async function renewLanes(scope: RelayScope, held: readonly HeldLane[], leaseMs: number): Promise<HeldLane[]> {
  if (held.length === 0) return [];
  const { rows } = await run<HeldLane>(
    scope.db,
    scope.schema,
    renewLanesSql(scope.schema, { relayId: scope.relayId, held, leaseMs }),
  );
  return rows;
}

/**
 * Most blocked topic-partitions a relay writes into `relay_instances.blocked_partitions` at each
 * heartbeat (those holding back the most keys first), so that a large outage (a broker with
 * thousands of partitions) never makes every heartbeat write a large row. The relay's gauges
 * (relay/metrics.ts) count them all.
 */
export const PUBLISHED_BLOCKED_PARTITIONS_MAX = 200;

/**
 * Registers this relay (or renews its liveness lease) and returns how many relays are live,
 * itself included, so each can take a fair share of the lanes, even relays that hold none yet.
 * It also writes the topic-partitions the relay finds unable to take writes
 * (`blocked_partitions`: NULL when none, else at most {@link PUBLISHED_BLOCKED_PARTITIONS_MAX}
 * of them), for `outboxkit status`.
 */
export function heartbeatSql(
  schema: string,
  p: {
    relayId: string;
    hostname: string;
    pid: number;
    leaseMs: number;
    blockedPartitions: readonly BlockedPartition[];
  },
): SqlStatement {
  return {
    text: `WITH me AS (
       INSERT INTO ${schema}.relay_instances (relay_id, hostname, pid, lease_expires_at, blocked_partitions)
       VALUES ($1, $2, $3, now() + make_interval(secs => $4::double precision / 1000), $5::jsonb)
       ON CONFLICT (relay_id) DO UPDATE
         SET lease_expires_at = EXCLUDED.lease_expires_at, blocked_partitions = EXCLUDED.blocked_partitions
       RETURNING relay_id)
     SELECT 1 + count(*)::int AS n FROM ${schema}.relay_instances
      WHERE lease_expires_at > now() AND relay_id <> (SELECT relay_id FROM me)`,
    values: [p.relayId, p.hostname, p.pid, p.leaseMs, publishedBlockedPartitions(p.blockedPartitions)],
  };
}

/** The JSON text of `blocked` as the heartbeat writes it (see {@link heartbeatSql}), or null when empty. */
function publishedBlockedPartitions(blocked: readonly BlockedPartition[]): string | null {
  if (blocked.length === 0) return null;
  const listed = [...blocked]
    .sort((a, b) => b.keys - a.keys || a.topic.localeCompare(b.topic) || a.partition - b.partition)
    .slice(0, PUBLISHED_BLOCKED_PARTITIONS_MAX)
    .map(({ topic, partition, reason, keys, since }) => ({ topic, partition, reason, keys, since }));
  return JSON.stringify(listed);
}

/**
 * Runs {@link heartbeatSql}: the number of live relays, this one included.
 *
 * @param p.blockedPartitions - the relay's `blockedPartitions()` now.
 */
export async function heartbeatInstance(
  scope: RelayScope,
  p: { hostname: string; pid: number; leaseMs: number; blockedPartitions: readonly BlockedPartition[] },
): Promise<number> {
  const { rows } = await run<{ n: number }>(
    scope.db,
    scope.schema,
    heartbeatSql(scope.schema, { relayId: scope.relayId, ...p }),
  );
  return rows[0]?.n ?? 1;
}

/** Removes a relay's registration (graceful stop, or the operator's release). */
export function deregisterSql(schema: string, relayId: string): SqlStatement {
  return { text: `DELETE FROM ${schema}.relay_instances WHERE relay_id = $1`, values: [relayId] };
}

/** Runs {@link deregisterSql}. */
export async function deregisterInstance(db: Queryable, schema: string, relayId: string): Promise<void> {
  await run(db, schema, deregisterSql(schema, relayId));
}

/**
 * Operator action: frees every lane of `relayId`, so live relays take its lanes at their next
 * heartbeat instead of waiting for the lease to expire. Bumping the fencing token makes sure that
 * relay, if it is in fact alive, can no longer mark rows.
 */
export function releaseOwnerSql(schema: string, relayId: string): SqlStatement {
  return {
    text: `UPDATE ${schema}.relay_lanes SET owner_id = NULL, lease_expires_at = NULL, fencing_token = fencing_token + 1
      WHERE owner_id = $1`,
    values: [relayId],
  };
}

/**
 * Operator action ({@link releaseOwnerSql}), and removes the relay's registration.
 *
 * @returns the number of lanes freed.
 */
export async function releaseOwner(db: Queryable, schema: string, relayId: string): Promise<number> {
  const { rowCount } = await run(db, schema, releaseOwnerSql(schema, relayId));
  await deregisterInstance(db, schema, relayId);
  return rowCount;
}

/** A live relay (its liveness lease has not expired) and the topic-partitions it reported blocked. */
export interface LiveRelay {
  relayId: string;
  hostname: string;
  pid: number;
  /**
   * What the relay wrote at its last heartbeat (see {@link heartbeatSql}), at most
   * {@link PUBLISHED_BLOCKED_PARTITIONS_MAX}, most keys first; empty when none. Entries that do
   * not have the expected shape are left out.
   */
  blockedPartitions: BlockedPartition[];
}

/**
 * The live relays (liveness lease not expired, database clock), by id, for `outboxkit status`: a
 * relay that stopped, stood down or died is not live (its blocked partitions no longer hold any
 * of its lanes' events back).
 */
export function liveRelaysSql(schema: string): SqlStatement {
  return {
    text: `SELECT relay_id, hostname, pid, blocked_partitions FROM ${schema}.relay_instances
      WHERE lease_expires_at > now() ORDER BY relay_id`,
    values: [],
  };
}

/** Runs {@link liveRelaysSql}. */
export async function liveRelays(db: Queryable, schema: string): Promise<LiveRelay[]> {
  const { rows } = await run<{ relay_id: string; hostname: string; pid: number; blocked_partitions: unknown }>(
    db,
    schema,
    liveRelaysSql(schema),
  );
  return rows.map((r) => ({
    relayId: r.relay_id,
    hostname: r.hostname,
    pid: r.pid,
    blockedPartitions: blockedPartitionsOf(r.blocked_partitions),
  }));
}

/**
 * The entries of a `blocked_partitions` value that have the shape the relay writes, at most
 * {@link PUBLISHED_BLOCKED_PARTITIONS_MAX}: the column is only as trustworthy as whoever can
 * write the table.
 */
function blockedPartitionsOf(value: unknown): BlockedPartition[] {
  if (!Array.isArray(value)) return [];
  const out: BlockedPartition[] = [];
  for (const e of value.slice(0, PUBLISHED_BLOCKED_PARTITIONS_MAX) as unknown[]) {
    if (typeof e !== 'object' || e === null) continue;
    const { topic, partition, reason, keys, since } = e as Record<string, unknown>;
    if (
      typeof topic === 'string' &&
      Number.isSafeInteger(partition) &&
      typeof reason === 'string' &&
      Number.isSafeInteger(keys) &&
      Number.isSafeInteger(since)
    ) {
      out.push({ topic, partition: partition as number, reason, keys: keys as number, since: since as number });
    }
  }
  return out;
}

/** Lane owners, for `outboxkit status`. */
export function laneOwnersSql(schema: string): SqlStatement {
  return {
    text: `SELECT owner_id, count(*)::int AS lanes, coalesce(bool_and(lease_expires_at > now()), false) AS live
       FROM ${schema}.relay_lanes GROUP BY owner_id ORDER BY owner_id NULLS LAST`,
    values: [],
  };
}

/** Runs {@link laneOwnersSql}. */
export async function laneOwners(
  db: Queryable,
  schema: string,
): Promise<{ owner_id: string | null; lanes: number; live: boolean }[]> {
  const { rows } = await run<{ owner_id: string | null; lanes: number; live: boolean }>(
    db,
    schema,
    laneOwnersSql(schema),
  );
  return rows;
}

/**
 * Takes up to `limit` lanes that are free or whose lease expired. Taking a lane increments its
 * fencing token, so a previous owner that is merely paused can no longer mark rows of it.
 * SKIP LOCKED: two relays acquiring at once take different lanes instead of waiting on each other.
 */
export function acquireLanesSql(schema: string, p: { relayId: string; limit: number; leaseMs: number }): SqlStatement {
  return {
    text: `UPDATE ${schema}.relay_lanes l
        SET owner_id = $1,
            fencing_token = l.fencing_token + 1,
            lease_expires_at = now() + make_interval(secs => $3::double precision / 1000)
      WHERE l.lane IN (
              SELECT lane FROM ${schema}.relay_lanes
               WHERE owner_id IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= now()
               ORDER BY lane
               LIMIT $2
               FOR UPDATE SKIP LOCKED)
      RETURNING l.lane, l.fencing_token::text AS token`,
    values: [p.relayId, p.limit, p.leaseMs],
  };
}

/** Runs {@link acquireLanesSql}: the lanes taken, with their new tokens. */
export async function acquireLanes(scope: RelayScope, limit: number, leaseMs: number): Promise<HeldLane[]> {
  if (limit <= 0) return [];
  const { rows } = await run<HeldLane>(
    scope.db,
    scope.schema,
    acquireLanesSql(scope.schema, { relayId: scope.relayId, limit, leaseMs }),
  );
  return rows;
}

/** Gives lanes back (rebalance or shutdown) so another relay can take them at once. */
export function releaseLanesSql(schema: string, p: { relayId: string; lanes: readonly number[] }): SqlStatement {
  return {
    text: `UPDATE ${schema}.relay_lanes SET owner_id = NULL, lease_expires_at = NULL
      WHERE owner_id = $1 AND lane = ANY($2::smallint[])`,
    values: [p.relayId, p.lanes],
  };
}

/** Runs {@link releaseLanesSql}. */
export async function releaseLanes(scope: RelayScope, lanes: readonly number[]): Promise<void> {
  if (lanes.length === 0) return;
  await run(scope.db, scope.schema, releaseLanesSql(scope.schema, { relayId: scope.relayId, lanes }));
}

/** What {@link readPendingSql} reads. */
export interface ReadPendingParams {
  /** The lanes whose rows are read. */
  lanes: readonly number[];
  /** Most rows read. */
  maxRows: number;
  /** Most payload bytes read, in bytes (the first row always comes). */
  maxBytes: number;
  /** Whether a row in backoff or parked holds back the later rows of its key. @defaultValue true */
  holdKeys?: boolean;
  /** Seqs skipped by this read (a batch in flight). @defaultValue none */
  exclude?: readonly string[];
  /** Keys whose rows are skipped: they wait for a partition that cannot take writes (relay/partitions.ts). @defaultValue none */
  waitingKeys?: readonly string[];
  /** Topics whose rows without a key are skipped: none of their partitions can take writes. @defaultValue none */
  closedTopics?: readonly string[];
}

/**
 * Reads the next pending rows of the given lanes in seq order, bounded by a row count and by the
 * sum of payload bytes (the first row always comes, so one large event cannot stall a lane).
 *
 * Why there is no high-water mark: seq values are drawn before commit, so a row with a smaller seq
 * can become visible after a larger one was read (test/relay/relay.test.ts, "rows whose transactions commit late"). Every pass
 * reads all pending rows again from the index instead; rows of one key still come in commit order
 * because the writer locks the key before drawing seq. Only committed rows are visible to this
 * autocommit statement.
 *
 * Held-back keys: a row in backoff or parked holds back the later rows of its key when
 * `holdKeys` is true (strict per-key order); rows without a key are never held back.
 *
 * `exclude`: seqs of a batch being sent right now (read ahead while it is in flight; its rows are
 * still pending until marked). Excluded rows are skipped for this read only, never for later ones.
 *
 * `waitingKeys` and `closedTopics`: rows that wait for a topic-partition that cannot take writes
 * (relay/partitions.ts) are skipped, so that a backlog of them never fills a pass and starves the
 * partitions that can.
 *
 * A named prepared statement (see the note on prepared statements at the top of this file).
 */
export function readPendingSql(schema: string, p: ReadPendingParams): SqlStatement {
  const text = `WITH blocked AS (
       SELECT key, min(seq) AS seq FROM ${schema}.outbox_events
        WHERE $4::boolean AND lane = ANY($1::smallint[]) AND key IS NOT NULL AND published_at IS NULL
          AND (parked_at IS NOT NULL OR next_attempt_at > now())
        GROUP BY key),
     page AS (
       SELECT e.seq, e.payload FROM ${schema}.outbox_events e
        WHERE e.lane = ANY($1::smallint[]) AND e.published_at IS NULL AND e.parked_at IS NULL
          AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= now())
          AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.key = e.key AND b.seq < e.seq)
          AND e.seq <> ALL($5::bigint[])
          AND (e.key IS NULL OR e.key <> ALL($6::text[]))
          AND (e.key IS NOT NULL OR e.topic <> ALL($7::text[]))
        ORDER BY e.seq LIMIT $2),
     w AS (
       SELECT seq, sum(octet_length(payload)) OVER (ORDER BY seq) AS bytes, row_number() OVER (ORDER BY seq) AS n
         FROM page)
     SELECT e.seq::text AS seq, e.event_id, e.topic, e.key, e.lane, e.type, e.payload, e.headers, e.attempts,
            (SELECT count(*) FROM w)::int AS page_rows
       FROM w JOIN ${schema}.outbox_events e ON e.seq = w.seq
      WHERE w.bytes <= $3 OR w.n = 1
      ORDER BY e.seq`;
  return {
    text,
    values: [
      p.lanes,
      p.maxRows,
      p.maxBytes,
      p.holdKeys ?? true,
      p.exclude ?? [],
      p.waitingKeys ?? [],
      p.closedTopics ?? [],
    ],
    name: statementName('relay_read', text),
  };
}

/** Runs {@link readPendingSql}. */
export async function readPending(db: Queryable, schema: string, p: ReadPendingParams): Promise<PendingRow[]> {
  if (p.lanes.length === 0) return [];
  const { rows } = await run<PendingRow>(db, schema, readPendingSql(schema, p));
  return rows;
}

/** A failed publication of one row, for {@link recordFailureSql}. */
export interface FailureRecord {
  /** The row and its lane. */
  row: { seq: string; lane: number };
  /** The fencing token the row was read under. */
  token: string;
  /** The error, cut to 2,000 characters in the table. */
  error: string;
  /** Delay before its next attempt, in ms. */
  backoffMs: number;
  /** Attempts after which it is parked. */
  maxAttempts: number;
}

/**
 * Records a failed publication of one row: its attempt count and error, and either the time of
 * its next attempt (exponential backoff) or, after `maxAttempts`, the time it was parked. Fenced
 * like {@link markPublishedSql}.
 */
export function recordFailureSql(schema: string, relayId: string, f: FailureRecord): SqlStatement {
  return {
    text: `UPDATE ${schema}.outbox_events e
        SET attempts = e.attempts + 1,
            last_error = left($4, 2000),
            next_attempt_at = now() + make_interval(secs => $5::double precision / 1000),
            parked_at = CASE WHEN e.attempts + 1 >= $6 THEN now() END
       FROM ${schema}.relay_lanes l
      WHERE e.seq = $2::bigint AND e.published_at IS NULL
        AND l.lane = e.lane AND l.owner_id = $1 AND l.fencing_token = $3::bigint
      RETURNING e.parked_at IS NOT NULL AS parked`,
    values: [relayId, f.row.seq, f.token, f.error, f.backoffMs, f.maxAttempts],
  };
}

/**
 * Runs {@link recordFailureSql}.
 *
 * @returns true when the row was parked by this call.
 */
export async function recordFailure(scope: RelayScope, f: FailureRecord): Promise<boolean> {
  const { rows } = await run<{ parked: boolean }>(
    scope.db,
    scope.schema,
    recordFailureSql(scope.schema, scope.relayId, f),
  );
  return rows[0]?.parked ?? false;
}

/** A parked event, for `outboxkit parked list`. */
export interface ParkedRow {
  seq: string;
  event_id: string;
  topic: string;
  key: string | null;
  type: string;
  attempts: number;
  last_error: string | null;
  parked_at: Date;
  /** Payload bytes. */
  bytes: number;
  /** Bytes of the stored header names and values (the relay adds `event-id` and `event-type`). */
  header_bytes: number;
}

/**
 * Lists parked events, oldest first: by the column `e.seq` (a bigint), not the output column `seq`
 * (its text), which sorted seq 10 before 9.
 */
export function listParkedSql(schema: string, limit: number): SqlStatement {
  return {
    text: `SELECT seq::text AS seq, event_id, topic, key, type, attempts, last_error, parked_at, octet_length(payload) AS bytes,
            (SELECT coalesce(sum(octet_length(h.key) + octet_length(h.value)), 0)::int FROM jsonb_each_text(headers) AS h) AS header_bytes
       FROM ${schema}.outbox_events e WHERE published_at IS NULL AND parked_at IS NOT NULL
      ORDER BY e.seq LIMIT $1`,
    values: [limit],
  };
}

/** Runs {@link listParkedSql}. */
export async function listParked(db: Queryable, schema: string, limit = 100): Promise<ParkedRow[]> {
  const { rows } = await run<ParkedRow>(db, schema, listParkedSql(schema, limit));
  return rows;
}

/**
 * Puts parked events back in line (attempts reset). `next_attempt_at = now()` marks the operator's
 * retry: due at once for the table relay (as a row whose backoff just ended), and what the WAL
 * relay walks from the table ({@link readHeldSql}): its stream brought the row's insert long ago,
 * and an `UPDATE` is not streamed.
 */
export function retryParkedSql(schema: string, eventIds: readonly string[] | 'all'): SqlStatement {
  return {
    text: `UPDATE ${schema}.outbox_events
        SET parked_at = NULL, next_attempt_at = now(), attempts = 0
      WHERE published_at IS NULL AND parked_at IS NOT NULL AND ($1::boolean OR event_id = ANY($2::uuid[]))`,
    values: [eventIds === 'all', eventIds === 'all' ? [] : eventIds],
  };
}

/** Runs {@link retryParkedSql}. @returns how many. */
export async function retryParked(db: Queryable, schema: string, eventIds: readonly string[] | 'all'): Promise<number> {
  const { rowCount } = await run(db, schema, retryParkedSql(schema, eventIds));
  return rowCount;
}

/**
 * Gives up on parked events: they are marked published without being sent (the row stays, with
 * its error, until retention deletes it), which lets the later events of their keys go on.
 */
export function skipParkedSql(schema: string, eventIds: readonly string[]): SqlStatement {
  return {
    text: `UPDATE ${schema}.outbox_events
        SET published_at = now(), last_error = coalesce(last_error, '') || ' [skipped by operator]'
      WHERE published_at IS NULL AND parked_at IS NOT NULL AND event_id = ANY($1::uuid[])`,
    values: [eventIds],
  };
}

/** Runs {@link skipParkedSql}. @returns how many. */
export async function skipParked(db: Queryable, schema: string, eventIds: readonly string[]): Promise<number> {
  const { rowCount } = await run(db, schema, skipParkedSql(schema, eventIds));
  return rowCount;
}

/**
 * Deletes published rows older than the retention (`retentionMs`, ms), at most `batchSize` per
 * statement (bounded lock time and WAL per statement). SKIP LOCKED: rows another relay is
 * deleting are left to it.
 *
 * A row is kept at least {@link EVENT_ID_REUSE_WINDOW_MS} (65 min) after it was published, whatever
 * `retentionMs` says: the writer accepts an explicit event id only within that window of the id's
 * own timestamp (src/outbox/event.ts), and the row was published after the id was made, so a
 * second event with the same id meets this row's unique constraint instead of being published and
 * skipped as a duplicate by every consumer that applied the first.
 *
 * The same statement deletes the writers' key-lock rows (`outbox_key_locks`) of the deleted rows'
 * keys, so that table holds about the keys written within the retention window. A key-lock row
 * that a writer holds now is skipped (SKIP LOCKED: the writer is not waited for, nor made to
 * wait); deleting one that no transaction holds never weakens per-key order, since a lock orders
 * only transactions open at the same time (the next writer of the key creates the row again).
 */
export function deletePublishedSql(schema: string, p: { retentionMs: number; batchSize: number }): SqlStatement {
  return {
    text: `WITH gone AS (
       DELETE FROM ${schema}.outbox_events WHERE seq IN (
         SELECT seq FROM ${schema}.outbox_events
          WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1::double precision / 1000)
          ORDER BY published_at LIMIT $2
          FOR UPDATE SKIP LOCKED)
       RETURNING key),
     unlocked AS (
       DELETE FROM ${schema}.outbox_key_locks WHERE key_hash IN (
         SELECT key_hash FROM ${schema}.outbox_key_locks
          WHERE key_hash IN (SELECT hashtextextended(key, ${KEY_LOCK_HASH_SEED}) FROM gone WHERE key IS NOT NULL)
          FOR UPDATE SKIP LOCKED))
     SELECT count(*)::int AS deleted FROM gone`,
    values: [Math.max(p.retentionMs, EVENT_ID_REUSE_WINDOW_MS), p.batchSize],
  };
}

/** Runs {@link deletePublishedSql}. @returns how many were deleted. */
export async function deletePublished(
  db: Queryable,
  schema: string,
  p: { retentionMs: number; batchSize: number },
): Promise<number> {
  const { rows } = await run<{ deleted: number }>(db, schema, deletePublishedSql(schema, p));
  return rows[0]?.deleted ?? 0;
}

/**
 * Marks exactly the rows the broker acknowledged as published, and only while this relay still
 * holds their lane with the same fencing token: a relay that lost its lane marks nothing (its
 * rows are republished by the new owner: a duplicate, never a loss). A named prepared statement.
 */
export function markPublishedSql(
  schema: string,
  p: { relayId: string; seqs: readonly string[]; held: readonly HeldLane[] },
): SqlStatement {
  const text = `UPDATE ${schema}.outbox_events e
        SET published_at = now()
       FROM ${schema}.relay_lanes l
       JOIN unnest($3::smallint[], $4::bigint[]) AS h(lane, token) ON h.lane = l.lane
      WHERE e.seq = ANY($2::bigint[]) AND e.published_at IS NULL
        AND l.lane = e.lane AND l.owner_id = $1 AND l.fencing_token = h.token`;
  return {
    text,
    values: [p.relayId, p.seqs, p.held.map((h) => h.lane), p.held.map((h) => h.token)],
    name: statementName('relay_mark', text),
  };
}

/** Runs {@link markPublishedSql}. @returns the number of rows marked. */
export async function markPublished(
  scope: RelayScope,
  seqs: readonly string[],
  held: readonly HeldLane[],
): Promise<number> {
  if (seqs.length === 0) return 0;
  const { rowCount } = await run(
    scope.db,
    scope.schema,
    markPublishedSql(scope.schema, { relayId: scope.relayId, seqs, held }),
  );
  return rowCount;
}

/** Backlog figures for metrics and `outboxkit status`. */
export function backlogSql(schema: string): SqlStatement {
  return {
    text: `SELECT count(*) FILTER (WHERE parked_at IS NULL) AS pending,
            count(*) FILTER (WHERE parked_at IS NOT NULL) AS parked,
            (extract(epoch FROM now() - min(created_at) FILTER (WHERE parked_at IS NULL)) * 1000)::float8 AS oldest_ms
       FROM ${schema}.outbox_events WHERE published_at IS NULL`,
    values: [],
  };
}

/** Runs {@link backlogSql}. */
export async function backlog(
  db: Queryable,
  schema: string,
): Promise<{ pending: number; parked: number; oldestPendingMs: number }> {
  const { rows } = await run<{ pending: string; parked: string; oldest_ms: number | null }>(
    db,
    schema,
    backlogSql(schema),
  );
  const r = rows[0];
  return { pending: Number(r?.pending ?? 0), parked: Number(r?.parked ?? 0), oldestPendingMs: r?.oldest_ms ?? 0 };
}

/**
 * Pending (not parked) events of `keys` in `lanes`, counted per key: the events that wait for a
 * blocked topic-partition (relay/partitions.ts), for the relay's gauge.
 */
export async function pendingByKey(
  db: Queryable,
  schema: string,
  lanes: readonly number[],
  keys: readonly string[],
): Promise<Map<string, number>> {
  if (lanes.length === 0 || keys.length === 0) return new Map();
  const { rows } = await db.query<{ key: string; n: number }>(
    `SELECT key, count(*)::int AS n FROM ${schema}.outbox_events
      WHERE lane = ANY($1::smallint[]) AND key = ANY($2::text[]) AND published_at IS NULL AND parked_at IS NULL
      GROUP BY key`,
    [lanes, keys],
  );
  return new Map(rows.map((r) => [r.key, r.n]));
}

/**
 * Deletes the rows the WAL relay published (relay/wal/wal-relay.ts), one statement per batch: the
 * row is only the durable copy of an event that the replication stream carries, so once Kafka
 * acknowledged the event nothing needs it. Run after the acknowledgement and before the slot is
 * confirmed past the rows' transactions: a crash in between redelivers the transactions from the
 * stream and republishes them (at least once; the delete of a row already gone deletes nothing).
 * No marking, no retention: the WAL source keeps no published rows.
 */
export function deleteRelayedSql(schema: string, seqs: readonly string[]): SqlStatement {
  return {
    text: `DELETE FROM ${schema}.outbox_events WHERE seq = ANY($1::bigint[])`,
    values: [seqs],
  };
}

/** Runs {@link deleteRelayedSql}; returns the rows deleted. */
export async function deleteRelayed(db: Queryable, schema: string, seqs: readonly string[]): Promise<number> {
  if (seqs.length === 0) return 0;
  const { rowCount } = await run(db, schema, deleteRelayedSql(schema, seqs));
  return rowCount;
}

/**
 * Whether every transaction of `xids` (32-bit transaction ids, as the replication stream gives
 * them) is visible to a snapshot taken now: `pg_visible_in_snapshot()` of each one's 64-bit id,
 * whose epoch is the snapshot's `xmax`'s (the one before when the low 32 bits are above `xmax`'s:
 * assigned before the last wraparound). A transaction the stream reported committed can still be
 * in the snapshot's running list for a moment: its commit record is flushed, and so can be decoded
 * and sent, before the server removes it from that list (PostgreSQL's `CommitTransaction`).
 */
export function transactionsVisibleSql(xids: readonly number[]): SqlStatement {
  return {
    text: `SELECT coalesce(bool_and(pg_visible_in_snapshot(
               (((xmax >> 32) - CASE WHEN x > (xmax & 4294967295) THEN 1 ELSE 0 END) << 32 | x)::text::xid8,
               snap)), true) AS visible
             FROM (SELECT snap, pg_snapshot_xmax(snap)::text::bigint AS xmax
                     FROM (SELECT pg_current_snapshot() AS snap) AS s) AS n,
                  unnest($1::bigint[]) AS x`,
    values: [xids.map(String)],
  };
}

/** Runs {@link transactionsVisibleSql}. */
export async function transactionsVisible(db: Queryable, xids: readonly number[]): Promise<boolean> {
  const { text, values } = transactionsVisibleSql(xids);
  const { rows } = await db.query<{ visible: boolean }>(text, values);
  return rows[0]?.visible ?? true;
}

/**
 * Parks one event the WAL relay could not publish for a reason of its own (Kafka refused the
 * record: too large, topic missing or forbidden): its error and the time it was parked, so that
 * `outboxkit parked list` shows it as it shows the table relay's. At once, without attempts in
 * backoff: the stream cannot wait on one event, and the row is its durable copy. No fencing: one
 * slot has one reader at a time (docs/wal-source.md, "One reader per slot").
 */
export function parkRelayedSql(schema: string, p: { seq: string; error: string; lsn?: string }): SqlStatement {
  return {
    text: `UPDATE ${schema}.outbox_events
        SET attempts = attempts + 1, last_error = left($2, 2000), next_attempt_at = NULL, parked_at = now(),
            wal_lsn = coalesce(wal_lsn, $3::pg_lsn)
      WHERE seq = $1::bigint AND published_at IS NULL`,
    values: [p.seq, p.error, p.lsn ?? null],
  };
}

/**
 * Runs {@link parkRelayedSql}; true when the row was there to park. `lsn`: the commit LSN of the
 * row's transaction, for a row from the stream (kept if the row has one already), so that the rows
 * held behind it keep their place after it (`wal_lsn`).
 */
export async function parkRelayed(
  db: Queryable,
  schema: string,
  p: { seq: string; error: string; lsn?: string },
): Promise<boolean> {
  const { rowCount } = await run(db, schema, parkRelayedSql(schema, p));
  return rowCount > 0;
}

/** A row the WAL relay's resync publishes: what its record is built from (relay/record.ts). */
export interface ResyncRow extends OutboxRecordRow {
  seq: string;
}

/**
 * The highest `seq` of the outbox table (`'0'` when it is empty): the end of a WAL relay's resync.
 * Read after the slot exists, it is at least the seq of every row committed before the slot's
 * consistent point; rows drawn later come through the stream (docs/wal-source.md, "Slot loss and
 * resync").
 */
export function maxSeqSql(schema: string): SqlStatement {
  return { text: `SELECT coalesce(max(seq), 0)::text AS seq FROM ${schema}.outbox_events`, values: [] };
}

/** Runs {@link maxSeqSql}. */
export async function maxSeq(db: Queryable, schema: string): Promise<string> {
  const { rows } = await run<{ seq: string }>(db, schema, maxSeqSql(schema));
  return rows[0]?.seq ?? '0';
}

/**
 * A page of outbox rows the WAL relay reads from the table: those matching `where` (whose
 * parameters are `values`, $1 on), in seq order, at most `maxRows` rows and `maxBytes` payload
 * bytes (the first row always comes).
 */
function walTablePageSql(
  schema: string,
  where: string,
  values: unknown[],
  p: { maxRows: number; maxBytes: number },
): SqlStatement {
  const maxRows = `$${values.length + 1}`;
  const maxBytes = `$${values.length + 2}`;
  return {
    text: `WITH page AS (
       SELECT seq, payload FROM ${schema}.outbox_events WHERE ${where} ORDER BY seq LIMIT ${maxRows}),
     w AS (
       SELECT seq, sum(octet_length(payload)) OVER (ORDER BY seq) AS bytes, row_number() OVER (ORDER BY seq) AS n
         FROM page)
     SELECT e.seq::text AS seq, e.event_id, e.topic, e.key, e.type, e.payload, e.headers
       FROM w JOIN ${schema}.outbox_events e ON e.seq = w.seq
      WHERE w.bytes <= ${maxBytes} OR w.n = 1
      ORDER BY e.seq`,
    values: [...values, p.maxRows, p.maxBytes],
  };
}

/**
 * The next page of a WAL relay's resync: rows neither published nor parked with `afterSeq < seq
 * <= throughSeq`, in seq order (the table relay's order), at most `maxRows` rows and `maxBytes`
 * payload bytes (the first row always comes). Through the pending-rows index. Every lane, no
 * held keys: one slot reads the whole table.
 */
export function readResyncSql(
  schema: string,
  p: { afterSeq: string; throughSeq: string; maxRows: number; maxBytes: number },
): SqlStatement {
  return walTablePageSql(
    schema,
    'seq > $1::bigint AND seq <= $2::bigint AND published_at IS NULL AND parked_at IS NULL',
    [p.afterSeq, p.throughSeq],
    p,
  );
}

/** Runs {@link readResyncSql}. */
export async function readResync(
  db: Queryable,
  schema: string,
  p: { afterSeq: string; throughSeq: string; maxRows: number; maxBytes: number },
): Promise<ResyncRow[]> {
  const { rows } = await run<ResyncRow>(db, schema, readResyncSql(schema, p));
  return rows;
}

/**
 * Leaves rows the WAL relay holds in the table past the stream (their partition cannot take
 * writes, or an earlier event of their key is held or parked): `next_attempt_at` set (when it is
 * not yet) and `wal_lsn` their transaction's commit LSN (kept when set: a row held by a resync, or
 * brought again by the stream, keeps its first place). One statement per batch, before the slot is
 * confirmed past the rows' transactions: the table then holds what the stream will not bring
 * again. `lsns[i]` belongs to `seqs[i]` (null for a resync's rows, which precede every streamed
 * row). The relay publishes them later with {@link readHeld}.
 */
export function holdRelayedSql(
  schema: string,
  p: { seqs: readonly string[]; lsns: readonly (string | null)[] },
): SqlStatement {
  return {
    text: `UPDATE ${schema}.outbox_events e
        SET next_attempt_at = coalesce(e.next_attempt_at, now()), wal_lsn = coalesce(e.wal_lsn, h.lsn)
       FROM unnest($1::bigint[], $2::pg_lsn[]) AS h(seq, lsn)
      WHERE e.seq = h.seq AND e.published_at IS NULL AND e.parked_at IS NULL`,
    values: [p.seqs, p.lsns],
  };
}

/** Runs {@link holdRelayedSql}; returns the rows it found (fewer when some are not visible yet, or gone). */
export async function holdRelayed(
  db: Queryable,
  schema: string,
  p: { seqs: readonly string[]; lsns: readonly (string | null)[] },
): Promise<number> {
  if (p.seqs.length === 0) return 0;
  const { rowCount } = await run(db, schema, holdRelayedSql(schema, p));
  return rowCount;
}

/** A row the WAL relay holds in the table (see {@link readHeldSql}). */
export interface HeldRow extends ResyncRow {
  /** Its place in commit order: `coalesce(wal_lsn, '0/0')`. */
  lsn: string;
  /** Parked (not due): it holds the later events of its key when keys are held behind failures. */
  parked: boolean;
}

/**
 * The next page of the rows the WAL relay holds in the table, in commit order: rows neither
 * published nor deleted that are held (`next_attempt_at` set: held past the stream, or a parked
 * event an operator put back in line) or parked, after `(afterLsn, afterSeq)` in the order
 * `(coalesce(wal_lsn, '0/0'), seq)`, at most `maxRows` rows and `maxBytes` payload bytes (the
 * first row always comes). Through `outbox_events_wal_held_idx`.
 */
export function readHeldSql(
  schema: string,
  p: { afterLsn: string; afterSeq: string; maxRows: number; maxBytes: number },
): SqlStatement {
  const place = `coalesce(wal_lsn, '0/0'::pg_lsn)`;
  return {
    text: `WITH page AS (
       SELECT seq, ${place} AS lsn, payload FROM ${schema}.outbox_events
        WHERE published_at IS NULL AND (parked_at IS NOT NULL OR next_attempt_at IS NOT NULL)
          AND (${place}, seq) > ($1::pg_lsn, $2::bigint)
        ORDER BY ${place}, seq LIMIT $3),
     w AS (
       SELECT seq, lsn, sum(octet_length(payload)) OVER (ORDER BY lsn, seq) AS bytes,
              row_number() OVER (ORDER BY lsn, seq) AS n
         FROM page)
     SELECT e.seq::text AS seq, w.lsn::text AS lsn, e.parked_at IS NOT NULL AS parked,
            e.event_id, e.topic, e.key, e.type, e.payload, e.headers
       FROM w JOIN ${schema}.outbox_events e ON e.seq = w.seq
      WHERE w.bytes <= $4 OR w.n = 1
      ORDER BY w.lsn, e.seq`,
    values: [p.afterLsn, p.afterSeq, p.maxRows, p.maxBytes],
  };
}

/** Runs {@link readHeldSql}. */
export async function readHeld(
  db: Queryable,
  schema: string,
  p: { afterLsn: string; afterSeq: string; maxRows: number; maxBytes: number },
): Promise<HeldRow[]> {
  const { rows } = await run<HeldRow>(db, schema, readHeldSql(schema, p));
  return rows;
}

/**
 * The keys of the rows the WAL relay holds in the table (held rows; parked ones too when
 * `parked`): read when a reader starts, so that the stream's later events of those keys are held
 * behind them. Through the index of blocked rows (few).
 */
export function heldKeysSql(schema: string, p: { parked: boolean }): SqlStatement {
  return {
    text: `SELECT DISTINCT key FROM ${schema}.outbox_events
      WHERE published_at IS NULL AND key IS NOT NULL
        AND (next_attempt_at IS NOT NULL OR ($1::boolean AND parked_at IS NOT NULL))`,
    values: [p.parked],
  };
}

/** Runs {@link heldKeysSql}. */
export async function heldKeys(db: Queryable, schema: string, p: { parked: boolean }): Promise<string[]> {
  const { rows } = await run<{ key: string }>(db, schema, heldKeysSql(schema, p));
  return rows.map((r) => r.key);
}

/**
 * The publications that stream `<schema>.outbox_events` (pg_publication_tables, PostgreSQL 10+):
 * a WAL source is set up for the schema (`migrate({ walPublication })`, docs/wal-source.md).
 */
export async function outboxPublications(db: Queryable, schema: string): Promise<string[]> {
  const { rows } = await run<{ pubname: string }>(db, schema, {
    text: `SELECT pubname FROM pg_publication_tables WHERE schemaname = $1 AND tablename = 'outbox_events' ORDER BY 1`,
    values: [schema],
  });
  return rows.map((r) => r.pubname);
}
