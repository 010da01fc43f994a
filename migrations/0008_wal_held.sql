-- The WAL relay's held rows (src/schema.ts, outbox_events.wal_lsn): rows it leaves in the table past
-- the stream (their partition cannot take writes, or a parked event of their key holds them) keep
-- their transaction's commit LSN, and go out later in that order (docs/wal-source.md, "Held keys").
ALTER TABLE "outboxkit"."outbox_events" ADD COLUMN "wal_lsn" "pg_lsn";--> statement-breakpoint
CREATE INDEX "outbox_events_wal_held_idx" ON "outboxkit"."outbox_events" USING btree (coalesce("wal_lsn", '0/0'::pg_lsn),"seq") WHERE "outboxkit"."outbox_events"."published_at" IS NULL AND ("outboxkit"."outbox_events"."parked_at" IS NOT NULL OR "outboxkit"."outbox_events"."next_attempt_at" IS NOT NULL);