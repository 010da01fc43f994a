/**
 * The WAL relay: publishes the outbox rows that a logical replication slot streams, in commit
 * order, to Kafka, and confirms the slot past a transaction only once Kafka acknowledged all its
 * events (docs/wal-source.md, "The relay").
 *
 * How it runs: the slot reader (./slot-reader.ts) hands over committed transactions one at a time;
 * the relay decodes their `outbox_events` rows (./outbox-row.ts) into the records the table relay
 * builds from the same rows (relay/record.ts) and queues them, holding the reader while the queue
 * is full (memory bound: about one batch queued beside the one in flight). One publisher loop
 * takes what waits, several small transactions together up to `batchSize` events and
 * `maxBatchBytes`, sends it, deletes the acknowledged rows in one statement, then confirms each
 * transaction's commit end LSN in commit order. A crash anywhere before the confirmation
 * redelivers the transactions to the next reader: duplicates with the same `event-id`, never a
 * loss (G3 at least once).
 *
 * The slot and the resync: before each reader starts (at start, and after a lost replication
 * connection) the relay checks its slot in pg_replication_slots and its row of `wal_slots`. A slot
 * that is missing or lost (`wal_status = 'lost'`) is created again, and every row still in the
 * outbox table is then published from the table, in seq order, through the same send, park and
 * delete path, before the new reader streams anything: rows committed before the slot's consistent
 * point are in no stream. The resync is marked pending in `wal_slots` before the slot is created
 * and cleared once it ends, so a relay that dies in between resyncs again at its next start. A
 * slot no relay recorded (created by hand, or before migration 0006) is resynced once too. Rows
 * that the resync publishes and the stream then brings again are later duplicates with the same
 * `event-id` (docs/wal-source.md, "Slot loss and resync").
 *
 * Retention: the rows the relay publishes are deleted at once, but rows marked published by other
 * paths (a table relay before a switch to WAL mode, `outboxkit parked skip`) stay until the
 * table relay's retention cleanup (../cleanup.ts) deletes them past `publishedRetentionMs`; the
 * relay holding the slot's lease runs it, standbys do not.
 *
 * Kafka's side (the producer, bounded sends, topics' limits, which partitions cannot take writes)
 * is ./wal-kafka.ts; the keys held in the table are ./held-keys.ts.
 *
 * One reader per slot: a relay reads only while it holds the slot's lease (`wal_slot_leases`,
 * ./slot-lease.ts), renewed every third of `leaseMs`; others stand by and take an expired lease
 * over, ending the former reader's walsender. A relay sends nothing once 80 % of its lease has
 * passed since its last renewal was sent (by its own monotonic clock), so a paused relay that
 * wakes stops its reader instead of publishing more than the batch it had passed that check with.
 *
 * Failures: after a failed send the relay asks the cluster which partitions cannot take writes
 * (relay/partitions.ts). Events bound for those, and the later events of their keys, are held: left
 * in the table, marked with their commit LSN, and the stream goes on past them (G7: only they
 * wait; ./held-keys.ts). With `holdKeyBehindFailure` (the default) the later events of a parked
 * event's key are held behind it too. Held rows are published from the table in commit order once
 * nothing holds their key (see drainHeld()). A failure the cluster does not explain (the cluster
 * unreachable, a leader just gone and not replaced yet) holds the stream and retries with
 * full-jitter backoff, confirming nothing; the reader keeps the walsender alive meanwhile. A record
 * Kafka refuses for itself (too large, topic missing or forbidden) is parked in its row
 * (`parked_at`, `last_error`; `outboxkit parked list`) and the stream goes on.
 */
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { hostname } from 'node:os';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { z } from 'zod';
import {
  InvalidOptionsError,
  LifecycleError,
  SchemaMissingError,
  WalStreamError,
  isOutboxkitError,
  permissionDeniedOr,
  schemaMissingOr,
} from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';
import * as option from '../../src/options.js';
import { quoteSchema } from '../../src/schema-name.js';
import { fullJitterBackoffMs } from '../../src/backoff.js';
import { crashPoint } from '../../src/crash-point.js';
import type { Queryable } from '../../src/database.js';
import { createKafkajsClient, kafkaClientOf, type Kafka } from '../../src/kafka/kafkajs/client.js';
import { createPlatformaticClient } from '../../src/kafka/platformatic/client.js';
import { loadPlatformaticKafka } from '../../src/kafka/platformatic/load.js';
import { recordBytes, splitByTopicLimit } from '../../src/kafka/topic-limits.js';
import type { KafkaClient, OutboundRecord } from '../../src/kafka/types.js';
import { PARTITION_RECHECK_MS } from '../relay.js';
import type { BlockedPartition } from '../partitions.js';
import { HeldKeys } from './held-keys.js';
import { WalKafka } from './wal-kafka.js';
import { formatLsn } from './lsn.js';

/**
 * The share of `leaseMs`, from the moment its last renewal was sent, during which a relay acts on
 * the slot: it stops before the database lets a standby take over (as the table relay's lanes).
 */
const LEASE_ACT_FRACTION = 0.8;

/**
 * How often the relay walks the rows it holds in the table (drainHeld()), in ms: held rows whose key
 * nothing holds any more, and parked events an operator put back in line (`outboxkit parked
 * retry`), are published from the table, since the stream brought their inserts long ago and an
 * `UPDATE` is not streamed.
 */
export const WAL_RETRIED_SWEEP_MS = 5_000;

/**
 * While a partition cannot take writes, how often the relay walks its held rows anyway, in ms (it
 * walks them at once when a partition takes writes again): a parked event an operator put back in
 * line among many held rows goes out within this.
 */
const WAL_HELD_WALK_WHILE_BLOCKED_MS = 30_000;

/**
 * What a relay says when another running relay holds the slot's lease under its own `relayId` (a
 * standby's log line, and the end of `start()`'s error message).
 */
export const WAL_SAME_RELAY_ID =
  "another running WAL relay holds the replication slot's lease under this relay's own relayId: give each " +
  'running relay its own id (--relay-id, OUTBOXKIT_RELAY_ID)';
import {
  RELAY_DEFAULTS,
  RELAY_KAFKA_OPTIONS_SHAPE,
  RELAY_PRODUCER_OPTIONS_SCHEMA,
  RELAY_RETENTION_OPTIONS_SHAPE,
  type RelayOptions,
  type RetentionOptions,
} from '../options.js';
import { RetentionCleaner } from '../cleanup.js';
import { toRecord } from '../record.js';
import {
  deleteRelayed,
  heldKeys,
  holdRelayed,
  maxSeq,
  parkRelayed,
  readHeld,
  readResync,
  transactionsVisible,
  type ResyncRow,
} from '../sql.js';
import { decodeOutboxRow } from './outbox-row.js';
import {
  createWalSlotReader,
  WAL_SLOT_READER_DEFAULTS,
  type WalSlotReader,
  type WalTransaction,
} from './slot-reader.js';
import {
  clearResyncPendingSql,
  dropSlotSql,
  ensureLogicalSlot,
  markResyncPendingSql,
  readSlot,
  readSlotMarker,
  slotCheckLockKey,
  walSlotsStatus,
  type SlotState,
} from './slot-sql.js';
import { SQLSTATE, isConnectionFailure, sqlStateOf } from '../../src/postgres.js';
import { acquireSlotLease, endSlotReader, releaseSlotLease, renewSlotLease } from './slot-lease.js';
import { checkWalServer, logWalServerNotes } from './server-check.js';

export { requireLogicalWal } from './server-check.js';

/**
 * Options of {@link createWalRelay}. The retention cleanup's (`publishedRetentionMs`,
 * `cleanupIntervalMs`, `cleanupBatchSize`, `cleanupRowsPerSecond`) are the table relay's, with the
 * same defaults: the relay holding the slot's reader lease deletes the rows marked published by
 * other paths (a table relay before a switch to WAL mode, `outboxkit parked skip`) once past
 * retention; the rows it publishes itself it deletes at once.
 */
