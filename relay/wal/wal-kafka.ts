/**
 * The WAL relay's side of Kafka (./wal-relay.ts): one producer at a time, connected on first use
 * and replaced after a broker failure (its connections and sequence numbers are suspect then);
 * each send, connect and admin request bounded in time; the topics' `max.message.bytes`; which
 * topics exist; and which topic-partitions cannot take writes (relay/partitions.ts), asked through
 * one admin client kept for it. Every failure to get an answer from Kafka is the broker's
 * (`KafkaFailure.kind: 'broker'`), never an exception.
 */
import { LifecycleError } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';
import { RELAY_PRODUCER_RETRY } from '../../src/kafka/kafkajs/producer.js';
import { firstFailure } from '../../src/kafka/outcomes.js';
import { readTopicLimits } from '../../src/kafka/topic-limits.js';
import type { KafkaAdmin, KafkaClient, KafkaFailure, KafkaProducer, OutboundRecord } from '../../src/kafka/types.js';
import { withDeadline } from '../broker-health.js';
import { RELAY_PRODUCER_DEFAULTS, type RelayOptions } from '../options.js';
import { PartitionGate, clusterPartitionSource } from '../partitions.js';

/** What the WAL relay does when Kafka does not answer in time (the message of {@link withDeadline}'s error). */
const WAL_RELAY_ON_TIMEOUT = 'the WAL relay holds its stream (nothing is confirmed) and retries with backoff.';

/** What {@link WalKafka} needs of the relay's options. */
export interface WalKafkaOptions {
  /** Longest wait for a send, a connect or an admin request, in ms. */
  brokerTimeoutMs: number;
  /** Most record bytes in one send, in bytes: the fallback and cap of a topic's limit. */
  maxBatchBytes: number;
  /** Tunable producer settings, as given (never its safety settings). */
  producerOptions: RelayOptions['producerOptions'];
}

/** The WAL relay's producer, admin requests and view of the cluster's partitions. */
export class WalKafka {
  /** Which topic-partitions cannot take writes now (asked after a failed send, rechecked while any). */
  readonly gate: PartitionGate;
  private producerConnecting: Promise<KafkaProducer> | undefined;
  private readonly topicLimits = new Map<string, number>();
  /** The admin client of the partition checks, connected on first use. */
  private admin: { client: KafkaAdmin; connecting: Promise<void> } | undefined;
  private rechecking = false;
  private closed = false;

  constructor(
    private readonly client: KafkaClient,
    private readonly o: WalKafkaOptions,
    private readonly log: Logger,
  ) {
    this.gate = new PartitionGate(
      clusterPartitionSource(client, (what, fn) => this.withAdmin(what, fn)),
      log,
    );
  }

  /** One send; any failure to get an answer (connect, timeout, exception) is the broker's. */
  async send(chunk: readonly OutboundRecord[]): Promise<KafkaFailure | undefined> {
    let failure: KafkaFailure | undefined;
    try {
      const producer = await this.producer();
      failure = firstFailure(
        await withDeadline(producer.send(chunk), this.o.brokerTimeoutMs, 'a send', WAL_RELAY_ON_TIMEOUT),
      );
    } catch (err) {
      failure = { kind: 'broker', error: err instanceof Error ? err : new Error(String(err)) };
    }
    // After a broker failure the producer's connections and sequence numbers are suspect: a new one.
    if (failure?.kind === 'broker') this.dropProducer();
    return failure;
  }

  /** The connected producer, connecting one (within `brokerTimeoutMs`) if there is none. */
  producer(): Promise<KafkaProducer> {
    if (this.producerConnecting) return this.producerConnecting;
    const producer = this.client.producer({
      ...RELAY_PRODUCER_DEFAULTS,
      ...this.o.producerOptions,
      ...RELAY_PRODUCER_RETRY,
      // As the table relay: a send given up on (past brokerTimeoutMs) is failed by the adapter
      // too, so that it cannot hold up a later send of the same client producer (@platformatic/kafka;
      // ProducerSettings.sendTimeoutMs). The producer is dropped after it anyway.
      sendTimeoutMs: this.o.brokerTimeoutMs,
    });
    const connect = producer.connect();
    const connecting = withDeadline(connect, this.o.brokerTimeoutMs, 'a producer connect', WAL_RELAY_ON_TIMEOUT).then(
      () => producer,
      (err: unknown) => {
        if (this.producerConnecting === connecting) this.producerConnecting = undefined;
        // A connect that succeeds after the deadline must not leave a connection behind.
        void connect.then(() => producer.disconnect()).catch(() => undefined);
        throw err;
      },
    );
    this.producerConnecting = connecting;
    return connecting;
  }

  /** `max.message.bytes` of the records' topics (read once per topic), kept 10 % below and under `maxBatchBytes`. */
  async limits(records: readonly OutboundRecord[]): Promise<(topic: string) => number> {
    const fallback = this.o.maxBatchBytes;
    const unknown = [...new Set(records.map((r) => r.topic))].filter((t) => !this.topicLimits.has(t));
    if (unknown.length > 0) {
      try {
        const read = await this.withOneAdmin('a config read', (admin) => readTopicLimits(admin, unknown));
        for (const [topic, bytes] of read) this.topicLimits.set(topic, bytes);
      } catch (err) {
        // The broker's answer to the send decides; a record too large is then found one by one.
        this.log.debug({ err, topics: unknown }, 'could not read max.message.bytes; using maxBatchBytes');
      }
    }
    return (topic) => Math.min(fallback, Math.floor((this.topicLimits.get(topic) ?? fallback) * 0.9));
  }

