CREATE TABLE "outboxkit"."consumer_progress" (
	"consumer_group" text NOT NULL,
	"topic" text NOT NULL,
	"partition" integer NOT NULL,
	"range_start" bigint NOT NULL,
	"last_offset" bigint NOT NULL,
	"last_event_id" uuid NOT NULL,
	"last_timestamp" bigint NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "consumer_progress_consumer_group_topic_partition_pk" PRIMARY KEY("consumer_group","topic","partition"),
	CONSTRAINT "consumer_progress_range_check" CHECK ("outboxkit"."consumer_progress"."range_start" <= "outboxkit"."consumer_progress"."last_offset")
);
