/**
 * Whether the relay can publish: its Kafka producer (built, connected, dropped and rebuilt here,
 * one at a time), the failure streak of sends, connects and probes, the probe of an idle relay,
 * and the decision to stand down.
 *
 * A relay that cannot publish for longer than one lease stands down: it releases its lanes and
 * leaves the live instances, so that a healthy relay takes them over instead of holding their
 * events back; it rejoins once a new producer connects. Every wait for Kafka is bounded by
 * `brokerTimeoutMs`: past it the broker counts as unreachable (docs/runbooks.md, broker outages).
 *
 * Time is the process's monotonic clock (`now`) and its timers, both injected for tests.
 */
import { withTimeout } from '../src/deadline.js';
import { BrokerUnavailableError } from '../src/errors.js';
import type { Logger } from '../src/logger.js';
import type { KafkaProducer } from '../src/kafka/types.js';

/** The clock and timers of {@link BrokerHealth}; the process's by default. */
export interface HealthClock {
  /** A monotonic time, in ms. */
  now(): number;
  setTimeout(fn: () => void, ms: number): { unref?(): unknown };
  clearTimeout(timer: unknown): void;
}

const systemClock: HealthClock = {
  now: () => performance.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (timer) => clearTimeout(timer as NodeJS.Timeout),
};

/** Settings and collaborators of {@link BrokerHealth}. */
export interface BrokerHealthOptions {
  /** Builds a new, unconnected producer. */
  makeProducer: () => KafkaProducer;
  /** Longest wait for Kafka (a connect, a probe, a disconnect), in ms. */
  brokerTimeoutMs: number;
  /** A failure streak longer than this (ms) makes the relay stand down. */
  leaseMs: number;
  /** Called when a failure streak reaches `leaseMs`: the relay's lane maintenance, which stands down. */
  onStandDownDue: () => void;
  logger: Logger;
  clock?: HealthClock;
}

/** The relay's producer and its failure streak. */
export class BrokerHealth {
  private current: KafkaProducer | undefined;
  /** Since when (`now`, ms) the relay has failed to publish; undefined while it can publish. */
  private failingSince: number | undefined;
  /** A send failed in the current streak (a connect alone then does not end it). */
  private sendFailing = false;
  /** When the broker last answered (`now`, ms). */
  private answeredAt = 0;
  /** A send is in flight (an idle probe would only add a request beside it). */
  private sending = false;
  private probing = false;
  private standingDownNow = false;
  private stopped = false;
  /** One rebuild at a time (the loop and a stand-down may both ask): never two live producers. */
  private rebuilding: Promise<void> | undefined;
  private standDownTimer: unknown;
  private readonly clock: HealthClock;

  constructor(private readonly options: BrokerHealthOptions) {
    this.clock = options.clock ?? systemClock;
  }

  /** The connected producer, or undefined (none yet, or dropped after a failure until a new one connects). */
  get producer(): KafkaProducer | undefined {
    return this.current;
  }

  /** The relay has released its lanes and waits for a producer that connects. */
  get standingDown(): boolean {
    return this.standingDownNow;
  }

  /**
   * How long the current failure streak has lasted, in ms, when it is longer than a lease; else
   * undefined. The relay asks at each lane maintenance and takes its share of the lanes when none
   * is due, so a stand-down ends there too (`standingDown` false): the streak may have ended
   * without {@link rejoin}, when a connect that outlasted `brokerTimeoutMs` succeeded later.
   */
  standDownDue(): number | undefined {
    const failingMs = this.failingSince === undefined ? undefined : this.clock.now() - this.failingSince;
    if (failingMs !== undefined && failingMs > this.options.leaseMs) return failingMs;
    this.standingDownNow = false;
    return undefined;
  }

  /** When the current failure streak began (ms of `now`), or undefined while the relay can publish. */
  get failingSinceMs(): number | undefined {
    return this.failingSince;
  }

  /**
   * The stand-down that came due is not taken: the cluster answers and says that only some
   * partitions cannot take writes (G7: a relay stands down only when it cannot reach the cluster as
   * a whole). The streak starts over now, so the question comes again a lease later.
   */
  postponeStandDown(): void {
    if (this.failingSince === undefined) return;
    this.failingSince = undefined;
    this.failing();
  }

  /**
   * Starts a failure streak at `since` (ms of `now`), unless one runs, and calls `onStandDownDue`
   * right when it has lasted a lease: the stand-down then comes a lease after the failing began,
   * not up to a maintenance interval later.
   */
  failing(since: number = this.clock.now()): void {
    if (this.failingSince !== undefined) return;
    this.failingSince = since;
    this.clock.clearTimeout(this.standDownTimer);
    const timer = this.clock.setTimeout(
      () => this.options.onStandDownDue(),
      Math.max(0, since + this.options.leaseMs - this.clock.now()) + 10,
    );
    timer.unref?.();
    this.standDownTimer = timer;
  }

  /**
   * The broker answered (an acknowledgement, a record's own error, a connect or a probe). A failure
   * streak that came only from connects or probes ends here; one with failed sends ends with the
   * next acknowledged send (a broker that connects but refuses every send must still stand down).
   */
  answered(): void {
    this.answeredAt = this.clock.now();
    if (!this.sendFailing) this.failingSince = undefined;
  }

  /** A send starts; resolves nothing, returns its start (ms of `now`) for {@link sendFailed}. */
  sendStarted(): number {
    this.sending = true;
    return this.clock.now();
  }

  /** A send was acknowledged (or refused for a record's own reason): the broker works. */
  sendSucceeded(): void {
    this.sending = false;
    this.sendFailing = false;
    this.answered();
  }

