/**
 * When the relay's loop runs its next pass: LISTEN wake-ups from writers (NOTIFY at commit), the
 * poll interval as the fallback, and the backoff after a failed pass.
 *
 * The LISTEN connection is a dedicated `pg.Client` (a pooled connection would lose the LISTEN when
 * the pool hands it to someone else; a transaction-pooling proxy loses it too: the relay needs a
 * session-mode connection). A dead listener only costs latency, since polling continues; it is
 * found by a bounded `SELECT 1` on each lane maintenance and rebuilt.
 */
import pg from 'pg';
import type { Logger } from '../src/logger.js';

/** Settings of {@link Wake}. */
export interface WakeOptions {
  /** Whether to LISTEN at all (`RelayOptions.listen`); without it only the poll wakes the loop. */
  listen: boolean;
  /** The NOTIFY channel of the outbox's schema (`notifyChannel(schema)`). */
  channel: string;
  /** The connection settings of the relay's pool: the listener connects with the same. */
  connection: pg.ClientConfig;
  /** Longest wait for the listener's `SELECT 1` before it counts as dead, in ms. */
  checkTimeoutMs: number;
  logger: Logger;
}

/** Wake-ups of the relay's loop: notifications, new lanes, stop. */
export class Wake {
  /** Wake-ups so far (notifications, new lanes): a pass tells by it whether rows may have come since it read. */
  wakes = 0;
  /**
   * Called once at the next wake-up, then cleared: set while a batch is in flight, to start the
   * read of the next batch when a notification comes.
   */
  onWake: (() => void) | undefined;
  private listener: pg.Client | undefined;
  private woken = false;
  private endWakeableSleep: (() => void) | undefined;
  private endSleep: (() => void) | undefined;
  private stopped = false;

  constructor(private readonly options: WakeOptions) {}

  /** Opens the LISTEN connection (when `listen`). */
  async start(): Promise<void> {
    if (!this.options.listen) return;
    const client = new pg.Client({
      ...this.options.connection,
      keepAlive: true,
      application_name: 'outboxkit-relay-listener',
    });
    client.on('notification', () => this.wakeUp());
    client.on('error', (err) => {
      // A dead listener only costs latency: polling continues, and the listener is rebuilt.
      this.options.logger.warn({ err }, 'LISTEN connection failed; polling until it is back');
      if (this.listener === client) this.listener = undefined;
      client.end().catch(() => undefined);
    });
    await client.connect();
    await client.query(`LISTEN "${this.options.channel}"`);
    this.listener = client;
  }

  /**
   * Detects a dead listener (terminated backend, half-open TCP connection) with a bounded
   * `SELECT 1`, and rebuilds it: without it the relay would silently fall back to polling.
   */
  async check(): Promise<void> {
    if (!this.options.listen || this.stopped) return;
    const listener = this.listener;
    if (listener) {
      let timer: NodeJS.Timeout | undefined;
      const alive = await Promise.race([
        listener.query('SELECT 1').then(
          () => true,
          () => false,
        ),
        new Promise<boolean>((r) => (timer = setTimeout(() => r(false), this.options.checkTimeoutMs))),
      ]);
      clearTimeout(timer);
      if (alive) return;
      this.options.logger.warn({}, 'LISTEN connection is dead; rebuilding it');
      this.listener = undefined;
      void listener.end().catch(() => undefined);
    }
    await this.start().catch((err: Error) => this.options.logger.warn({ err }, 'LISTEN reconnect failed'));
  }

  /** Ends a wakeable sleep now (or the next one at once), and runs {@link onWake}. */
  wakeUp(): void {
    this.wakes++;
    this.woken = true;
    this.endWakeableSleep?.();
    const onWake = this.onWake;
    this.onWake = undefined;
    onWake?.();
  }

  /**
   * Sleeps `ms`, ended early by {@link stop} and, when `wakeable`, by a wake-up. A backoff is not
   * wakeable: under a busy writer a notification comes every few ms, and would turn the backoff
   * after a failed pass into an immediate retry.
   */
  async sleep(ms: number, wakeable = true): Promise<void> {
    if (this.stopped) return;
    if (wakeable && this.woken) {
      this.woken = false;
      return;
    }
    await new Promise<void>((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.endSleep = done;
      if (wakeable) this.endWakeableSleep = done;
    });
    this.endSleep = undefined;
    this.endWakeableSleep = undefined;
    if (wakeable) this.woken = false;
  }

  /** Ends any sleep, now and for good (the relay is stopping). */
  stop(): void {
    this.stopped = true;
    this.wakeUp();
    this.endSleep?.();
  }

  /** Closes the LISTEN connection. */
  async close(): Promise<void> {
    const listener = this.listener;
    this.listener = undefined;
    await listener?.end().catch(() => undefined);
  }
}
