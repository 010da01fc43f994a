/**
 * The kafkajs {@link GroupConsumer}: a kafkajs consumer run with `eachBatch` and
 * `eachBatchAutoResolve: false`, the kafkajs API in which the caller, not kafkajs, decides which
 * offsets are resolved (and so committable), and which tells a batch's staleness.
 */
import type { Consumer, EachBatchPayload, Kafka } from 'kafkajs';
import type { GroupConsumer, GroupConsumerSettings, InboundBatch } from '../types.js';
import { losesPartitions } from './errors.js';

/** A kafkajs-backed {@link GroupConsumer} (see `KafkaClient.groupConsumer`). */
export function kafkajsGroupConsumer(kafka: Kafka, settings: GroupConsumerSettings): GroupConsumer {
  const { groupId, sessionTimeoutMs, heartbeatIntervalMs, fetchMaxWaitMs, metadataMaxAgeMs } = settings;
  const consumer: Consumer = kafka.consumer({
    groupId,
    ...(sessionTimeoutMs === undefined ? {} : { sessionTimeout: sessionTimeoutMs }),
    ...(heartbeatIntervalMs === undefined ? {} : { heartbeatInterval: heartbeatIntervalMs }),
    ...(fetchMaxWaitMs === undefined ? {} : { maxWaitTimeInMs: fetchMaxWaitMs }),
    // kafkajs refreshes it at a fetch once older than this; a subscribed topic with more partitions
    // than the assignment knows then makes the member rejoin (KafkaJSStaleTopicMetadataAssignment).
    ...(metadataMaxAgeMs === undefined ? {} : { metadataMaxAge: metadataMaxAgeMs }),
    // A typo in a topic name must fail, not create an empty topic.
    allowAutoTopicCreation: false,
  });
  return {
    connect: () => consumer.connect(),
    subscribe: (topics, { fromBeginning }) => consumer.subscribe({ topics: [...topics], fromBeginning }),
    run: ({ concurrency = 1, autoCommitIntervalMs, eachBatch }) =>
      consumer.run({
        eachBatch: (payload) => eachBatch(inboundBatch(payload)),
        eachBatchAutoResolve: false,
        // kafkajs commits only resolved offsets: at this interval, at the end of each batch,
        // before a rebalance and on stop.
        autoCommit: autoCommitIntervalMs !== undefined,
        ...(autoCommitIntervalMs === undefined ? {} : { autoCommitInterval: autoCommitIntervalMs }),
        partitionsConsumedConcurrently: concurrency,
      }),
    disconnect: () => consumer.disconnect(),
    on(event, listener) {
      if (event === 'join') {
        return consumer.on(consumer.events.GROUP_JOIN, ({ payload }) =>
          (listener as (p: { assignment: Record<string, number[]> }) => void)({
            assignment: payload.memberAssignment,
          }),
        );
      }
      return consumer.on(consumer.events.CRASH, ({ payload }) =>
        (listener as (p: { error: Error; willRestart: boolean }) => void)({
          error: payload.error,
          willRestart: payload.restart,
        }),
      );
    },
    isRebalance: losesPartitions,
  };
}

/** kafkajs's batch payload as an {@link InboundBatch}; the messages are kafkajs's own objects. */
function inboundBatch(payload: EachBatchPayload): InboundBatch {
  const { batch } = payload;
  // kafkajs's Batch keeps the offset it fetched from (not in its typings).
  const fetched = (batch as { fetchedOffset?: unknown }).fetchedOffset;
  return {
    topic: batch.topic,
    partition: batch.partition,
    messages: batch.messages,
    ...(typeof fetched === 'string' ? { fetchedOffset: fetched } : {}),
    highWatermark: batch.highWatermark,
    lastOffset: batch.lastOffset(),
    markProcessed: (offset) => payload.resolveOffset(offset),
    commitIfDue: () => payload.commitOffsetsIfNecessary(),
    heartbeat: () => payload.heartbeat(),
    isActive: () => payload.isRunning() && !payload.isStale(),
    pause: () => payload.pause(),
  };
}