export interface WalRelayOptions extends RetentionOptions {
  /**
   * PostgreSQL: a connection string or pg's client configuration. Used for the replication
   * connection (the role needs `REPLICATION`) and for a small pool that deletes and parks rows.
   */
  connection: string | pg.ClientConfig;
  /** Schema holding outboxkit's tables; only its `outbox_events` rows are published. @defaultValue 'outboxkit' */
  schema?: string;
  /**
   * The logical slot (pgoutput) to read. The relay creates it when it is missing, and drops and
   * creates it again when it is lost, then publishes the rows the table holds (the resync); one
   * created beforehand (`ensureLogicalSlot()`) is resynced once, at the relay's first start on it.
   * 1-63 of `[a-z0-9_]`, not starting with a digit, unique in the PostgreSQL cluster;
   * `outboxkit relay --source wal` defaults it to `walSlotName(schema)`, `<schema>_relay`.
   */
  slot: string;
  /**
   * The publication streaming `<schema>.outbox_events` inserts (`migrate({ walPublication: true })`
   * or `ensurePublication()`; default name `walPublicationName(schema)`, `<schema>_outbox_events`).
   */
  publication: string;
  /** Kafka brokers, `host:port`. Required unless `kafka` is given. */
  brokers?: string[];
  /** A Kafka client instead of `brokers`: a kafkajs `Kafka`, or an outboxkit `KafkaClient`. */
  kafka?: Kafka | KafkaClient;
  /** The client library made from `brokers`, as the table relay's option. @defaultValue 'kafkajs' */
  kafkaClient?: RelayOptions['kafkaClient'];
  /** Tunable producer settings, as the table relay's option; never its safety settings. */
  producerOptions?: RelayOptions['producerOptions'];
  /**
   * This instance's id: the owner of the slot's lease (`wal_slot_leases`), named in standbys' logs.
   * Give each running relay its own (two running with one id are told apart: the second stands
   * by, logging why); a relay restarted with its former id takes its lease back as soon as no
   * walsender reads the slot. @defaultValue `<hostname>-<pid>-<random>`
   */
  relayId?: string;
  /**
   * The slot's reader lease, in ms (database clock): renewed every third of it; a standby takes
   * over a relay that has not renewed it for this long (dead, paused, cut off from PostgreSQL) and
   * ends its walsender. The relay itself stops sending once 80 % of it has passed since its last
   * renewal was sent. 1,000 to 3,600,000, above `brokerTimeoutMs`. @defaultValue 10_000
   */
  leaseMs?: number;
  /**
   * Strict per-key order behind a parked event: its key's later events are held in the table until
   * an operator retries it (`outboxkit parked retry`, then they follow it) or skips it. `false`
   * lets them go ahead (the parked event is then out of order if it is retried). Events of other
   * keys flow either way. As the table relay's option. @defaultValue true
   */
  holdKeyBehindFailure?: boolean;
  /** Most events in one send; transactions waiting are put together up to it. @defaultValue 500 */
  batchSize?: number;
  /**
   * Most record bytes in one send (and in the queue beside it), in bytes; one transaction larger
   * than this goes alone, in several sends. Keep it below the topics' `max.message.bytes` (also
   * read from each topic and kept 10 % below). @defaultValue 900_000
   */
  maxBatchBytes?: number;
  /**
   * Longest wait for Kafka, in ms: a send's acknowledgement, a producer's connect. Past it the send
   * counts as a broker failure (held and retried). @defaultValue 5_000
   */
  brokerTimeoutMs?: number;
  /**
   * Backoff after a broker failure (and a failed delete, park or stream start): the first delay,
   * in ms, full jitter. @defaultValue 200
   */
  retryInitialMs?: number;
  /** Backoff cap, in ms (at least `retryInitialMs`). @defaultValue 10_000 */
  retryMaxMs?: number;
  /**
   * The slot reader's status update interval, in ms: keep it well below `wal_sender_timeout`.
   * `start()` refuses one not below the `wal_sender_timeout` its sessions see
   * (`InvalidOptionsError`), and warns above half of it. @defaultValue 10_000
   */
  statusIntervalMs?: number;
  /**
   * Logger. Also gets kafkajs's own log entries (warn and above) of the kafkajs client made from
   * `brokers`, as the table relay's (docs/kafka.md, "kafkajs's log"). @defaultValue no-op
   */
  logger?: Logger;
}

/** Defaults of {@link WalRelayOptions}. */
export const WAL_RELAY_DEFAULTS = Object.freeze({
  leaseMs: RELAY_DEFAULTS.leaseMs,
  holdKeyBehindFailure: RELAY_DEFAULTS.holdKeyBehindFailure,
  batchSize: RELAY_DEFAULTS.batchSize,
  maxBatchBytes: RELAY_DEFAULTS.maxBatchBytes,
  brokerTimeoutMs: RELAY_DEFAULTS.brokerTimeoutMs,
  retryInitialMs: RELAY_DEFAULTS.retryInitialMs,
  retryMaxMs: RELAY_DEFAULTS.retryMaxMs,
  statusIntervalMs: WAL_SLOT_READER_DEFAULTS.statusIntervalMs,
  publishedRetentionMs: RELAY_DEFAULTS.publishedRetentionMs,
  cleanupIntervalMs: RELAY_DEFAULTS.cleanupIntervalMs,
  cleanupBatchSize: RELAY_DEFAULTS.cleanupBatchSize,
  cleanupRowsPerSecond: RELAY_DEFAULTS.cleanupRowsPerSecond,
});

const optionsSchema = z
  .strictObject({
    connection: option.value<string | pg.ClientConfig>(
      'a connection string or a pg client configuration',
      (v) => typeof v === 'string' || (typeof v === 'object' && v !== null),
    ),
    schema: option.SHARED_OPTIONS.schema,
    slot: z.string({ error: 'must be a string' }),
    publication: z.string({ error: 'must be a string' }),
    relayId: z
      .string({ error: 'must be a string' })
      .min(1, { error: 'must not be empty' })
      .default(() => `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`),
    leaseMs: option.integer(1_000, 3_600_000).default(WAL_RELAY_DEFAULTS.leaseMs),
    ...RELAY_KAFKA_OPTIONS_SHAPE,
    producerOptions: RELAY_PRODUCER_OPTIONS_SCHEMA.optional(),
    holdKeyBehindFailure: option.boolean().default(WAL_RELAY_DEFAULTS.holdKeyBehindFailure),
    batchSize: option.integer(1).default(WAL_RELAY_DEFAULTS.batchSize),
    maxBatchBytes: option.integer(1).default(WAL_RELAY_DEFAULTS.maxBatchBytes),
    brokerTimeoutMs: option.integer(100).default(WAL_RELAY_DEFAULTS.brokerTimeoutMs),
    ...option.retryDelays({ initialMs: WAL_RELAY_DEFAULTS.retryInitialMs, maxMs: WAL_RELAY_DEFAULTS.retryMaxMs }, 1),
    statusIntervalMs: option.integer(10, 3_600_000).default(WAL_RELAY_DEFAULTS.statusIntervalMs),
    ...RELAY_RETENTION_OPTIONS_SHAPE,
    logger: option.SHARED_OPTIONS.logger,
  } satisfies Record<keyof WalRelayOptions, z.ZodType>)
  .superRefine((o, ctx) => {
    option.retryDelaysInOrder(o, ctx);
    if (o.brokerTimeoutMs >= o.leaseMs) {
      ctx.addIssue(
        option.sentence(
          `brokerTimeoutMs must be below leaseMs, got ${o.brokerTimeoutMs} and ${o.leaseMs}: a send starts while the ` +
            'lease is fresh and may wait up to brokerTimeoutMs, so with a shorter lease a standby takes over while it ' +
            `waits and its records arrive late. Lower brokerTimeoutMs or raise leaseMs (defaults ${WAL_RELAY_DEFAULTS.brokerTimeoutMs} and ${WAL_RELAY_DEFAULTS.leaseMs}).`,
        ),
      );
    }
    if (!o.kafka && !(o.brokers && o.brokers.length > 0)) {
      ctx.addIssue(option.sentence('The WAL relay needs `brokers` or `kafka`.'));
    }
    if (o.kafkaClient !== 'kafkajs' && o.kafka) {
      ctx.addIssue(
        option.sentence('kafkaClient chooses the client made from `brokers`; with `kafka` it would be ignored.'),
      );
    }
  });

/**
 * Why a WAL relay resyncs (docs/wal-source.md, "Slot loss and resync"):
 * - `missing`: the slot does not exist (the relay's first start, a slot dropped, a promoted
 *   standby: PostgreSQL 15 has no failover slots); the relay creates it;
 * - `lost`: PostgreSQL invalidated it (`wal_status = 'lost'`, past `max_slot_wal_keep_size`); the
 *   relay drops it and creates it again;
 * - `unrecorded`: the slot exists but no relay recorded it in `wal_slots` (created by hand, or
 *   before migration 0006), so rows may predate it;
 * - `interrupted`: a resync began and did not end (the relay stopped or died during it);
 * - `undecodable`: the slot's WAL cannot be decoded: its publication was dropped and created again
 *   (pgoutput looks the publication up as of each change, so a change written while it did not
 *   exist fails every reader, SQLSTATE 42704, whatever the publication is now); the relay drops
 *   the slot and creates it again.
 */
export type WalResyncReason = 'missing' | 'lost' | 'unrecorded' | 'interrupted' | 'undecodable';

/**
 * Events a WAL relay emits (`wal:action` names); `relay.on(name, listener)`. LSNs are PostgreSQL's
 * text form (`0/19782D0`, possibly zero-padded).
 */
export interface WalRelayEvents {
  /**
   * A batch was settled: `events` acknowledged by Kafka, `parked` parked, `held` held in the table
   * (their partition cannot take writes, or their key is held), `deleted` rows deleted,
   * `transactions` confirmed up to `lsn`; also for held rows and parked events an operator put back
   * in line, published from the table (`transactions` 0, `lsn` the last confirmed).
   */
  'wal:published': [
    { events: number; parked: number; held: number; deleted: number; transactions: number; lsn: string },
  ];
  /**
   * The retention cleanup deleted `deleted` published rows past `publishedRetentionMs` (once per
   * batch; as the table relay's `relay:cleaned`): rows marked published by a table relay before a
   * switch to WAL mode, or by `outboxkit parked skip`.
   */
  'wal:cleaned': [{ deleted: number }];
  /** An event Kafka refused for itself was parked in its row. */
  'wal:parked': [{ seq: string; eventId?: string; error: string }];
  /**
   * A send failed for the broker's sake (held, retried after `delayMs`), or a statement or the
   * stream failed; `database` also for a connection to PostgreSQL refused or lost while the slot
   * is checked or a reader starts.
   */
  'wal:error': [{ error: Error; attempt: number; delayMs: number; what: 'send' | 'database' | 'stream' }];
  /**
   * A page of a resync was settled: `events` acknowledged by Kafka, `parked` parked, `deleted`
   * rows deleted, the table read through seq `throughSeq` (text). Nothing is confirmed on the slot.
   */
  'wal:resync-page': [
    { slot: string; events: number; parked: number; held: number; deleted: number; throughSeq: string },
  ];
  /**
   * A resync ended: the rows of the outbox table, read in seq order, were published (`events`;
   * `deleted` rows deleted) or parked (`parked`) before the stream starts; `durationMs` in ms. It
   * began with a warning in the log naming the slot and the reason.
   */
  'wal:resync': [
    {
      slot: string;
      reason: WalResyncReason;
      events: number;
      parked: number;
      held: number;
      deleted: number;
      durationMs: number;
    },
  ];
}

