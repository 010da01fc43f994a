-- The WAL relays' slots (src/schema.ts, wal_slots): resync_pending is set before a relay creates
-- or recreates its replication slot and cleared once the table's rows are published, so a relay
-- that dies in between resyncs at its next start (docs/wal-source.md, "Slot loss and resync").
CREATE TABLE "outboxkit"."wal_slots" (
	"slot_name" text PRIMARY KEY NOT NULL,
	"resync_pending" boolean DEFAULT false NOT NULL,
	"resync_reason" text,
	"resync_started_at" timestamp with time zone,
	"resynced_at" timestamp with time zone
);
