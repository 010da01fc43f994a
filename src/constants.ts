/**
 * Constants shared by the writer, the relay and the consumer, in a module without dependencies so
 * that the relay daemon does not load drizzle-orm (src/schema.ts re-exports them).
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
