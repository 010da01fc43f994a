-- The writers' per-key row locks (src/schema.ts, outbox_key_locks). UNLOGGED: a lock outlives no
-- transaction, so the rows need no WAL; a crash or a failover leaves the table empty, which is right.
CREATE UNLOGGED TABLE "outboxkit"."outbox_key_locks" (
	"key_hash" bigint PRIMARY KEY NOT NULL
);
