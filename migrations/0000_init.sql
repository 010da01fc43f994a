CREATE SCHEMA "outboxkit";
--> statement-breakpoint
CREATE TABLE "outboxkit"."idempotency_keys" (
	"tenant" text NOT NULL,
	"operation" text NOT NULL,
	"key" text NOT NULL,
	"fingerprint" "bytea" NOT NULL,
	"fingerprint_version" smallint NOT NULL,
	"state" text NOT NULL,
	"owner_token" uuid,
	"generation" integer DEFAULT 1 NOT NULL,
	"lease_expires_at" timestamp with time zone,
	"response_status" smallint,
	"response_headers" jsonb,
	"response_body" "bytea",
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"completed_at" timestamp with time zone,
	"expires_at" timestamp with time zone NOT NULL,
	CONSTRAINT "idempotency_keys_tenant_operation_key_pk" PRIMARY KEY("tenant","operation","key"),
	CONSTRAINT "idempotency_keys_state_check" CHECK ("outboxkit"."idempotency_keys"."state" IN ('processing', 'completed', 'failed', 'uncertain'))
);
--> statement-breakpoint
CREATE TABLE "outboxkit"."inbox" (
	"consumer_group" text NOT NULL,
	"event_id" uuid NOT NULL,
	"topic" text NOT NULL,
	"partition" integer NOT NULL,
	"offset" bigint NOT NULL,
	"processed_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "inbox_consumer_group_event_id_pk" PRIMARY KEY("consumer_group","event_id")
);
--> statement-breakpoint
CREATE TABLE "outboxkit"."outbox_events" (
	"seq" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "outboxkit"."outbox_events_seq_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"event_id" uuid NOT NULL,
	"topic" text NOT NULL,
	"key" text,
	"lane" smallint NOT NULL,
	"type" text NOT NULL,
	"payload" "bytea" NOT NULL,
	"headers" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"aggregate_type" text,
	"aggregate_id" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"attempts" integer DEFAULT 0 NOT NULL,
	"next_attempt_at" timestamp with time zone,
	"last_error" text,
	"parked_at" timestamp with time zone,
	"published_at" timestamp with time zone,
	CONSTRAINT "outbox_events_event_id_unique" UNIQUE("event_id")
);
--> statement-breakpoint
CREATE TABLE "outboxkit"."relay_instances" (
	"relay_id" text PRIMARY KEY NOT NULL,
	"hostname" text NOT NULL,
	"pid" integer NOT NULL,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL,
	"lease_expires_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "outboxkit"."relay_lanes" (
	"lane" smallint PRIMARY KEY NOT NULL,
	"owner_id" text,
	"fencing_token" bigint DEFAULT 0 NOT NULL,
	"lease_expires_at" timestamp with time zone
);
--> statement-breakpoint
CREATE INDEX "idempotency_keys_expires_idx" ON "outboxkit"."idempotency_keys" USING btree ("expires_at");--> statement-breakpoint
CREATE INDEX "inbox_processed_idx" ON "outboxkit"."inbox" USING btree ("processed_at");--> statement-breakpoint
CREATE INDEX "outbox_events_pending_idx" ON "outboxkit"."outbox_events" USING btree ("seq") WHERE "outboxkit"."outbox_events"."published_at" IS NULL AND "outboxkit"."outbox_events"."parked_at" IS NULL;--> statement-breakpoint
CREATE INDEX "outbox_events_blocked_idx" ON "outboxkit"."outbox_events" USING btree ("lane","key","seq") WHERE "outboxkit"."outbox_events"."published_at" IS NULL AND ("outboxkit"."outbox_events"."parked_at" IS NOT NULL OR "outboxkit"."outbox_events"."next_attempt_at" IS NOT NULL);--> statement-breakpoint
CREATE INDEX "outbox_events_published_idx" ON "outboxkit"."outbox_events" USING btree ("published_at") WHERE "outboxkit"."outbox_events"."published_at" IS NOT NULL;