/** A WAL relay. Make one with {@link createWalRelay}; it runs once. */
export interface WalRelay extends EventEmitter<WalRelayEvents> {
  /**
   * Checks the schema and the server (relay/wal/server-check.ts; docs/wal-source.md, "Start-up
   * checks"), connects the producer (or keeps trying in the background when Kafka does not
   * answer), checks the slot and starts reading it. A slot that is missing or lost is created
   * (again) here; the resync it needs then runs in the background, and the reader starts after it.
   * Once it holds the slot's lease it logs a warning when `max_slot_wal_keep_size` is -1 (no
   * limit; else an info line with its value, in MB) and when `statusIntervalMs` is above half of
   * `wal_sender_timeout`.
   *
   * @throws {@link SchemaMissingError} when `<schema>.outbox_events` or `<schema>.wal_slots` does
   *   not exist (migrate first).
   * @throws {@link UnsupportedServerError} (not retriable) when the server does not run
   *   `wal_level = logical`, or runs `max_wal_senders` or `max_replication_slots` at 0; before any
   *   slot or lease is touched.
   * @throws {@link PermissionDeniedError} (not retriable) when the role has neither `REPLICATION`
   *   nor `SUPERUSER` (nor, on Amazon RDS or Aurora, `rds_replication`); before any slot or lease
   *   is touched.
   * @throws {@link WalStreamError} (retriable) when another relay holds the slot's lease (this
   *   one is a standby: call `start()` on a new relay later; its message says for how long yet),
   *   another reader holds the slot, another relay is checking or resyncing it, or PostgreSQL
   *   cannot be reached; (not retriable) when the publication does not exist.
   * @throws {@link InvalidOptionsError} when a slot of that name exists with another plugin or in
   *   another database; when `statusIntervalMs` is not below the `wal_sender_timeout` the relay's
   *   sessions see (0 disables it), since the walsender would end a relay that waits.
   * @throws {@link LifecycleError} on a second call.
   * @throws {@link KafkaClientUnavailableError} with `kafkaClient: 'platformatic'` when
   *   @platformatic/kafka is not installed.
   */
  start(): Promise<void>;
  /**
   * Stops: takes nothing more from the stream, waits up to `timeoutMs` for the batch in flight
   * (one held by a broker failure is abandoned, unconfirmed: it comes again), stops the reader and
   * disconnects. Idempotent and memoised.
   *
   * @param options.timeoutMs - in ms. @defaultValue 10_000
   */
  stop(options?: { timeoutMs?: number }): Promise<void>;
  /**
   * Rejects when the relay stopped on an error it cannot retry (the publication was dropped, a row
   * without a readable seq, a slot of that name taken by another plugin); resolves after `stop()`.
   * A lost replication connection is retried (the slot checked, and recreated and resynced when it
   * is gone), not reported here. Awaiting it is optional.
   */
  readonly ended: Promise<void>;
  /**
   * Counters for tests and metrics: events `published` (resyncs included), `parked` and `held` (left
   * in the table behind a partition that could not take writes or a held key; published later and
   * counted then too), rows `deleted` once published, published rows past retention deleted by
   * the retention cleanup (`cleaned`), the last `confirmedLsn`, transactions `queued`, keys held now
   * (`heldKeys`), the topic-partitions that cannot take writes now (`blockedPartitions`); `resyncs` ended, the events they
   * published (`resynced`), and whether one is running (`resyncing`); whether this relay holds the
   * slot's lease now (`leaseHeld`) and its fencing token (`fencingToken`, a decimal string, or
   * undefined), the relay holding it while this one stands by (`standbyOf`: its `relayId`, or
   * undefined), and how many times this relay lost the lease (`leasesLost`).
   */
  stats(): {
    published: number;
    parked: number;
    held: number;
    deleted: number;
    cleaned: number;
    confirmedLsn: string;
    queued: number;
    heldKeys: number;
    blockedPartitions: BlockedPartition[];
    resyncs: number;
    resynced: number;
    resyncing: boolean;
    leaseHeld: boolean;
    fencingToken: string | undefined;
    standbyOf: string | undefined;
    leasesLost: number;
  };
}

/** A resync to run: why, and the session holding the slot's advisory lock until it ends. */
interface ResyncPlan {
  reason: WalResyncReason;
  lock: pg.Client;
}

interface QueuedItem {
  seq: string;
  eventId?: string;
  record?: OutboundRecord;
  /** The event's key (kept when a record is dropped to be parked): a parked event holds it. */
  key: string | null;
  /**
   * Its place in commit order, for holding it: its transaction's commit end LSN (stream), the
   * slot's confirmed position when the resync began (resync), or none (held rows, placed already).
   */
  lsn?: string;
  /** Why the row could not be decoded: parked as it comes. */
  error?: string;
  bytes: number;
  /**
   * The writer's transaction id, for rows from the stream (none for a resync's, read from the
   * table): its commit can reach the relay before other sessions see it (see settle()).
   */
  xid?: number;
}

interface QueuedTransaction {
  reader: WalSlotReader;
  commitEndLsn: string;
  items: QueuedItem[];
  bytes: number;
}

/**
 * Makes a WAL relay (docs/wal-source.md, "The relay"): it reads `<schema>.outbox_events` inserts
 * from a logical replication slot, publishes them to Kafka in commit order, deletes the published
 * rows and confirms the slot past them. Call `start()` to run it, `stop()` to end it. Needs
 * PostgreSQL at `wal_level = logical`, a role with `REPLICATION`, outboxkit's migrations and the
 * publication (`migrate({ walPublication: true })` or `ensurePublication()`;
 * `outboxkit relay --source wal` creates it when missing). The relay creates its slot when missing
 * and resyncs the rows already in the table. Writers use `createOutbox({ source: 'wal' })`.
 * Defaults: {@link WAL_RELAY_DEFAULTS}.
 *
 * Several relays may run on one slot: the one holding its lease reads, the others stand by
 * (`start()` rejects with a retriable `WalStreamError`: try again with a new relay) and take a
 * dead or paused reader over when its lease ends (docs/wal-source.md, "One reader per slot").
 *
 * Not yet (docs/wal-source.md): per-partition isolation (a broker failure holds the whole stream),
 * held keys behind a parked event.
 *
 * @throws {@link InvalidOptionsError} for invalid or unknown options (nothing is connected then).
 */
export function createWalRelay(options: WalRelayOptions): WalRelay {
  return new WalRelayImpl(options);
}

class WalRelayImpl extends EventEmitter<WalRelayEvents> implements WalRelay {
  private readonly o: ReturnType<typeof resolve>;
  private readonly log: Logger;
  private readonly q: string;
  private readonly connection: pg.ClientConfig;
  /** The producer, admin requests and the view of blocked partitions. */
  private readonly kafka: WalKafka;
  private pool: pg.Pool | undefined;
  private db: Queryable | undefined;
  private reader: WalSlotReader | undefined;
  private readonly queue: QueuedTransaction[] = [];
  private queuedEvents = 0;
  private queuedBytes = 0;
  /** Wakes the publisher loop (a transaction was queued, or stop()). */
  private wakePublisher: (() => void) | undefined;
  /** Wake the handlers that wait for room in the queue. */
  private roomWaiters: (() => void)[] = [];
  /** Cuts a backoff short on stop(). */
  private cancelSleep: (() => void) | undefined;
  private started = false;
  private stopping = false;
  private stopPromise: Promise<void> | undefined;
  private loopDone: Promise<void> | undefined;
  private streamDone: Promise<void> | undefined;
  private readonly counts = { published: 0, parked: 0, held: 0, deleted: 0, cleaned: 0, resyncs: 0, resynced: 0 };
  /** Keys whose events are held in the table: the stream's later events of them are held too. */
  private held: HeldKeys;
  private recheckTimer: NodeJS.Timeout | undefined;
  /** When the held rows were last walked (performance.now() ms), and the gate's changes then. */
  private heldWalk = { at: -Infinity, changes: -1 };
  private resyncing = false;
  /** The session holding the slot's advisory lock during a check and resync (ended by shutDown()). */
  private slotLock: pg.Client | undefined;
  /** Sends (stream batches and resync pages) run one at a time, in this chain. */
  private sendTurn: Promise<unknown> = Promise.resolve();
  private confirmedLsn = '0/0';
  /** The slot's lease while this relay holds it: its token, and until when it may act (performance.now() ms). */
  private lease: { fencingToken: string; validUntil: number } | undefined;
  private renewTimer: NodeJS.Timeout | undefined;
  private renewing: Promise<void> | undefined;
  private leasesLost = 0;
  /** This relay object's own id in the lease row: tells two running relays given one `relayId` apart. */
  private readonly instanceId = randomUUID();
  /** The walsender this relay could not end (42501), so that it says so once per walsender. */
  private unendedPid: number | undefined;
  /** The reader found the slot's WAL undecodable (see undecodable()): the next check recreates it and resyncs. */
  private slotUndecodable = false;
  private retriedTimer: NodeJS.Timeout | undefined;
  private sweeping = false;
  /** The retention cleanup (../cleanup.ts), made by start() once it holds the lease; run while it does. */
  private cleaner: RetentionCleaner | undefined;
  /** The standby's last log line, so that it logs when the owner changes, not every poll. */
  private standbyOwner: string | undefined;
  private resolveEnded!: () => void;
  private rejectEnded!: (err: unknown) => void;
  readonly ended: Promise<void>;

  constructor(options: WalRelayOptions) {
    super();
    this.o = resolve(options);
    this.log = this.o.logger;
    this.q = quoteSchema(this.o.schema);
    this.connection =
      typeof this.o.connection === 'string' ? { connectionString: this.o.connection } : { ...this.o.connection };
    const client = this.o.kafka
      ? kafkaClientOf(this.o.kafka)
      : this.o.kafkaClient === 'platformatic'
        ? createPlatformaticClient({ clientId: 'outboxkit-wal-relay', brokers: this.o.brokers! })
        : createKafkajsClient(
            { clientId: 'outboxkit-wal-relay', brokers: this.o.brokers! },
            // As the table relay: kafkajs's entries to the logger given, else to kafkajs's console logger.
            { logLevel: 'warn', ...(options.logger ? { logger: options.logger } : {}) },
          );
    this.kafka = new WalKafka(
      client,
      {
        brokerTimeoutMs: this.o.brokerTimeoutMs,
        maxBatchBytes: this.o.maxBatchBytes,
        producerOptions: options.producerOptions,
      },
      this.log,
    );
    this.held = new HeldKeys(this.kafka.gate);
    this.ended = new Promise<void>((res, rej) => {
      this.resolveEnded = res;
      this.rejectEnded = rej;
    });
    this.ended.catch(() => {});
  }