  /**
   * A send failed, but the cluster answered and said why (a partition that cannot take writes):
   * the broker works, and the failure streak is neither started nor ended by it.
   */
  sendAnswered(): void {
    this.sending = false;
    this.answered();
  }

  /** A send failed or got no answer in time: the failure streak starts at its start, if not before. */
  sendFailed(startedAt: number): void {
    this.sending = false;
    this.sendFailing = true;
    this.failing(startedAt);
  }

  /** The relay released its lanes (after {@link standDownDue}); true the first time of a stand-down. */
  enterStandDown(): boolean {
    if (this.standingDownNow) return false;
    this.standingDownNow = true;
    return true;
  }

  /**
   * Ends a stand-down when a producer is connected: true when the relay may rejoin (the streak is
   * forgotten; if sends still fail, it stands down again one lease later).
   */
  rejoin(): boolean {
    if (!this.current || this.stopped) return false;
    this.failingSince = undefined;
    this.sendFailing = false;
    this.standingDownNow = false;
    return true;
  }

  /** An idle relay's probe is due: a producer, no send in flight, and no answer from the broker for half of `intervalMs`. */
  probeDue(intervalMs: number): boolean {
    return this.current !== undefined && !this.sending && this.clock.now() - this.answeredAt > intervalMs / 2;
  }

  /**
   * Asks the broker for its cluster's metadata (the producer's `probe()`: a Metadata request
   * without topics), bounded by `brokerTimeoutMs`. An idle relay learns of a broker outage this
   * way, not from a send. No answer: the producer is dropped (`producer` undefined, readiness 503)
   * and rebuilt, and the failure streak starts. A producer that cannot probe (a `RelayProducer`
   * without a Kafka client) is not probed.
   */
  async probe(): Promise<void> {
    const producer = this.current;
    if (this.probing || !producer?.probe || this.stopped) return;
    this.probing = true;
    const began = this.clock.now();
    try {
      await withDeadline(producer.probe(), this.options.brokerTimeoutMs, 'a metadata probe');
      this.answered();
    } catch (err) {
      if (this.stopped) return;
      this.failing(began);
      this.options.logger.warn(
        { err },
        'Kafka did not answer the probe of an idle relay: producer dropped until one connects again',
      );
      // The producer's probing connection goes with it (disconnected once its request settles).
      void this.rebuild();
    } finally {
      this.probing = false;
    }
  }

  /**
   * Waits for a producer (the rebuild in flight, or a new one) at most `brokerTimeoutMs`; a connect
   * the broker does not answer goes on in the background (no second one meanwhile), and counts as
   * a failure from then on. The producer in place, if any, is dropped first: after a failed send its
   * state (sequence numbers, connections) is suspect.
   */
  async awaitProducer(): Promise<void> {
    const began = this.clock.now();
    await withDeadline(this.rebuild(), this.options.brokerTimeoutMs, 'a producer connect').catch(() =>
      this.failing(began),
    );
  }

  /** Drops the producer and connects a new one (one rebuild at a time). */
  rebuild(): Promise<void> {
    this.rebuilding ??= this.doRebuild().finally(() => (this.rebuilding = undefined));
    return this.rebuilding;
  }

  private async doRebuild(): Promise<void> {
    const old = this.current;
    this.current = undefined;
    await this.disconnectQuietly(old);
    if (this.stopped) return;
    const next = this.options.makeProducer();
    const began = this.clock.now();
    try {
      await next.connect();
    } catch (err) {
      this.failing(began);
      this.options.logger.warn({ err }, 'producer reconnect failed');
      return;
    }
    // Stopped while connecting: stop() did not see this producer, so it is disconnected here.
    if (this.stopped) return this.disconnectQuietly(next);
    this.current = next;
    this.answered();
  }

  /** No more rebuilds or probes; the stand-down timer is cleared. The producer stays until {@link close}. */
  stop(): void {
    this.stopped = true;
    this.clock.clearTimeout(this.standDownTimer);
  }

  /** Disconnects the producer (bounded by `brokerTimeoutMs`). */
  async close(): Promise<void> {
    const producer = this.current;
    this.current = undefined;
    await this.disconnectQuietly(producer);
  }

  /** `disconnect()` of a producer or admin client, bounded by `brokerTimeoutMs`; errors ignored. */
  async disconnectQuietly(client: { disconnect(): Promise<void> } | undefined): Promise<void> {
    if (!client) return;
    await withDeadline(client.disconnect(), this.options.brokerTimeoutMs, 'a disconnect').catch(() => undefined);
  }
}

/** What the table relay does when Kafka does not answer in time (the default of {@link withDeadline}). */
const TABLE_RELAY_ON_TIMEOUT = 'the relay backs off, reconnects, and stands down after leaseMs of failing.';

/**
 * `promise`, or a {@link BrokerUnavailableError} after `ms` (the promise goes on; its outcome is
 * then ignored). `then` says what the caller does next (the table relay's course by default).
 */
export function withDeadline<T>(
  promise: Promise<T>,
  ms: number,
  what: string,
  then = TABLE_RELAY_ON_TIMEOUT,
): Promise<T> {
  return withTimeout(
    promise,
    ms,
    () =>
      new BrokerUnavailableError(
        `Kafka did not answer ${what} within brokerTimeoutMs (${ms} ms): the broker counts as unreachable; ${then}`,
      ),
  );
}

/** No producer is connected: its last connect failed or took longer than `brokerTimeoutMs`. */
export function noProducer(brokerTimeoutMs: number): BrokerUnavailableError {
  return new BrokerUnavailableError(
    `no Kafka producer available: its last connect failed or took longer than brokerTimeoutMs (${brokerTimeoutMs} ms); ` +
      'the relay retries with backoff and stands down after leaseMs of failing.',
  );
}