  /**
   * The topics the cluster lists, within `brokerTimeoutMs`; undefined when it does not answer (a
   * broker failure). kafkajs retries an unknown topic as the broker's failure: this tells the two apart.
   */
  async existingTopics(): Promise<Set<string> | undefined> {
    try {
      return new Set(await this.withOneAdmin('a topic listing', (admin) => admin.listTopics()));
    } catch {
      return undefined;
    }
  }

  /**
   * Whether a failed send of `records` is explained by a partition that cannot take writes: asks
   * the cluster for their topics' partitions (bounded by {@link metadataTimeoutMs}); true when one
   * of them goes to a partition that cannot take writes now. False when the cluster does not
   * answer, or names none (a leader that just died is not replaced yet).
   */
  async blockedBy(records: readonly OutboundRecord[]): Promise<boolean> {
    try {
      await this.gate.refresh(records.map((r) => r.topic));
    } catch (err) {
      this.log.debug({ err }, 'the cluster did not answer a metadata request after a failed send');
      return false;
    }
    return records.some((r) => this.gate.blocks(r));
  }

  /**
   * While some topic-partition cannot take writes, asks the cluster for it again (the relay calls
   * it every `PARTITION_RECHECK_MS`); true when the set of blocked partitions changed.
   */
  async recheck(): Promise<boolean> {
    if (!this.gate.anyBlocked || this.rechecking || this.closed) return false;
    this.rechecking = true;
    try {
      const changes = this.gate.changes;
      await this.gate.refresh(this.gate.blockedTopics());
      return this.gate.changes !== changes;
    } catch (err) {
      this.log.debug({ err }, 'partition recheck failed');
      return false;
    } finally {
      this.rechecking = false;
    }
  }

  /** Disconnects the producer and the admin client, each within `brokerTimeoutMs`; no request after it. */
  async close(): Promise<void> {
    this.closed = true;
    const admin = this.admin;
    this.admin = undefined;
    if (admin) void this.disconnectAdmin(admin);
    const connecting = this.producerConnecting;
    this.producerConnecting = undefined;
    if (connecting) await this.disconnectQuietly(connecting);
  }

  private dropProducer(): void {
    const connecting = this.producerConnecting;
    this.producerConnecting = undefined;
    if (connecting) void this.disconnectQuietly(connecting);
  }

  private async disconnectQuietly(connecting: Promise<KafkaProducer>): Promise<void> {
    await connecting
      .then((p) => withDeadline(p.disconnect(), this.o.brokerTimeoutMs, 'a disconnect', WAL_RELAY_ON_TIMEOUT))
      .catch(() => undefined);
  }

  private async disconnectAdmin(admin: { client: KafkaAdmin; connecting: Promise<void> }): Promise<void> {
    await admin.connecting
      .catch(() => undefined)
      .then(() => withDeadline(admin.client.disconnect(), this.o.brokerTimeoutMs, 'a disconnect', WAL_RELAY_ON_TIMEOUT))
      .catch(() => undefined);
  }

  /**
   * Longest wait for a metadata request of the partition checks, in ms: a cluster that answers
   * does so in milliseconds (as the table relay's).
   */
  private get metadataTimeoutMs(): number {
    return Math.min(this.o.brokerTimeoutMs, 2_000);
  }

  /** `fn` with the admin client of the partition checks (connected on first use), bounded by {@link metadataTimeoutMs}. */
  private async withAdmin<T>(what: string, fn: (admin: KafkaAdmin) => Promise<T>): Promise<T> {
    if (this.closed) throw new LifecycleError('the WAL relay is stopping');
    let conn = this.admin;
    if (!conn) {
      const client = this.client.admin();
      conn = this.admin = { client, connecting: client.connect() };
    }
    try {
      await withDeadline(conn.connecting, this.metadataTimeoutMs, 'an admin connect', WAL_RELAY_ON_TIMEOUT);
      return await withDeadline(fn(conn.client), this.metadataTimeoutMs, what, WAL_RELAY_ON_TIMEOUT);
    } catch (err) {
      if (this.admin === conn) this.admin = undefined;
      void this.disconnectAdmin(conn);
      throw err;
    }
  }

  /** `fn` with an admin client of its own, connected and disconnected around it, each within `brokerTimeoutMs`. */
  private async withOneAdmin<T>(what: string, fn: (admin: KafkaAdmin) => Promise<T>): Promise<T> {
    const admin = this.client.admin();
    try {
      await withDeadline(admin.connect(), this.o.brokerTimeoutMs, 'an admin connect', WAL_RELAY_ON_TIMEOUT);
      return await withDeadline(fn(admin), this.o.brokerTimeoutMs, what, WAL_RELAY_ON_TIMEOUT);
    } finally {
      void withDeadline(admin.disconnect(), this.o.brokerTimeoutMs, 'a disconnect', WAL_RELAY_ON_TIMEOUT).catch(
        () => undefined,
      );
    }
  }
}
