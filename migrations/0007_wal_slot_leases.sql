-- The WAL relays' reader leases (src/schema.ts, wal_slot_leases): the relay holding a slot's lease
-- reads it; a standby takes an expired lease over, raising fencing_token, and ends the former
-- reader's walsender (docs/wal-source.md, "One reader per slot, standbys, and scaling").
CREATE TABLE "outboxkit"."wal_slot_leases" (
	"slot_name" text PRIMARY KEY NOT NULL,
	"owner_id" text,
	"instance_id" text,
	"fencing_token" bigint DEFAULT 0 NOT NULL,
	"lease_expires_at" timestamp with time zone
);