  async start(): Promise<void> {
    if (this.started) throw new LifecycleError('WalRelay.start() was called twice; make a new relay.');
    this.started = true;
    if (this.o.kafkaClient === 'platformatic') await loadPlatformaticKafka();
    // Deletes, parks, the lease and the held walks take two; the third is the retention cleanup's
    // (one statement at a time), so that its batches leave the relay's own statements the two.
    const pool = new pg.Pool({ ...this.connection, max: 3, application_name: 'outboxkit-wal-relay' });
    pool.on('error', (err) => this.log.warn({ err }, 'idle PostgreSQL connection failed'));
    this.pool = pool;
    this.db = {
      query: async <R>(text: string, values: readonly unknown[] = []) => {
        const result = await pool.query(text, [...values]);
        return { rows: result.rows as R[], rowCount: result.rowCount ?? 0 };
      },
    };
    let resync: ResyncPlan | undefined;
    try {
      await pool.query(`SELECT wal_lsn FROM ${this.q}.outbox_events LIMIT 0`).catch((err: unknown) => {
        if (sqlStateOf(err) !== SQLSTATE.UNDEFINED_COLUMN) throw err;
        throw new SchemaMissingError(
          `${this.o.schema}.outbox_events has no wal_lsn column (migration 0008); run \`outboxkit migrate --schema ${this.o.schema}\` or migrate() first.`,
          { cause: err },
        );
      });
      // A server that cannot decode its WAL, a role that may not replicate, a status interval the
      // walsender would end the relay for: no retry can help, and nothing is touched yet.
      const serverNotes = await checkWalServer(this.db, { statusIntervalMs: this.o.statusIntervalMs });
      const publication = await pool.query('SELECT 1 FROM pg_publication WHERE pubname = $1', [this.o.publication]);
      if (publication.rowCount !== 1) {
        // Checked here: with a resync to run, the reader (which would refuse it) starts later.
        throw new WalStreamError(
          `Publication ${this.o.publication} does not exist; create it with migrate({ walPublication }) or ensurePublication().`,
          { retriable: false },
        );
      }
      // A standby goes no further (its caller tries again with a new relay).
      // Someone else's slot (another database, another plugin) is refused before the lease is
      // taken: a relay must never end that slot's reader (claimSlot() ends a former reader's).
      refuseForeignSlot(this.o.slot, await readSlot(this.db, this.o.slot));
      const busy = await this.claimSlot(false);
      if (busy !== undefined) {
        throw new WalStreamError(
          `Replication slot ${this.o.slot} is read by WAL relay ${busy.owner}, whose lease ends in ${busy.remainingMs} ms ` +
            `unless renewed; this relay stands by (start a new one to try again)${busy.sameId ? `. ${WAL_SAME_RELAY_ID}.` : '.'}`,
          { retriable: true },
        );
      }
      // Said by the relay that reads the slot, once: a standby tries again with a new relay, often.
      logWalServerNotes(this.log, serverNotes, { slot: this.o.slot });
      await this.warnOtherSlots();
      await this.loadHeldKeys();
      // The broker may be down at start: the relay starts anyway and its sends back off.
      await this.kafka
        .producer()
        .catch((err: unknown) =>
          this.log.warn({ err }, 'Kafka producer could not connect at start; retrying with backoff'),
        );
      resync = await this.checkSlot();
      // With a resync to run, the reader starts after it (watchStream()).
      if (resync === undefined) {
        try {
          this.reader = await this.startReader();
        } catch (err) {
          // The stream watcher resyncs an undecodable slot (after another check of the slot), and
          // retries a reader that cannot start yet (a former reader's walsender still holds the
          // slot), keeping the lease meanwhile.
          const retriable = isOutboxkitError(err) && err.retriable;
          if (!retriable && !(await this.undecodable(err))) throw err;
          if (retriable)
            this.log.warn({ err, slot: this.o.slot }, 'the reader cannot start yet; retrying with backoff');
        }
      }
    } catch (err) {
      await this.shutDown();
      throw schemaMissingOr(err, this.o.schema);
    }
    this.loopDone = this.publishLoop().catch((err: unknown) => this.fail(err));
    this.retriedTimer = setInterval(() => void this.drainHeld(false), WAL_RETRIED_SWEEP_MS);
    this.retriedTimer.unref();
    this.recheckTimer = setInterval(() => void this.recheckPartitions(), PARTITION_RECHECK_MS);
    this.recheckTimer.unref();
    this.cleaner = new RetentionCleaner({
      db: this.db,
      schema: this.q,
      publishedRetentionMs: this.o.publishedRetentionMs,
      cleanupIntervalMs: this.o.cleanupIntervalMs,
      cleanupBatchSize: this.o.cleanupBatchSize,
      cleanupRowsPerSecond: this.o.cleanupRowsPerSecond,
      // One cleaner per slot: the reader (a standby, or a relay that lost the lease, deletes
      // nothing); it stops between batches when the relay stops or loses the lease.
      mayRun: () => !this.stopping && this.holdsLease(),
      logger: this.log,
      onCleaned: (deleted) => {
        this.counts.cleaned += deleted;
        this.emit('wal:cleaned', { deleted });
      },
    });
    this.cleaner.start();
    this.streamDone = this.watchStream(this.reader, resync).catch((err: unknown) => this.fail(err));
    this.log.info(
      {
        slot: this.o.slot,
        schema: this.o.schema,
        relayId: this.o.relayId,
        fencingToken: this.lease?.fencingToken,
        resync: resync?.reason,
      },
      'WAL relay started',
    );
  }

  stop(options: { timeoutMs?: number } = {}): Promise<void> {
    this.stopPromise ??= (async () => {
      this.stopping = true;
      this.wakeAll();
      // Ends a pause between cleanup batches at once; shutDown() waits for the batch in flight.
      void this.cleaner?.stop();
      if (this.loopDone) {
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([
          Promise.all([this.loopDone, this.sendTurn]),
          new Promise((r) => (timer = setTimeout(r, options.timeoutMs ?? 10_000))),
        ]);
        clearTimeout(timer);
      }
      await this.shutDown();
      await this.streamDone;
      // The LSN this relay confirmed last (none when it confirmed nothing: the slot reader's log has the slot's).
      this.log.info(
        { slot: this.o.slot, confirmedLsn: this.confirmedLsn === '0/0' ? undefined : this.confirmedLsn },
        'WAL relay stopped',
      );
      this.resolveEnded();
    })();
    return this.stopPromise;
  }

  stats() {
    return {
      ...this.counts,
      confirmedLsn: this.confirmedLsn,
      queued: this.queue.length,
      heldKeys: this.held.size,
      // The gate counts no keys for the WAL relay (it holds them here): counted from the held ones.
      blockedPartitions: this.kafka.gate.blocked().map((b) => ({ ...b, keys: this.held.on(b.topic, b.partition) })),
      resyncing: this.resyncing,
      leaseHeld: this.holdsLease(),
      fencingToken: this.lease?.fencingToken,
      standbyOf: this.standbyOwner,
      leasesLost: this.leasesLost,
    };
  }

  private fail(err: unknown): void {
    if (this.stopping) return;
    this.log.error({ err }, 'WAL relay stopped on an error it cannot retry');
    this.rejectEnded(err);
    void this.stop();
  }

  private wakeAll(): void {
    this.wakePublisher?.();
    this.cancelSleep?.();
    for (const w of this.roomWaiters.splice(0)) w();
  }

  private async shutDown(): Promise<void> {
    clearInterval(this.retriedTimer);
    clearInterval(this.recheckTimer);
    await this.cleaner?.stop();
    await this.reader?.stop({ timeoutMs: 1_000 }).catch(() => undefined);
    await this.slotLock?.end().catch(() => undefined);
    this.slotLock = undefined;
    await this.releaseLease();
    await this.kafka.close();
    await this.pool?.end().catch(() => undefined);
    this.pool = undefined;
  }

  // ---- the stream ----

  private async startReader(): Promise<WalSlotReader> {
    const reader: WalSlotReader = createWalSlotReader({
      connection: this.connection,
      slot: this.o.slot,
      publication: this.o.publication,
      statusIntervalMs: this.o.statusIntervalMs,
      logger: this.log,
      handler: (tx) => this.onTransaction(reader, tx),
    });
    await reader.start();
    return reader;
  }

