/**
 * The Kafka record of an outbox row: what every relay (the table relay, relay/relay.ts, and the WAL
 * relay, relay/wal/wal-relay.ts) publishes for the same row, so that switching the source changes
 * nothing a consumer sees.
 */
import { HEADER_EVENT_ID, HEADER_EVENT_TYPE } from '../src/outbox/event.js';
import type { OutboundRecord } from '../src/kafka/types.js';

/** The columns of an `outbox_events` row that make its Kafka record. */
export interface OutboxRecordRow {
  event_id: string;
  topic: string;
  key: string | null;
  type: string;
  payload: Buffer;
  headers: Record<string, string>;
}

/**
 * The record of `row`: its topic, key and payload as they are, its stored headers plus `event-id`
 * and `event-type` (which win over stored headers of the same names).
 */
export function toRecord(row: OutboxRecordRow): OutboundRecord {
  return {
    topic: row.topic,
    key: row.key,
    value: row.payload,
    headers: { ...row.headers, [HEADER_EVENT_ID]: row.event_id, [HEADER_EVENT_TYPE]: row.type },
  };
}
