/**
 * The WAL slot reader's defaults, in a module of their own: the CLI's `relay` command shows them
 * in its help without loading the replication client (pg-logical-replication), which only
 * `--source wal` needs.
 */
export const WAL_SLOT_READER_DEFAULTS = Object.freeze({
  /** How often a status update goes to PostgreSQL, in ms (keep it well below `wal_sender_timeout`). */
  statusIntervalMs: 10_000,
});
