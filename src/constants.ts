/**
 * Constants shared by the writer, the relay and the consumer, in a module without dependencies so
 * that outboxkit's runtime (the CLI, the relay, the consumer, the main entry) does not load
 * drizzle-orm (src/schema.ts re-exports them for drizzle-kit and applications' schemas).
 */

/** The schema outboxkit uses when none is configured. */
export const DEFAULT_SCHEMA = 'outboxkit';

/**
 * Number of relay lanes. Every outbox event belongs to the lane `hash(key) mod OUTBOX_LANES`; a lane
 * has one active relay at a time, which is how several relay instances keep per-key order.
 * Fixed: the writer and every relay must agree on it.
 */
export const OUTBOX_LANES = 64;

/**
 * How old an explicit `eventId` may be when it is enqueued, in ms: it must be a UUIDv7 (RFC 9562
 * §5.7) whose timestamp is at most this far behind the writer's clock. Past it, the id is refused,
 * so an old id can never be published a second time (docs/events.md, Event ids).
 */
export const EVENT_ID_MAX_AGE_MS = 3_600_000;

/**
 * How far ahead of the writer's clock an explicit `eventId`'s timestamp may be, in ms: the clock
 * difference tolerated between the machine that made the id, the writer and PostgreSQL.
 */
export const EVENT_ID_MAX_SKEW_MS = 300_000;

/**
 * The shortest time a published outbox row is kept, whatever `publishedRetentionMs` says, in ms:
 * while it exists, the unique event id refuses a second event with its id; after it, the writer
 * refuses the id for its age ({@link EVENT_ID_MAX_AGE_MS} plus {@link EVENT_ID_MAX_SKEW_MS}).
 */
export const EVENT_ID_REUSE_WINDOW_MS = EVENT_ID_MAX_AGE_MS + EVENT_ID_MAX_SKEW_MS;

/**
 * The seed of the key hash in `outbox_key_locks` (`hashtextextended(key, 7)`, a bigint): the writer
 * locks a key's row by it, and the relay's retention deletes the rows of the keys whose events it
 * deletes by the same expression.
 */
export const KEY_LOCK_HASH_SEED = 7;

/**
 * The most entries of PostgreSQL's shared lock table an `enqueue()` call takes, whatever its number
 * of events and keys: 11 held until the transaction ends (measured with pg_locks: RowExclusiveLock
 * on outbox_events, its 5 indexes, its identity sequence, outbox_key_locks and its primary key, the
 * virtual transaction id and the transaction id), at most 3 while it waits for another writer of
 * a key (the tuple, that transaction's id, a speculative-insertion token) and NOTIFY's database
 * lock at commit. Most of the relation locks take PostgreSQL's per-backend fast path, not the
 * shared table. The shared table holds max_locks_per_transaction × (max_connections +
 * max_prepared_transactions) entries (6,400 with PostgreSQL's defaults).
 */
export const ENQUEUE_LOCK_TABLE_ENTRIES = 15;

/** States of an idempotency record. `processing` → `completed` | `failed`; `uncertain` (lease mode). */
export const IDEMPOTENCY_STATES = ['processing', 'completed', 'failed', 'uncertain'] as const;
export type IdempotencyState = (typeof IDEMPOTENCY_STATES)[number];