  /**
   * Runs the resync start() planned, if any, then watches the reader: a lost connection
   * (retriable) or a lost lease is followed, after backoff, by the lease taken again (or waited
   * for, as a standby), a check of the slot (recreated and resynced when it is missing or lost) and
   * a new reader from the slot's confirmed position; the transactions the lost one had queued are
   * dropped (the new one hands them over again). An error it cannot retry ends the relay.
   */
  private async watchStream(first: WalSlotReader | undefined, firstResync: ResyncPlan | undefined): Promise<void> {
    let reader = first;
    let resync = firstResync;
    let attempt = 0;
    for (;;) {
      if (reader !== undefined) {
        try {
          await reader.ended;
          if (this.stopping) return;
          // Stopped by loseLease(): stand by, then read again once the lease is this relay's.
          this.dropQueued(reader);
        } catch (err) {
          if (this.stopping) return;
          if (!isOutboxkitError(err) || (!err.retriable && !(await this.undecodable(err)))) throw err;
          this.dropQueued(reader);
          attempt++;
          const delayMs = this.backoffMs(attempt);
          this.log.warn({ err, attempt, delayMs }, 'replication stream lost; reading the slot again after backoff');
          this.emit('wal:error', { error: err, attempt, delayMs, what: 'stream' });
          await this.sleep(delayMs);
        }
      }
      // A new reader, until one starts (another reader may hold the slot for a while); the slot
      // is checked first, and a resync runs to its end before any streamed event is published.
      for (;;) {
        if (this.stopping) return;
        try {
          if (resync === undefined) {
            const busy = await this.claimSlot(true);
            if (busy !== undefined) {
              // A standby: polls the lease every third of it (or sooner when it ends sooner).
              await this.sleep(Math.max(50, Math.min(this.o.leaseMs / 3, busy.remainingMs + 50)));
              continue;
            }
          }
          await this.loadHeldKeys();
          const plan = resync ?? (await this.checkSlot());
          resync = undefined;
          if (plan !== undefined && !(await this.resync(plan))) {
            if (this.stopping) return;
            throw new WalStreamError(`The resync of slot ${this.o.slot} stopped: this relay lost the slot's lease.`, {
              retriable: true,
            });
          }
          if (this.stopping) return;
          reader = await this.startReader();
          this.reader = reader;
          attempt = 0;
          break;
        } catch (err) {
          if (!isOutboxkitError(err) || !err.retriable) throw err;
          attempt++;
          const delayMs = this.backoffMs(attempt);
          // PostgreSQL refusing or cutting the connection (checking the slot, starting a reader) is
          // the database's failure; the slot held by another reader or relay is the stream's.
          const what = isConnectionFailure(err) ? 'database' : 'stream';
          this.emit('wal:error', { error: err, attempt, delayMs, what });
          await this.sleep(delayMs);
        }
      }
      if (this.stopping || !this.holdsLease()) await reader.stop({ timeoutMs: 1_000 });
    }
  }

  /**
   * Whether `err`, a reader's failure, says the slot's WAL cannot be decoded: SQLSTATE 42704
   * (undefined_object) while the publication and the slot both exist. That is a publication
   * dropped and created again: pgoutput looks it up as of each change, so the changes written
   * while it did not exist fail every reader, forever. Sets {@link slotUndecodable}, so the next
   * check of the slot drops it, creates it again and resyncs (the table holds every unpublished
   * row). A publication that does not exist now stays an error the relay cannot retry (the CLI
   * creates it at its next start).
   */
  private async undecodable(err: unknown): Promise<boolean> {
    if (sqlStateOf(err) !== SQLSTATE.UNDEFINED_OBJECT || this.db === undefined) return false;
    try {
      const { rows } = await this.db.query<{ publication: boolean; slot: boolean }>(
        `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1) AS publication,
                EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2) AS slot`,
        [this.o.publication, this.o.slot],
      );
      if (rows[0]?.publication !== true || rows[0]?.slot !== true) return false;
    } catch {
      return false;
    }
    this.log.warn(
      { slot: this.o.slot, publication: this.o.publication, err },
      'the slot cannot decode its WAL (its publication was dropped and created again): recreating the slot and resyncing',
    );
    this.slotUndecodable = true;
    return true;
  }

  /**
   * Walks the rows held in the table in commit order (`readHeld()`, a page per turn of the send
   * chain, so stream batches go between pages) and publishes those nothing holds any more, through
   * the stream's send, park and delete path: held rows whose partition takes writes again, and
   * parked events an operator put back in line (`outboxkit parked retry`). A key stays held while
   * a row of it stays in the table: its partition cannot take writes yet, or it is parked (with
   * `holdKeyBehindFailure`). At the end of the walk, in the same turn as its last read, the relay's
   * held keys become those: rows the stream held meanwhile come after the walk's position (their
   * commit LSN is higher), so the walk met them.
   *
   * Run every {@link WAL_RETRIED_SWEEP_MS} (every {@link WAL_HELD_WALK_WHILE_BLOCKED_MS} while a
   * partition cannot take writes and none changed, so that a long outage's held rows are not read
   * again and again), and at once (`now`) when a partition takes writes again; while this relay
   * holds the lease and no resync runs (a resync publishes and holds as the stream does). A
   * failure is logged and left to the next walk.
   */
  private async drainHeld(now: boolean): Promise<void> {
    if (this.sweeping || this.stopping || this.resyncing || !this.holdsLease() || this.db === undefined) return;
    if (
      !now &&
      this.kafka.gate.anyBlocked &&
      this.kafka.gate.changes === this.heldWalk.changes &&
      performance.now() - this.heldWalk.at < WAL_HELD_WALK_WHILE_BLOCKED_MS
    ) {
      return;
    }
    this.sweeping = true;
    this.heldWalk = { at: performance.now(), changes: this.kafka.gate.changes };
    const totals = { events: 0, parked: 0, held: 0, deleted: 0 };
    try {
      const stay = new HeldKeys(this.kafka.gate);
      // Held keys read back from the table meanwhile (a new reader) are newer than this walk's.
      const base = this.held;
      let after = { lsn: '0/0', seq: '0' };
      for (;;) {
        const page = await this.exclusive(async () => {
          const rows = await readHeld(this.db!, this.q, {
            afterLsn: after.lsn,
            afterSeq: after.seq,
            maxRows: this.o.batchSize,
            maxBytes: this.o.maxBatchBytes,
          });
          if (rows.length === 0) {
            // The walk's end, in the turn of its last read: no stream batch held rows since.
            if (this.held === base) this.held = stay;
            return undefined;
          }
          const settled = { events: 0, parked: 0, held: 0, deleted: 0 };
          let items: QueuedItem[] = [];
          let itemKeys = new Set<string | null>();
          /** Settles the rows gathered so far; false when the relay stopped first. */
          const flush = async (): Promise<boolean> => {
            if (items.length === 0) return true;
            const done = await this.settle(items, stay, false);
            if (done === undefined) return false;
            settled.events += done.events;
            settled.parked += done.parked;
            settled.deleted += done.deleted;
            items = [];
            itemKeys = new Set();
            return true;
          };
          for (const row of rows) {
            if (row.parked) {
              // It stays parked; with holdKeyBehindFailure its key's LATER rows stay behind it. A
              // row of its key before it (an operator retried the oldest of several parked events
              // of one key) goes first: what was gathered is settled before the key is held.
              if (this.o.holdKeyBehindFailure) {
                if (itemKeys.has(row.key) && !(await flush())) return undefined;
                stay.add(row.key);
              }
              continue;
            }
            items.push(tableItem(row));
            itemKeys.add(row.key);
          }
          if (!(await flush())) return undefined;
          const last = rows[rows.length - 1]!;
          after = { lsn: last.lsn, seq: last.seq };
          return settled;
        });
        if (page === undefined) break;
        this.count({ ...page, held: 0 });
        totals.events += page.events;
        totals.parked += page.parked;
        totals.deleted += page.deleted;
      }
      if (totals.events + totals.parked > 0) {
        this.log.info({ slot: this.o.slot, ...totals, heldKeys: this.held.size }, 'held events settled from the table');
        this.emit('wal:published', { ...totals, transactions: 0, lsn: this.confirmedLsn });
      }
    } catch (err) {
      this.log.warn({ err, slot: this.o.slot }, 'publishing held events from the table failed; trying again later');
    } finally {
      this.sweeping = false;
    }
  }

  /**
   * Warns, once at the start of the slot's reader, about the other replication slots of this
   * outbox that WAL relays recorded (`<schema>.wal_slots`) and that still exist: a WAL relay on
   * each publishes every event once per slot, and a slot no relay reads keeps the server's WAL
   * (docs/wal-source.md, "One reader per slot, standbys, and scaling"). A failure to read them
   * is logged and does not stop the start.
   */
  private async warnOtherSlots(): Promise<void> {
    try {
      const others = (await walSlotsStatus(this.db!, this.q, this.o.slot)).filter(
        (s) => s.slot !== this.o.slot && s.exists,
      );
      if (others.length === 0) return;
      this.log.warn(
        {
          slot: this.o.slot,
          otherSlots: others.map((s) => ({ slot: s.slot, active: s.active, retainedBytes: s.retainedBytes })),
        },
        `other replication slot(s) of this outbox exist: ${others.map((s) => s.slot).join(', ')}. ` +
          'A WAL relay on each slot publishes every event once per slot (consumers get duplicates), and a slot ' +
          'no relay reads keeps WAL on the server; give every WAL relay of one outbox the same --wal-slot, and ' +
          'drop a slot no longer used with `outboxkit wal drop-slot --wal-slot <name>`',
      );
    } catch (err) {
      this.log.warn({ err, slot: this.o.slot }, "could not read this outbox's other replication slots");
    }
  }

  /**
   * Reads the keys of the rows held in the table (and of parked rows, with
   * `holdKeyBehindFailure`) before a resync or a reader starts, so that the stream's later events
   * of those keys are held behind them: this relay, or another, held them before.
   *
   * @throws {@link WalStreamError} (retriable) when PostgreSQL fails.
   */
  private async loadHeldKeys(): Promise<void> {
    try {
      this.held = new HeldKeys(
        this.kafka.gate,
        await heldKeys(this.db!, this.q, { parked: this.o.holdKeyBehindFailure }),
      );
    } catch (err) {
      const e = permissionDeniedOr(schemaMissingOr(err, this.o.schema), this.o.schema);
      if (isOutboxkitError(e)) throw e;
      throw new WalStreamError(`Reading the held keys of ${this.o.schema}.outbox_events failed: ${String(err)}`, {
        cause: err,
        retriable: true,
      });
    }
    if (this.held.size > 0) this.log.info({ slot: this.o.slot, heldKeys: this.held.size }, 'keys held in the table');
  }

  // ---- the lease: one reader per slot ----

