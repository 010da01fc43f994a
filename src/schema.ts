/**
 * outboxkit's tables, defined with drizzle-orm.
 *
 * The tables live in one PostgreSQL schema, `outboxkit` by default. drizzle-kit writes the schema
 * name into the SQL it generates, so the files in migrations/ are generated for `outboxkit` and
 * outboxkit's own migrator (`migrate()` in src/migrate.ts) rewrites that one quoted identifier when a
 * different schema is configured. {@link outboxkitTables} gives the same tables for any schema, for
 * queries with drizzle.
 *
 * To include these tables in an application's own drizzle-kit setup, add this file to its
 * `schema` list (`node_modules/outboxkit/dist/src/schema.js`), or apply outboxkit's migrations
 * with `outboxkit migrate` and leave its schema out of `schemaFilter`.
 */
import { sql } from 'drizzle-orm';
import {
  bigint,
  boolean,
  check,
  customType,
  index,
  integer,
  jsonb,
  pgSchema,
  primaryKey,
  smallint,
  text,
  timestamp,
  uuid,
} from 'drizzle-orm/pg-core';

import { DEFAULT_SCHEMA, IDEMPOTENCY_STATES, OUTBOX_LANES, type IdempotencyState } from './constants.js';

/** An entry of `relay_instances.blocked_partitions`: a topic-partition a relay finds unable to take writes. */
export interface RelayBlockedPartition {
  topic: string;
  partition: number;
  /** Why: `no leader`, or `NOT_ENOUGH_REPLICAS (isr 1 < min.insync.replicas 2)`. */
  reason: string;
  /** Keys of the relay's lanes whose events wait for it. */
  keys: number;
  /** Since when it is blocked, in ms since the epoch (the relay's clock). */
  since: number;
}

export { DEFAULT_SCHEMA, IDEMPOTENCY_STATES, OUTBOX_LANES, type IdempotencyState };

/** PostgreSQL `bytea`, read and written as a Node.js Buffer (payloads stay byte for byte). */
export const bytea = customType<{ data: Buffer; driverData: Buffer }>({
  dataType: () => 'bytea',
});

/** PostgreSQL `pg_lsn`, a WAL position in its text form (`16/B374D848`). */
export const pgLsn = customType<{ data: string; driverData: string }>({
  dataType: () => 'pg_lsn',
});

/**
 * The Kafka topic and partition of a consumer table's row (new column builders at each call: a
 * builder belongs to one table).
 */
function topicPartition() {
  return { topic: text('topic').notNull(), partition: integer('partition').notNull() };
}

