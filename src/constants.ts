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