  /**
   * Takes the slot's lease, or renews it when this relay holds it (./slot-lease.ts), and starts
   * renewing it; then ends a walsender that still reads the slot: a former owner's, whose lease
   * ran out (a paused process keeps its connection, and so the slot, until `wal_sender_timeout`).
   * Without the right to end it (SQLSTATE 42501) it logs how to grant it; the reader's start then
   * fails and is retried until the walsender goes.
   *
   * @param running - false from start() (which rejects instead of logging that it stands by).
   * @returns undefined when this relay holds the lease; else who holds it and for how long yet, in ms.
   * @throws {@link WalStreamError} (retriable) when PostgreSQL fails; {@link SchemaMissingError}
   *   before migration 0007; {@link PermissionDeniedError} when the role may not use `wal_slot_leases`.
   */
  private async claimSlot(
    running: boolean,
  ): Promise<{ owner: string; remainingMs: number; sameId?: boolean } | undefined> {
    const slot = this.o.slot;
    const sentAt = performance.now();
    try {
      const got = await acquireSlotLease(this.db!, this.q, {
        slot,
        ownerId: this.o.relayId,
        instanceId: this.instanceId,
        leaseMs: this.o.leaseMs,
      });
      if (!got.acquired) {
        // start() rejects instead, saying the same (its caller says what it does about it, once).
        if (running && this.standbyOwner !== got.owner) {
          if (got.sameId) this.log.warn({ slot, relayId: got.owner }, `${WAL_SAME_RELAY_ID}; standing by`);
          else {
            this.log.info(
              { slot, owner: got.owner, remainingMs: got.remainingMs },
              'another WAL relay holds the replication slot; standing by',
            );
          }
        }
        this.standbyOwner = got.owner;
        return { owner: got.owner, remainingMs: got.remainingMs, sameId: got.sameId };
      }
      this.standbyOwner = undefined;
      if (got.tookOverFrom !== undefined) {
        this.log.warn(
          { slot, from: got.tookOverFrom, fencingToken: got.fencingToken },
          'took over the replication slot from a WAL relay whose lease expired',
        );
      }
      this.lease = { fencingToken: got.fencingToken, validUntil: sentAt + this.o.leaseMs * LEASE_ACT_FRACTION };
      if (this.stopping) {
        // stop() came meanwhile (and released nothing yet taken): give it back, read nothing.
        await this.releaseLease();
        return { owner: this.o.relayId, remainingMs: 0 };
      }
      this.renewTimer ??= setInterval(() => void this.renew(), Math.max(100, Math.floor(this.o.leaseMs / 3)));
      this.renewTimer.unref();
    } catch (err) {
      // Before migration 0007, or a role without the lease table's privileges: not retriable.
      const e = permissionDeniedOr(schemaMissingOr(err, this.o.schema), this.o.schema);
      if (isOutboxkitError(e)) throw e;
      throw new WalStreamError(`Taking the lease of replication slot ${slot} failed: ${String(err)}`, {
        cause: err,
        retriable: true,
      });
    }
    try {
      const pid = await endSlotReader(this.db!, slot, 5_000);
      if (pid !== undefined) {
        this.log.warn({ slot, pid }, "ended the walsender that held the replication slot past its relay's lease");
      }
    } catch (err) {
      if (sqlStateOf(err) !== SQLSTATE.INSUFFICIENT_PRIVILEGE) {
        throw new WalStreamError(`Ending the former reader of replication slot ${slot} failed: ${String(err)}`, {
          cause: err,
          retriable: true,
        });
      }
      const { rows } = await this.db!.query<{ pid: number }>(
        'SELECT active_pid AS pid FROM pg_replication_slots WHERE slot_name = $1',
        [slot],
      ).catch(() => ({ rows: [] as { pid: number }[] }));
      if (rows[0]?.pid !== undefined && rows[0].pid === this.unendedPid) return undefined; // said already
      this.unendedPid = rows[0]?.pid;
      this.log.warn(
        { slot, pid: this.unendedPid, error: err instanceof Error ? err.message : String(err) },
        'a walsender still holds the replication slot and this role may not end it: grant pg_signal_backend to ' +
          "the relay's role (or run the relays as one role); the slot frees at wal_sender_timeout",
      );
    }
    return undefined;
  }

  /** Whether this relay may act on the slot: it holds the lease and 80 % of it has not passed since the last renewal was sent. */
  private holdsLease(): boolean {
    return this.lease !== undefined && performance.now() < this.lease.validUntil;
  }

  /** Renews the lease (every third of it); a lease taken over, or not renewed in time, is lost. */
  private renew(): Promise<void> {
    this.renewing ??= (async () => {
      const lease = this.lease;
      if (lease === undefined || this.stopping) return;
      const sentAt = performance.now();
      try {
        const held = await renewSlotLease(this.db!, this.q, {
          slot: this.o.slot,
          ownerId: this.o.relayId,
          fencingToken: lease.fencingToken,
          leaseMs: this.o.leaseMs,
        });
        if (this.lease !== lease) return;
        if (!held) {
          this.loseLease('another relay took it over');
          return;
        }
        lease.validUntil = sentAt + this.o.leaseMs * LEASE_ACT_FRACTION;
      } catch (err) {
        this.log.warn({ err, slot: this.o.slot }, "renewing the replication slot's lease failed; retrying");
      }
      if (this.lease === lease && !this.holdsLease()) this.loseLease('not renewed in time');
    })().finally(() => (this.renewing = undefined));
    return this.renewing;
  }

  /**
   * Stops acting on the slot: stops the reader (its queued transactions dropped, unconfirmed: the
   * next reader, this relay's or another's, hands them over again) and stops renewing. The stream
   * watcher then stands by until the lease is this relay's again.
   */
  private loseLease(why: string): void {
    if (this.lease === undefined) return;
    this.log.warn(
      { slot: this.o.slot, why, fencingToken: this.lease.fencingToken },
      "lost the replication slot's lease: stopping the reader, standing by",
    );
    this.lease = undefined;
    this.leasesLost += 1;
    clearInterval(this.renewTimer);
    this.renewTimer = undefined;
    const reader = this.reader;
    if (reader !== undefined) {
      this.dropQueued(reader);
      void reader.stop({ timeoutMs: 1_000 }).catch(() => undefined);
    }
  }

  /** Gives the lease up at stop, after the reader stopped, so a standby takes over at once. */
  private async releaseLease(): Promise<void> {
    clearInterval(this.renewTimer);
    this.renewTimer = undefined;
    await this.renewing;
    const lease = this.lease;
    this.lease = undefined;
    if (lease === undefined || this.db === undefined) return;
    await releaseSlotLease(this.db, this.q, {
      slot: this.o.slot,
      ownerId: this.o.relayId,
      fencingToken: lease.fencingToken,
    }).catch((err: unknown) =>
      this.log.warn(
        { err, slot: this.o.slot },
        "could not release the slot's lease; a standby takes over when it ends",
      ),
    );
  }

  // ---- the slot and the resync ----

  /**
   * Checks the slot under a session advisory lock of its own (one relay checks or resyncs a slot
   * at a time) and prepares the resync it needs: marks it pending in `wal_slots` (committed), then
   * drops a lost slot and creates a missing one. The marker comes first, so a crash anywhere
   * after it leaves a resync pending for the next start.
   *
   * @returns the resync to run (holding the lock until it ends), or undefined when the slot is
   *   healthy and recorded.
   * @throws {@link WalStreamError} (retriable) when another relay holds the lock or another reader
   *   the slot, or PostgreSQL fails; {@link InvalidOptionsError} for a slot of another plugin or
   *   database; {@link SchemaMissingError} when `wal_slots` does not exist.
   */
  private async checkSlot(): Promise<ResyncPlan | undefined> {
    const slot = this.o.slot;
    const client = new pg.Client({ ...this.connection, application_name: 'outboxkit-wal-relay' });
    client.on('error', (err) => this.log.warn({ err }, 'slot check connection failed'));
    const db: Queryable = {
      query: async <R>(text: string, values: readonly unknown[] = []) => {
        const result = await client.query(text, [...values]);
        return { rows: result.rows as R[], rowCount: result.rowCount ?? 0 };
      },
    };
    let keep = false;
    try {
      await client.connect();
      const { rows } = await db.query<{ locked: boolean }>(
        'SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS locked',
        [slotCheckLockKey(slot)],
      );
      if (rows[0]?.locked !== true) {
        throw new WalStreamError(`Another WAL relay is checking or resyncing slot ${slot}; retry later.`, {
          retriable: true,
        });
      }
      const state = await readSlot(db, slot);
      refuseForeignSlot(slot, state);
      const marker = await readSlotMarker(db, this.q, slot);
      const reason: WalResyncReason | undefined =
        state === undefined
          ? 'missing'
          : state.walStatus === 'lost'
            ? 'lost'
            : this.slotUndecodable
              ? 'undecodable'
              : marker === undefined
                ? 'unrecorded'
                : marker.resyncPending
                  ? 'interrupted'
                  : undefined;
      if (reason === undefined) return undefined;
      if (state?.active === true && reason !== 'missing') {
        // Another reader streams it (a lost slot cannot be dropped while held, and a resync beside
        // a reader would publish out of order): wait for it to go.
        throw new WalStreamError(
          `Replication slot ${slot} needs a resync (${reason}) but another reader holds it (PID ${state.activePid ?? '?'}); retrying.`,
          { retriable: true },
        );
      }
      this.log.warn(
        { slot, reason, walStatus: state?.walStatus, previousReason: marker?.resyncReason },
        reason === 'missing' || reason === 'lost' || reason === 'undecodable'
          ? `replication slot ${reason}: creating it${reason === 'missing' ? '' : ' again'}, then publishing every row of the outbox table before streaming (resync)`
          : `replication slot needs a resync (${reason}): publishing every row of the outbox table before streaming`,
      );
      if (reason !== 'interrupted') {
        const mark = markResyncPendingSql(this.q, slot, reason);
        await db.query(mark.text, mark.values);
      }
      if (reason === 'lost' || reason === 'undecodable') {
        const drop = dropSlotSql(slot);
        await db.query(drop.text, drop.values).catch((err: unknown) => {
          if (sqlStateOf(err) !== SQLSTATE.UNDEFINED_OBJECT) throw err;
        });
      }
      if (reason === 'missing' || reason === 'lost' || reason === 'undecodable') await ensureLogicalSlot(db, slot);
      // Marked pending: a crash from here on resyncs at the next start (and an undecodable slot
      // not yet dropped fails that start's reader again, which finds it again).
      this.slotUndecodable = false;
      await crashPoint('wal-relay:slot-created');
      keep = true;
      this.slotLock = client;
      return { reason, lock: client };
    } catch (err) {
      const e = schemaMissingOr(err, this.o.schema);
      if (isOutboxkitError(e)) throw e;
      throw new WalStreamError(`Checking replication slot ${slot} failed: ${String(err)}`, {
        cause: err,
        retriable: true,
      });
    } finally {
      if (!keep) await client.end().catch(() => undefined);
    }
  }