/** Builds outboxkit's tables in the PostgreSQL schema `schemaName`. */
export function outboxkitTables(schemaName: string = DEFAULT_SCHEMA) {
  const schema = pgSchema(schemaName);

  /**
   * Outbox events. `seq` orders events of one key in commit order because the writer locks the
   * key's row in `outbox_key_locks` before the identity value is drawn.
   */
  const outboxEvents = schema.table(
    'outbox_events',
    {
      seq: bigint('seq', { mode: 'bigint' }).primaryKey().generatedAlwaysAsIdentity(),
      eventId: uuid('event_id').notNull().unique(),
      topic: text('topic').notNull(),
      key: text('key'),
      lane: smallint('lane').notNull(),
      type: text('type').notNull(),
      payload: bytea('payload').notNull(),
      headers: jsonb('headers').$type<Record<string, string>>().notNull().default({}),
      aggregateType: text('aggregate_type'),
      aggregateId: text('aggregate_id'),
      createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
      attempts: integer('attempts').notNull().default(0),
      nextAttemptAt: timestamp('next_attempt_at', { withTimezone: true }),
      lastError: text('last_error'),
      parkedAt: timestamp('parked_at', { withTimezone: true }),
      publishedAt: timestamp('published_at', { withTimezone: true }),
      /**
       * WAL mode only: the commit LSN of the row's transaction, set by the WAL relay when it leaves
       * the row in the table past the stream (held behind a partition that cannot take writes or a
       * parked event of its key) or parks it, so that held rows go out later in commit order
       * (docs/wal-source.md, "Held keys"). NULL otherwise, and for rows a resync held (they precede
       * every streamed row).
       */
      walLsn: pgLsn('wal_lsn'),
    },
    (t) => [
      // The relay's read path: pending rows in seq order (parked rows leave it). Only pending rows
      // are in it, so a pass never walks over published rows kept for retention; the relay's lanes
      // are a filter on this walk (a relay holds a fair share of all lanes).
      index('outbox_events_pending_idx')
        .on(t.seq)
        .where(sql`${t.publishedAt} IS NULL AND ${t.parkedAt} IS NULL`),
      // Rows that failed to publish (in backoff or parked): few, read every pass to hold the later
      // events of their keys back.
      index('outbox_events_blocked_idx')
        .on(t.lane, t.key, t.seq)
        .where(sql`${t.publishedAt} IS NULL AND (${t.parkedAt} IS NOT NULL OR ${t.nextAttemptAt} IS NOT NULL)`),
      // The WAL relay's held rows in commit order (resync rows, without an LSN, first), walked a
      // page at a time when their partitions take writes again or an operator retries a parked one.
      index('outbox_events_wal_held_idx')
        .on(sql`coalesce(${t.walLsn}, '0/0'::pg_lsn)`, t.seq)
        .where(sql`${t.publishedAt} IS NULL AND (${t.parkedAt} IS NOT NULL OR ${t.nextAttemptAt} IS NOT NULL)`),
      // Retention cleanup of published rows.
      index('outbox_events_published_idx')
        .on(t.publishedAt)
        .where(sql`${t.publishedAt} IS NOT NULL`),
    ],
  );

  /**
   * The writers' per-key locks: one row per key hash (`hashtextextended(key, 7)`), created by the
   * first `enqueue()` of the key and row-locked (`INSERT … ON CONFLICT DO UPDATE … WHERE false`)
   * by every later one until its transaction ends, so that writers of one key draw their `seq` in
   * commit order. A row lock is kept in the row itself, not in PostgreSQL's shared lock table, so a
   * transaction may lock any number of keys (an advisory lock per key filled that table: SQLSTATE
   * 53200 near 14,000 keys with the default max_locks_per_transaction). Created UNLOGGED by
   * migration 0005 (a lock outlives no transaction, so nothing here needs the WAL; a crash or a
   * failover empties it). The relay's retention deletes the rows of keys whose events it deletes.
   */
  const outboxKeyLocks = schema.table('outbox_key_locks', {
    keyHash: bigint('key_hash', { mode: 'bigint' }).primaryKey(),
  });

  /** One row per relay lane: who owns it, until when, and the fencing token of that ownership. */
  const relayLanes = schema.table('relay_lanes', {
    lane: smallint('lane').primaryKey(),
    ownerId: text('owner_id'),
    fencingToken: bigint('fencing_token', { mode: 'bigint' })
      .notNull()
      .default(sql`0`),
    leaseExpiresAt: timestamp('lease_expires_at', { withTimezone: true }),
  });

  /**
   * Running relay instances and their liveness lease, so that each can compute a fair share of
   * lanes (including instances that hold none yet) and an operator can see who owns what.
   */
  const relayInstances = schema.table('relay_instances', {
    relayId: text('relay_id').primaryKey(),
    hostname: text('hostname').notNull(),
    pid: integer('pid').notNull(),
    startedAt: timestamp('started_at', { withTimezone: true }).notNull().defaultNow(),
    leaseExpiresAt: timestamp('lease_expires_at', { withTimezone: true }).notNull(),
    /**
     * The topic-partitions this relay found unable to take writes at its last heartbeat, as
     * `Relay.blockedPartitions()` returns them (`keys`: keys of its lanes held back; `since`: ms
     * since the epoch), at most 200, most keys first; NULL when none is blocked (and for relays
     * older than this column). `outboxkit status` lists them: it reads the database, not the
     * relays' memory.
     */
    blockedPartitions: jsonb('blocked_partitions').$type<RelayBlockedPartition[]>(),
  });

  /**
   * The WAL relays' replication slots (docs/wal-source.md, "Slot loss and resync"): one row per
   * slot a WAL relay created or checked. `resync_pending` is set before the relay creates (or
   * recreates) its slot and cleared once every row the table held has been published, so a relay
   * that dies in between resyncs again at its next start. `resync_reason` says why the last resync
   * began (`missing`, `lost`, `unrecorded`, `interrupted`); `resync_started_at` and `resynced_at`
   * when it began and last ended. Added by migration 0006.
   */
  const walSlots = schema.table('wal_slots', {
    slotName: text('slot_name').primaryKey(),
    resyncPending: boolean('resync_pending').notNull().default(false),
    resyncReason: text('resync_reason'),
    resyncStartedAt: timestamp('resync_started_at', { withTimezone: true }),
    resyncedAt: timestamp('resynced_at', { withTimezone: true }),
  });

  /**
   * The WAL relays' reader leases (docs/wal-source.md, "One reader per slot, standbys, and
   * scaling"): one row per slot. The relay that holds the lease (`owner_id`, until
   * `lease_expires_at` by the database clock) is the only one that reads the slot; standbys take an
   * expired lease over, which raises `fencing_token`, and end the former reader's walsender. A
   * relay that stops releases its lease (`owner_id` NULL). Added by migration 0007.
   */
  const walSlotLeases = schema.table('wal_slot_leases', {
    slotName: text('slot_name').primaryKey(),
    ownerId: text('owner_id'),
    /**
     * The holding relay object's own random id: two running relays given the same `relayId` are
     * told apart (and the second stands by), while a relay restarted with its former `relayId`
     * takes the lease back at once when no walsender reads the slot any more.
     */
    instanceId: text('instance_id'),
    fencingToken: bigint('fencing_token', { mode: 'bigint' })
      .notNull()
      .default(sql`0`),
    leaseExpiresAt: timestamp('lease_expires_at', { withTimezone: true }),
  });

  /** Idempotency records, scoped by (tenant, operation, key). */
  const idempotencyKeys = schema.table(
    'idempotency_keys',
    {
      tenant: text('tenant').notNull(),
      operation: text('operation').notNull(),
      key: text('key').notNull(),
      fingerprint: bytea('fingerprint').notNull(),
      fingerprintVersion: smallint('fingerprint_version').notNull(),
      state: text('state').$type<IdempotencyState>().notNull(),
      ownerToken: uuid('owner_token'),
      /**
       * Lease mode: the record's public id (`operationId`: the operation resource's URL, NOTIFY
       * payloads), written by the claim as HMAC-SHA256 under the application's
       * `operationIdSecret` and never recomputed, so a record keeps its id through takeovers and
       * secret rotations. Records claimed before this column existed hold the SHA-256 of their key
       * (the id they were given then). NULL for one-transaction mode records (no operation resource).
       */
      operationId: text('operation_id'),
      generation: integer('generation').notNull().default(1),
      leaseExpiresAt: timestamp('lease_expires_at', { withTimezone: true }),
      responseStatus: smallint('response_status'),
      responseHeaders: jsonb('response_headers').$type<Record<string, string>>(),
      responseBody: bytea('response_body'),
      createdAt: timestamp('created_at', { withTimezone: true }).notNull().defaultNow(),
      updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
      completedAt: timestamp('completed_at', { withTimezone: true }),
      expiresAt: timestamp('expires_at', { withTimezone: true }).notNull(),
    },
    (t) => [
      primaryKey({ columns: [t.tenant, t.operation, t.key] }),
      index('idempotency_keys_expires_idx').on(t.expiresAt),
      // The operation resource's lookup (lease mode): one record by its public id within the
      // caller's tenant and operation, whatever the number of records there.
      index('idempotency_keys_operation_id_idx')
        .on(t.tenant, t.operation, t.operationId)
        .where(sql`${t.operationId} IS NOT NULL`),
      check('idempotency_keys_state_check', sql`${t.state} IN ('processing', 'completed', 'failed', 'uncertain')`),
    ],
  );

  /** The consumer inbox: one row per (consumer group, event id) whose effects were applied. */
  const inbox = schema.table(
    'inbox',
    {
      consumerGroup: text('consumer_group').notNull(),
      eventId: uuid('event_id').notNull(),
      ...topicPartition(),
      offset: bigint('offset', { mode: 'bigint' }).notNull(),
      processedAt: timestamp('processed_at', { withTimezone: true }).notNull().defaultNow(),
    },
    (t) => [primaryKey({ columns: [t.consumerGroup, t.eventId] }), index('inbox_processed_idx').on(t.processedAt)],
  );

  /**
   * The dedup consumer's optional partition progress (`recordProgress: true`): per (consumer group,
   * topic, partition), a range of offsets whose records the group has handled, and the event id
   * and Kafka timestamp (ms) of the record at its last offset: the anchor that tells this log from
   * a recreated topic's, and a record from a later copy of the same event.
   * Written in the transaction of the effects; Kafka's committed offsets stay authoritative.
   * One row per partition: no retention needed.
   */
  const consumerProgress = schema.table(
    'consumer_progress',
    {
      consumerGroup: text('consumer_group').notNull(),
      ...topicPartition(),
      rangeStart: bigint('range_start', { mode: 'bigint' }).notNull(),
      lastOffset: bigint('last_offset', { mode: 'bigint' }).notNull(),
      lastEventId: uuid('last_event_id').notNull(),
      lastTimestamp: bigint('last_timestamp', { mode: 'bigint' }).notNull(),
      updatedAt: timestamp('updated_at', { withTimezone: true }).notNull().defaultNow(),
    },
    (t) => [
      primaryKey({ columns: [t.consumerGroup, t.topic, t.partition] }),
      check('consumer_progress_range_check', sql`${t.rangeStart} <= ${t.lastOffset}`),
    ],
  );

  return {
    schema,
    outboxEvents,
    outboxKeyLocks,
    relayLanes,
    relayInstances,
    walSlots,
    walSlotLeases,
    idempotencyKeys,
    inbox,
    consumerProgress,
  };
}

const tables = outboxkitTables();
/** The `outboxkit` schema (drizzle-kit reads these top-level exports). */
export const outboxkitSchema = tables.schema;
export const outboxEvents = tables.outboxEvents;
export const outboxKeyLocks = tables.outboxKeyLocks;
export const relayLanes = tables.relayLanes;
export const relayInstances = tables.relayInstances;
export const walSlots = tables.walSlots;
export const walSlotLeases = tables.walSlotLeases;
export const idempotencyKeys = tables.idempotencyKeys;
export const inbox = tables.inbox;
export const consumerProgress = tables.consumerProgress;