  /**
   * The resync: publishes every row neither published nor parked with a seq up to the table's
   * highest when it begins (every row committed before the slot's consistent point is among
   * them), in seq order, `batchSize` rows (and `maxBatchBytes`) at a time, through the stream's
   * send, park and delete path; then clears the marker and releases the lock.
   *
   * @returns false when the relay stopped before it ended (the marker stays: the next start
   *   resyncs again).
   */
  private async resync(plan: ResyncPlan): Promise<boolean> {
    const began = Date.now();
    const totals = { events: 0, parked: 0, held: 0, deleted: 0 };
    this.resyncing = true;
    try {
      const through = await this.withDatabaseRetry(() => maxSeq(this.db!, this.q));
      if (through === undefined) return false;
      // The place in commit order of the rows the resync holds: after every row streamed before
      // (confirmed, so below the slot's position) and before every row the stream brings from here.
      const slot = await this.withDatabaseRetry(async () => (await readSlot(this.db!, this.o.slot)) ?? null);
      if (slot === undefined) return false;
      const place = formatLsn(slot?.confirmedFlushLsn ?? 0n);
      let after = '0';
      for (;;) {
        const rows = await this.withDatabaseRetry(() =>
          readResync(this.db!, this.q, {
            afterSeq: after,
            throughSeq: through,
            maxRows: this.o.batchSize,
            maxBytes: this.o.maxBatchBytes,
          }),
        );
        if (rows === undefined) return false;
        if (rows.length === 0) break;
        const items = rows.map((row) => tableItem(row, place));
        const settled = await this.exclusive(() => this.settle(items, this.held, true));
        if (settled === undefined) return false;
        this.count(settled);
        totals.events += settled.events;
        totals.parked += settled.parked;
        totals.held += settled.held;
        totals.deleted += settled.deleted;
        after = rows[rows.length - 1]!.seq;
        this.log.debug({ slot: this.o.slot, ...settled, throughSeq: after }, 'WAL resync page settled');
        this.emit('wal:resync-page', { slot: this.o.slot, ...settled, throughSeq: after });
      }
      const clear = clearResyncPendingSql(this.q, this.o.slot);
      if ((await this.withDatabaseRetry(() => this.db!.query(clear.text, clear.values))) === undefined) return false;
      const durationMs = Date.now() - began;
      this.counts.resyncs += 1;
      this.counts.resynced += totals.events;
      this.log.warn({ slot: this.o.slot, reason: plan.reason, ...totals, durationMs }, 'WAL relay resync done');
      this.emit('wal:resync', { slot: this.o.slot, reason: plan.reason, ...totals, durationMs });
      return true;
    } finally {
      this.resyncing = false;
      if (this.slotLock === plan.lock) this.slotLock = undefined;
      await plan.lock.end().catch(() => undefined);
    }
  }

  private count(settled: { events: number; parked: number; held: number; deleted: number }): void {
    this.counts.published += settled.events;
    this.counts.parked += settled.parked;
    this.counts.held += settled.held;
    this.counts.deleted += settled.deleted;
  }

  /** Runs `send` after the sends before it: stream batches and resync pages never overlap. */
  private exclusive<T>(send: () => Promise<T>): Promise<T> {
    const turn = this.sendTurn.then(send);
    this.sendTurn = turn.catch(() => undefined);
    return turn;
  }

  private dropQueued(reader: WalSlotReader): void {
    for (let i = this.queue.length - 1; i >= 0; i--) {
      const tx = this.queue[i]!;
      if (tx.reader !== reader) continue;
      this.queue.splice(i, 1);
      this.queuedEvents -= tx.items.length;
      this.queuedBytes -= tx.bytes;
    }
    for (const w of this.roomWaiters.splice(0)) w();
  }

  /**
   * The reader's handler: queues the transaction's outbox rows and returns, or waits while the
   * queue holds a batch's worth already (back-pressure: the reader then hands over nothing more and
   * PostgreSQL's sending waits).
   */
  private async onTransaction(reader: WalSlotReader, tx: WalTransaction): Promise<void> {
    const items: QueuedItem[] = [];
    let bytes = 0;
    for (const event of tx.events) {
      if (event.kind !== 'row' || event.table !== 'outbox_events' || event.schema !== this.o.schema) continue;
      const decoded = decodeOutboxRow(event.row);
      if (!decoded.ok) {
        if (decoded.seq === undefined) {
          // Neither publishable nor parkable: the relay stops rather than skip it (G5).
          throw new WalStreamError(
            `A row of ${this.o.schema}.outbox_events from slot ${this.o.slot} cannot be read (${decoded.error}); ` +
              "the WAL relay stopped without confirming its transaction. Check that the table has outboxkit's shape.",
            { retriable: false },
          );
        }
        items.push({ seq: decoded.seq, error: decoded.error, key: null, bytes: 0, xid: tx.xid, lsn: tx.commitEndLsn });
        continue;
      }
      const record = toRecord(decoded.row);
      const size = recordBytes(record);
      items.push({
        seq: decoded.row.seq,
        eventId: decoded.row.event_id,
        record,
        key: record.key,
        bytes: size,
        xid: tx.xid,
        lsn: tx.commitEndLsn,
      });
      bytes += size;
    }
    if (items.length === 0) {
      // Nothing of the outbox (another table of the publication): settled as it arrives; the
      // reader never confirms past a transaction before it that is not.
      reader.confirm(tx.commitEndLsn);
      return;
    }
    this.queue.push({ reader, commitEndLsn: tx.commitEndLsn, items, bytes });
    this.queuedEvents += items.length;
    this.queuedBytes += bytes;
    this.wakePublisher?.();
    while (
      !this.stopping &&
      this.queue.length > 0 &&
      (this.queuedEvents >= this.o.batchSize || this.queuedBytes >= this.o.maxBatchBytes) &&
      this.queue.some((t) => t.reader === reader)
    ) {
      await new Promise<void>((r) => this.roomWaiters.push(r));
    }
  }

  // ---- publishing ----

  private async publishLoop(): Promise<void> {
    while (!this.stopping) {
      if (this.queue.length === 0) {
        await new Promise<void>((r) => (this.wakePublisher = r));
        this.wakePublisher = undefined;
        continue;
      }
      // Whole transactions, as many as wait, up to the bounds (at least one).
      const batch: QueuedTransaction[] = [];
      let events = 0;
      let bytes = 0;
      while (this.queue.length > 0) {
        const next = this.queue[0]!;
        if (
          batch.length > 0 &&
          (events + next.items.length > this.o.batchSize || bytes + next.bytes > this.o.maxBatchBytes)
        ) {
          break;
        }
        batch.push(this.queue.shift()!);
        events += next.items.length;
        bytes += next.bytes;
        this.queuedEvents -= next.items.length;
        this.queuedBytes -= next.bytes;
      }
      for (const w of this.roomWaiters.splice(0)) w();
      await this.exclusive(() => this.publish(batch));
    }
  }

  /**
   * Settles the batch's events in commit order (settle()), then confirms the batch's transactions.
   * Returns without confirming when the relay stops meanwhile (the transactions come again to the
   * next reader).
   */
  private async publish(batch: readonly QueuedTransaction[]): Promise<void> {
    const settled = await this.settle(
      batch.flatMap((tx) => tx.items),
      this.held,
      true,
    );
    if (settled === undefined) return;
    for (const tx of batch) tx.reader.confirm(tx.commitEndLsn);
    const lsn = batch[batch.length - 1]!.commitEndLsn;
    this.confirmedLsn = lsn;
    this.count(settled);
    this.log.debug({ ...settled, transactions: batch.length, lsn }, 'WAL batch settled');
    this.emit('wal:published', { ...settled, transactions: batch.length, lsn });
  }

  /**
   * Sends the items' events in their order, parks those Kafka refuses for themselves, holds those
   * `keys` holds (their partition cannot take writes, or their key is held), and deletes the
   * acknowledged rows (the stream's batches, the resync's pages and held rows alike); the caller
   * counts. With `mark`, held rows are marked held in the table with their place in commit order
   * (`holdRelayed()`) before it returns, and so before the caller confirms their transactions;
   * held rows walked from the table are marked already.
   *
   * After a failed send the relay asks the cluster which partitions cannot take writes: the items
   * bound for those are held from then on, and the others go again. A failure the cluster does not
   * explain holds the whole call, retrying the same events with backoff.
   *
   * @returns the counts, or undefined when the relay stopped before the rows were deleted.
   */
  private async settle(
    items: QueuedItem[],
    keys: HeldKeys,
    mark: boolean,
  ): Promise<{ events: number; parked: number; held: number; deleted: number } | undefined> {
    const acked: string[] = [];
    const held: QueuedItem[] = [];
    let parked = 0;
    let attempt = 0;
    /** Items before this index go one per send: their chunk was refused for a record's sake. */
    let singlesUntil = 0;
    const holds = (item: QueuedItem): boolean =>
      item.record !== undefined && keys.holds({ topic: item.record.topic, key: item.record.key });
    let i = 0;
    while (i < items.length) {
      if (this.stopping) return undefined;
      const item = items[i]!;
      if (item.record === undefined) {
        if (!(await this.park(item, item.error ?? 'not decodable', keys))) return undefined;
        parked++;
        i++;
        continue;
      }
      if (holds(item)) {
        held.push(item);
        i++;
        continue;
      }
      let end = i + 1;
      if (i >= singlesUntil) {
        while (
          end < items.length &&
          end - i < this.o.batchSize &&
          items[end]!.record !== undefined &&
          !holds(items[end]!)
        )
          end++;
      }
      const records = items.slice(i, end).map((it) => it.record!);
      const chunk = splitByTopicLimit(records, await this.kafka.limits(records))[0]!;
      await crashPoint('wal-relay:before-send');
      if (!this.holdsLease()) {
        // Paused past its lease (or cut off from PostgreSQL): another relay may read the slot now.
        this.loseLease('expired before a send');
        return undefined;
      }
      const failure = await this.kafka.send(chunk);
      if (failure === undefined) {
        for (let k = i; k < i + chunk.length; k++) acked.push(items[k]!.seq);
        i += chunk.length;
        attempt = 0;
        continue;
      }
      if (failure.kind === 'record') {
        attempt = 0;
        // A missing topic is a record's fault that one topic listing settles for every event of
        // the call: each of them parked as it comes, without a send of its own (a send to a
        // missing topic fails only after the client's metadata retries, seconds each).
        if (await this.parkMissingTopics(items.slice(i))) continue;
        if (chunk.length > 1) {
          // kafkajs fails a request as a whole: find the record at fault one send at a time.
          singlesUntil = i + chunk.length;
          continue;
        }
        if (!(await this.park(item, `${failure.code ?? 'error'}: ${failure.error.message}`, keys))) return undefined;
        parked++;
        i++;
        continue;
      }
      // kafkajs retries an unknown topic as the broker's failure until its retries or our deadline
      // end: when the cluster answers and a topic of the chunk is missing, its events are parked.
      const sent = items.slice(i, i + chunk.length);
      if (await this.parkMissingTopics(sent)) {
        attempt = 0;
        continue;
      }
      // A partition of the chunk that cannot take writes: its events are held from now on (the
      // loop holds them as it comes to them), the others go again at once.
      if (await this.kafka.blockedBy(sent.map((it) => it.record!))) {
        attempt = 0;
        continue;
      }
      // The broker's failure, not explained by a partition: nothing is confirmed; the same events go again.
      attempt++;
      const delayMs = this.backoffMs(attempt);
      this.log.warn({ err: failure.error, attempt, delayMs }, 'send to Kafka failed; holding the stream and retrying');
      this.emit('wal:error', { error: failure.error, attempt, delayMs, what: 'send' });
      await this.sleep(delayMs);
    }
    await crashPoint('wal-relay:after-send');
    if (mark && held.length > 0 && !(await this.markHeld(held))) return undefined;
    // After the acknowledgement and before the confirmation: a crash in between republishes.
    let deleted = await this.withDatabaseRetry(() => deleteRelayed(this.db!, this.q, acked));
    if (deleted === undefined) return undefined;
    if (deleted < acked.length) {
      // Fewer rows than acknowledged: a writer's transaction can reach the stream before other
      // sessions see it committed (its commit record is flushed, and so decoded, before it leaves
      // the server's list of running transactions), and a DELETE then passes over its rows. Once
      // the batch's transactions are visible, the same DELETE takes what is left; rows still absent
      // were deleted already (a resync published them before the stream brought them again).
      const xids = items.filter((it) => it.xid !== undefined).map((it) => it.xid!);
      if (!(await this.waitVisible(xids))) return undefined;
      const again = await this.withDatabaseRetry(() => deleteRelayed(this.db!, this.q, acked));
      if (again === undefined) return undefined;
      deleted += again;
    }
    await crashPoint('wal-relay:after-delete');
    return { events: acked.length, parked, held: held.length, deleted };
  }

  /**
   * Marks `items` held in the table, in one statement (as deletes, again once their transactions
   * are visible when some rows were not found; rows still absent were published and deleted
   * already). False when the relay stopped first.
   */
  private async markHeld(items: readonly QueuedItem[]): Promise<boolean> {
    const p = { seqs: items.map((it) => it.seq), lsns: items.map((it) => it.lsn ?? null) };
    const found = await this.withDatabaseRetry(() => holdRelayed(this.db!, this.q, p));
    if (found === undefined) return false;
    if (found < items.length) {
      const xids = items.filter((it) => it.xid !== undefined).map((it) => it.xid!);
      if (!(await this.waitVisible(xids))) return false;
      if ((await this.withDatabaseRetry(() => holdRelayed(this.db!, this.q, p))) === undefined) return false;
    }
    return true;
  }

  /**
   * While some topic-partition cannot take writes: asks the cluster again (every
   * {@link PARTITION_RECHECK_MS}); when the set changed, walks the held rows at once.
   */
  private async recheckPartitions(): Promise<void> {
    if (this.stopping) return;
    if (await this.kafka.recheck()) void this.drainHeld(true);
  }

  /**
   * Marks the items whose topic does not exist for parking (as they come, in order), when the
   * cluster answers a topic listing within `brokerTimeoutMs`; true when it marked any.
   */
  private async parkMissingTopics(items: QueuedItem[]): Promise<boolean> {
    const existing = await this.kafka.existingTopics();
    if (existing === undefined) return false; // the cluster does not answer: a broker failure
    let marked = false;
    for (const item of items) {
      if (item.record === undefined || existing.has(item.record.topic)) continue;
      item.error =
        `UNKNOWN_TOPIC_OR_PARTITION: topic ${item.record.topic} does not exist ` +
        '(outboxkit does not create topics; create it, then retry the parked event)';
      item.record = undefined;
      marked = true;
    }
    return marked;
  }

  /**
   * Parks `item`'s row with `error` (and its place in commit order); with `holdKeyBehindFailure`
   * its key is held in `keys` from here on. False when the relay stopped before it could.
   */
  private async park(item: QueuedItem, error: string, keys: HeldKeys): Promise<boolean> {
    const p = { seq: item.seq, error, lsn: item.lsn };
    let done = await this.withDatabaseRetry(() => parkRelayed(this.db!, this.q, p));
    if (done === undefined) return false;
    if (!done && item.xid !== undefined) {
      // Not seen: its transaction may not be visible yet (see settle()); once it is, again.
      if (!(await this.waitVisible([item.xid]))) return false;
      done = await this.withDatabaseRetry(() => parkRelayed(this.db!, this.q, p));
      if (done === undefined) return false;
    }
    if (this.o.holdKeyBehindFailure) keys.add(item.key);
    const holds = this.o.holdKeyBehindFailure && item.key !== null;
    this.log.warn(
      { seq: item.seq, eventId: item.eventId, topic: item.record?.topic, key: item.key, error },
      holds
        ? 'event parked; the later events of its key are held in the table until it is retried or skipped'
        : 'event parked',
    );
    this.emit('wal:parked', { seq: item.seq, eventId: item.eventId, error });
    return true;
  }

  /** Runs `statement` until it succeeds (backoff between tries); undefined when the relay stops first. */
  /**
   * Waits until every transaction of `xids` (32-bit ids from the stream, committed) is visible to
   * a new snapshot of the relay's connection, polling every few ms (`transactionsVisible()`).
   *
   * @returns false when the relay stopped meanwhile.
   */
  private async waitVisible(xids: readonly number[]): Promise<boolean> {
    if (xids.length === 0) return true;
    for (let attempt = 0; ; attempt++) {
      const visible = await this.withDatabaseRetry(() => transactionsVisible(this.db!, xids));
      if (visible === undefined) return false;
      if (visible) return true;
      if (this.stopping) return false;
      await this.sleep(Math.min(2 ** attempt, 50));
    }
  }

  private async withDatabaseRetry<T>(statement: () => Promise<T>): Promise<T | undefined> {
    for (let attempt = 1; ; attempt++) {
      if (this.stopping) return undefined;
      try {
        return await statement();
      } catch (err) {
        const error = err instanceof Error ? err : new Error(String(err));
        const delayMs = this.backoffMs(attempt);
        this.log.warn({ err: error, attempt, delayMs }, 'WAL relay statement failed; retrying');
        this.emit('wal:error', { error, attempt, delayMs, what: 'database' });
        await this.sleep(delayMs);
      }
    }
  }

  private backoffMs(attempt: number): number {
    return this.o.retryInitialMs + fullJitterBackoffMs(attempt, this.o.retryInitialMs, this.o.retryMaxMs);
  }

  /** Waits `ms`, or less when stop() comes. */
  private async sleep(ms: number): Promise<void> {
    if (this.stopping) return;
    await new Promise<void>((r) => {
      const timer = setTimeout(r, ms);
      this.cancelSleep = () => {
        clearTimeout(timer);
        r();
      };
    });
    this.cancelSleep = undefined;
  }
}

/**
 * Refuses `state`, the slot named `slot`, when it is not a WAL relay's kind: another plugin's, or
 * another database's (slot names are unique in the whole PostgreSQL cluster).
 *
 * @throws {@link InvalidOptionsError} naming what the slot is.
 */
function refuseForeignSlot(slot: string, state: SlotState | undefined): void {
  if (state === undefined || (state.plugin === 'pgoutput' && state.inThisDatabase)) return;
  throw new InvalidOptionsError(
    `Replication slot ${slot} exists ${state.inThisDatabase ? `with plugin ${state.plugin}` : 'in another database'}; ` +
      'the WAL source needs a pgoutput slot in its own database. Choose another slot name.',
  );
}

/** A row read from the table as an item to settle; `lsn`: its place in commit order when it is held. */
function tableItem(row: ResyncRow, lsn?: string): QueuedItem {
  const record = toRecord(row);
  return { seq: row.seq, eventId: row.event_id, record, key: record.key, bytes: recordBytes(record), lsn };
}

function resolve(options: WalRelayOptions) {
  return option.parseOptions(optionsSchema, options, 'createWalRelay');
}
