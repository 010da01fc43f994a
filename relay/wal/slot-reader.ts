/**
 * The WAL source's read path: one replication connection that reads a logical slot through
 * pg-logical-replication (pgoutput, protocol version 1, `messages` on) and hands its caller whole
 * committed transactions in commit order, one at a time, confirming to PostgreSQL only what the
 * caller confirmed (docs/wal-source.md, "Reading" and "Confirming"). It knows nothing of Kafka:
 * the caller settles each transaction's events downstream and then calls `confirm()`.
 *
 * The two traps of the library (pinned in test/wal/pgoutput-facts.test.ts) shape it:
 * - `acknowledge(lsn)` reports `lsn + 1`, so a commit end LSN `L` is confirmed as
 *   `acknowledge(L - 1)`; confirming `L` itself could skip the next transaction on reconnect.
 * - a periodic status (`timeoutSeconds > 0`) confirms whatever arrived, even with `auto: false`,
 *   so the library's is off (`timeoutSeconds: 0`) and the reader sends its own: an answer to each
 *   keepalive that asks for one, and one every `statusIntervalMs`, always with the last LSN the
 *   caller's confirmations allow, never with what merely arrived. When nothing received waits
 *   for the caller, that LSN is a keepalive's position: PostgreSQL 15 sends nothing for
 *   transactions outside the publication, and an idle outbox must not hold the slot (and the WAL
 *   of every other write) where it was (docs/wal-source.md, "An idle outbox").
 */
import pg from 'pg';
import { LogicalReplicationService, PgoutputPlugin, type Pgoutput } from 'pg-logical-replication';
import { z } from 'zod';
import { LifecycleError, WalStreamError } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';
import * as option from '../../src/options.js';
import { SQLSTATE, sqlStateOf } from '../../src/postgres.js';
import { ConfirmFrontier } from './confirm-frontier.js';
import { WAL_SLOT_READER_DEFAULTS } from './defaults.js';
import { formatLsn, parseLsn } from './lsn.js';
import { checkReplicationName, readSlot } from './slot-sql.js';

/** A row inserted into a table of the publication, as pgoutput sends it (text values decoded by the library). */
export interface WalRowEvent {
  kind: 'row';
  schema: string;
  table: string;
  /** Column name → value (pg-logical-replication's decoding: `bytea` as Buffer, `jsonb` parsed, ...). */
  row: Record<string, unknown>;
}

/** A transactional logical message (`pg_logical_emit_message(true, prefix, content)`) with the reader's prefix. */
export interface WalMessageEvent {
  kind: 'message';
  prefix: string;
  content: Buffer;
}

export type WalEvent = WalRowEvent | WalMessageEvent;

/** One committed transaction, with its events in the order it wrote them. */
export interface WalTransaction {
  /** The commit record's end LSN (`16/B374D848`): what `confirm()` takes. Ascending from one transaction to the next. */
  commitEndLsn: string;
  /** The transaction id, as pgoutput's begin message carries it. */
  xid?: number;
  /** Never empty: a transaction with nothing for the caller is not handed over (see `confirm()`). */
  events: WalEvent[];
}

/** Options of {@link createWalSlotReader}. */
export interface WalSlotReaderOptions {
  /**
   * How to connect (pg's client configuration: `connectionString`, `host`, ...; `options: '-c …'`
   * sets server settings for the replication session, such as `wal_sender_timeout`). The role needs
   * the `REPLICATION` attribute. The reader adds `replication: 'database'` itself.
   */
  connection: pg.ClientConfig;
  /** The logical slot (plugin pgoutput) to read: `ensureLogicalSlot()` creates it. */
  slot: string;
  /** The publication whose tables' inserts are handed over: `ensurePublication()` creates it. */
  publication: string;
  /**
   * Hand over transactional logical messages with this prefix, as `kind: 'message'` events, beside
   * the rows. Messages with another prefix, and non-transactional ones, are ignored.
   * @defaultValue none: messages are ignored
   */
  messagePrefix?: string;
  /**
   * Receives each committed transaction, in commit order. The next one is not handed over before
   * the returned promise settles (back-pressure). A rejection stops the reader: `ended` rejects
   * with it, and the transaction comes again to the next reader of the slot.
   */
  handler: (transaction: WalTransaction) => Promise<void>;
  /**
   * How often the reader sends PostgreSQL a status update with its confirmed LSN, in ms, whatever
   * the server asks. While the handler runs the stream is paused, so the server's keepalives wait
   * unread in the socket; these updates are what then keeps `wal_sender_timeout` (60 s by default)
   * from ending the connection. Keep it well below that timeout (PostgreSQL's own
   * `wal_receiver_status_interval` is 10 s).
   * @defaultValue 10_000
   */
  statusIntervalMs?: number;
  /** Logger. @defaultValue no-op */
  logger?: Logger;
}

/** Defaults of {@link WalSlotReaderOptions} (relay/wal/defaults.ts). */
export { WAL_SLOT_READER_DEFAULTS };

const optionsSchema = z.strictObject({
  connection: option.value<pg.ClientConfig>('a pg client configuration', (v) => typeof v === 'object' && v !== null),
  slot: z.string({ error: 'must be a string' }).superRefine((v, ctx) => refineName(v, 'slot', ctx)),
  publication: z.string({ error: 'must be a string' }).superRefine((v, ctx) => refineName(v, 'publication', ctx)),
  messagePrefix: z.string({ error: 'must be a string' }).min(1, { error: 'must not be empty' }).optional(),
  handler: option.fn<WalSlotReaderOptions['handler']>('(transaction) => Promise<void>'),
  statusIntervalMs: option.integer(10, 3_600_000).default(WAL_SLOT_READER_DEFAULTS.statusIntervalMs),
  logger: option.SHARED_OPTIONS.logger,
} satisfies Record<keyof WalSlotReaderOptions, z.ZodType>);

function refineName(name: string, what: 'slot' | 'publication', ctx: z.RefinementCtx): void {
  try {
    checkReplicationName(name, what);
  } catch (err) {
    ctx.addIssue(option.sentence((err as Error).message));
  }
}

/** What the reader holds and has done, for tests and metrics. */
export interface WalSlotReaderStats {
  /** Transactions whose commit arrived from the server (parsed off the socket). */
  received: number;
  /** Transactions handed to the handler whose promise resolved. */
  handedOver: number;
  /** Transactions received and not yet done with (the one in the handler included): the reader's memory. */
  buffered: number;
  /** The most `buffered` has been since start. */
  maxBuffered: number;
  /** The LSN the reader confirms to PostgreSQL (`16/B374D848`). */
  confirmedLsn: string;
  /** Transactions handed over that are not yet under `confirmedLsn`. */
  unconfirmed: number;
  /** Status updates sent (keepalive answers, periodic ones and those after a confirmation). */
  statusUpdates: number;
  /** Keepalives that asked for an answer and got one. */
  keepalivesAnswered: number;
}

/** A reader of one replication slot. Make one with {@link createWalSlotReader}; it runs once. */
export interface WalSlotReader {
  /**
   * Connects and starts streaming from the slot's confirmed position.
   *
   * @throws {@link WalStreamError} when the slot does not exist (not retriable), another reader
   *   holds it (SQLSTATE 55006, retriable), or the connection fails.
   * @throws {@link LifecycleError} on a second call.
   */
  start(): Promise<void>;
  /**
   * The caller settled every event of the transaction that ended at `commitEndLsn` (as handed
   * over). The reader confirms to PostgreSQL the highest commit end LSN up to which every
   * transaction handed over is confirmed, at once (one standby status update for all the
   * confirm() calls of one synchronous run, sent as it ends), so confirming out of order never
   * moves the slot past an unconfirmed transaction. Idempotent. After the stream ended it only records: a
   * confirmation that reaches no server is redelivered to the next reader (a duplicate, not a loss).
   *
   * @throws {@link InvalidOptionsError} when `commitEndLsn` is not an LSN, or no transaction
   *   handed over by this reader ended there.
   */
  confirm(commitEndLsn: string): void;
  /**
   * Stops reading: hands over nothing more, waits up to `timeoutMs` for the handler in progress,
   * sends a last status update with the confirmed LSN and closes the connection. Idempotent and
   * memoised; `ended` then resolves (unless it had rejected).
   *
   * @param options.timeoutMs - how long to wait for the handler, in ms. @defaultValue 5_000
   */
  stop(options?: { timeoutMs?: number }): Promise<void>;
  /**
   * Resolves after `stop()`; rejects with {@link WalStreamError} when the stream ended otherwise
   * (connection lost, walsender terminated, `wal_sender_timeout`), or with the handler's error.
   * Awaiting it is optional: an unobserved rejection is not reported as unhandled.
   */
  readonly ended: Promise<void>;
  stats(): WalSlotReaderStats;
}

/**
 * pgoutput with a count of the commits parsed off the socket: `parse()` runs as the bytes arrive,
 * before the library queues the message for the `data` listener, so received minus done is what
 * the reader holds in memory.
 */
class CountingPgoutputPlugin extends PgoutputPlugin {
  readonly #onCommit: () => void;

  constructor(options: Pgoutput.Options, onCommit: () => void) {
    super(options);
    this.#onCommit = onCommit;
  }

  override parse(buffer: Buffer): Pgoutput.Message {
    const message = super.parse(buffer);
    if (message.tag === 'commit') this.#onCommit();
    return message;
  }
}

/**
 * Makes a reader of `options.slot`. Back-pressure is the library's flow control
 * (`flowControl: { enabled: true }`): it pauses the socket while the `data` listener runs, and the
 * listener awaits the handler at each commit, so the server's sending waits on the handler. What
 * the reader holds beyond the transaction in the handler is what one socket read had already
 * brought (up to 64 KiB of stream; `stats().buffered` counts it).
 *
 * @throws {@link InvalidOptionsError} for invalid or unknown options.
 */
export function createWalSlotReader(options: WalSlotReaderOptions): WalSlotReader {
  const o = option.parseOptions(optionsSchema, options, 'createWalSlotReader');
  const log = o.logger;
  const scope = { slot: o.slot, publication: o.publication };

  let started = false;
  let stopping = false;
  let finished = false;
  let service: LogicalReplicationService | undefined;
  let frontier: ConfirmFrontier | undefined;
  let statusTimer: NodeJS.Timeout | undefined;
  let frame: { xid: number; events: WalEvent[] } | undefined;
  let inHandler: Promise<void> | undefined;
  let stopPromise: Promise<void> | undefined;
  const counts = { received: 0, done: 0, handedOver: 0, maxBuffered: 0, statusUpdates: 0, keepalivesAnswered: 0 };

  let resolveEnded!: () => void;
  let rejectEnded!: (err: unknown) => void;
  const ended = new Promise<void>((resolve, reject) => {
    resolveEnded = resolve;
    rejectEnded = reject;
  });
  ended.catch(() => {});

  /** Tells PostgreSQL the confirmed LSN (write, flush and apply alike). */
  /** A status update is queued for the end of the current synchronous run (see `confirm()`). */
  let statusQueued = false;

  function sendStatus(): void {
    if (service === undefined || frontier === undefined || finished) return;
    counts.statusUpdates += 1;
    // acknowledge(x) reports x + 1 (the first trap): report the frontier itself.
    void service.acknowledge(formatLsn(frontier.frontier - 1n));
  }

  function fail(err: unknown): void {
    if (finished) return;
    finished = true;
    stopping = true;
    clearInterval(statusTimer);
    log.warn({ ...scope, err }, 'WAL slot reader stopped on an error');
    const closing = service?.destroy();
    void closing?.catch(() => {});
    rejectEnded(err);
  }

  function streamError(err: unknown, when: 'start' | 'read'): WalStreamError {
    const state = sqlStateOf(err);
    const detail = err instanceof Error ? err.message : String(err);
    let hint = 'The reader can be started again; what it had not confirmed comes again.';
    if (state === SQLSTATE.OBJECT_IN_USE) hint = 'Another reader holds the slot: one slot has one reader at a time.';
    if (state === SQLSTATE.UNDEFINED_OBJECT) {
      hint =
        when === 'start'
          ? 'Create the slot and the publication first (ensureLogicalSlot(), ensurePublication()).'
          : 'The publication was dropped: create it again (outboxkit migrate --wal-publication, or ensurePublication(); ' +
            '`outboxkit relay --source wal` creates it when it starts); the WAL relay then recreates its slot and resyncs.';
    }
    return new WalStreamError(
      `The replication stream of slot ${o.slot} ${when === 'start' ? 'did not start' : 'ended'}: ${detail}. ${hint}`,
      { cause: err, retriable: state !== SQLSTATE.UNDEFINED_OBJECT },
    );
  }

  async function onCommit(message: Pgoutput.MessageCommit): Promise<void> {
    const current = frame;
    frame = undefined;
    const lsn = parseLsn(message.commitEndLsn ?? '');
    try {
      if (current === undefined || current.events.length === 0) {
        // Nothing for the caller (no row of the publication, no message with the prefix): settled
        // as it arrives, so the slot can move past it once the transactions before it are.
        if (frontier!.add(lsn, true) !== undefined) sendStatus();
        return;
      }
      frontier!.add(lsn, false);
      inHandler = o.handler({ commitEndLsn: formatLsn(lsn), xid: current.xid, events: current.events });
      await inHandler;
      counts.handedOver += 1;
    } catch (err) {
      fail(err);
    } finally {
      inHandler = undefined;
      counts.done += 1;
    }
  }

  // The library awaits this listener (flow control) before it passes the next message.
  async function onData(_lsn: string, message: Pgoutput.Message): Promise<void> {
    if (stopping) return;
    switch (message.tag) {
      case 'begin':
        frame = { xid: message.xid, events: [] };
        return;
      case 'insert':
        frame?.events.push({
          kind: 'row',
          schema: message.relation.schema,
          table: message.relation.name,
          row: message.new,
        });
        return;
      case 'message':
        // A non-transactional message belongs to no transaction and could never be confirmed
        // with one; a rolled-back transactional one never arrives (docs/wal-source.md, fact 4).
        if (message.transactional && o.messagePrefix !== undefined && message.prefix === o.messagePrefix) {
          frame?.events.push({ kind: 'message', prefix: message.prefix, content: Buffer.from(message.content) });
        }
        return;
      case 'commit':
        await onCommit(message);
        return;
      default:
        // relation (kept by the library's parser), type, origin, update, delete, truncate: the
        // publication streams inserts only, the rest describes them.
        return;
    }
  }

  async function start(): Promise<void> {
    if (started) throw new LifecycleError(`The WAL slot reader of slot ${o.slot} was already started; make a new one.`);
    started = true;
    if (stopping) throw new LifecycleError(`The WAL slot reader of slot ${o.slot} was stopped before it started.`);
    const probe = new pg.Client(o.connection);
    probe.on('error', () => {});
    let startLsn: bigint;
    try {
      await probe.connect();
      const state = await readSlot(probe, o.slot);
      if (state === undefined || !state.inThisDatabase) {
        throw new WalStreamError(
          `Replication slot ${o.slot} does not exist${state === undefined ? '' : ' in this database'}; create it with ensureLogicalSlot().`,
          { retriable: false },
        );
      }
      startLsn = state.confirmedFlushLsn;
    } catch (err) {
      finished = true;
      rejectEnded(err);
      throw err instanceof WalStreamError ? err : streamError(err, 'start');
    } finally {
      await probe.end().catch(() => {});
    }
    frontier = new ConfirmFrontier(startLsn);

    const s = new LogicalReplicationService(o.connection, {
      acknowledge: { auto: false, timeoutSeconds: 0 },
      flowControl: { enabled: true },
    });
    service = s;
    s.on('data', onData);
    s.on('heartbeat', (lsn: string, _ts: number, shouldRespond: boolean) => {
      // The library emits keepalives as they arrive, ahead of the data it still queues: the
      // position is safe to confirm only when every commit received (counted at receipt) was
      // handled and confirmed by the caller.
      const f = frontier;
      const moved =
        f !== undefined && counts.received === counts.done && f.open === 0 && f.skipTo(parseLsn(lsn)) !== undefined;
      if (shouldRespond) counts.keepalivesAnswered += 1;
      if (shouldRespond || moved) sendStatus();
    });
    s.on('error', (err: Error) => {
      if (!stopping) fail(streamError(err, 'read'));
    });
    const plugin = new CountingPgoutputPlugin(
      // Protocol 1 never streams a transaction in progress: only committed ones arrive.
      { protoVersion: 1, publicationNames: [o.publication], messages: true },
      () => {
        counts.received += 1;
        counts.maxBuffered = Math.max(counts.maxBuffered, counts.received - counts.done);
      },
    );
    const streaming = new Promise<void>((resolve) => s.once('start', () => resolve()));
    // START_REPLICATION from 0/0: the server starts after the slot's confirmed_flush_lsn.
    const run = s.subscribe(plugin, o.slot).then(
      () => ({ err: undefined as unknown }),
      (err: unknown) => ({ err }),
    );
    const first = await Promise.race([streaming.then(() => undefined), run]);
    if (first !== undefined) {
      const err = streamError(first.err ?? new Error('the server ended replication'), 'start');
      fail(err);
      throw err;
    }
    if (finished) {
      // stop() ran while this was connecting: it could not close a connection that did not exist yet.
      await s.destroy().catch(() => {});
      return;
    }
    log.info({ ...scope, confirmedLsn: formatLsn(startLsn) }, 'WAL slot reader streaming');
    statusTimer = setInterval(sendStatus, o.statusIntervalMs);
    statusTimer.unref();
    void run.then(({ err }) => {
      if (stopping) return;
      fail(streamError(err ?? new Error('the server ended replication'), 'read'));
    });
  }

  function confirm(commitEndLsn: string): void {
    if (frontier === undefined) {
      throw new LifecycleError(`confirm(${commitEndLsn}): the WAL slot reader of slot ${o.slot} has not started.`);
    }
    if (frontier.confirm(parseLsn(commitEndLsn)) !== undefined && !statusQueued) {
      // One status update for every confirm() of one synchronous run (a relay confirms a batch's
      // transactions in a loop): it reports the frontier as it stands then, the last of them.
      statusQueued = true;
      queueMicrotask(() => {
        statusQueued = false;
        sendStatus();
      });
    }
  }

  function stop(stopOptions: { timeoutMs?: number } = {}): Promise<void> {
    stopPromise ??= (async () => {
      stopping = true;
      if (finished) return;
      const current = inHandler;
      if (current !== undefined) {
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([
          current.catch(() => {}),
          new Promise((r) => {
            timer = setTimeout(r, stopOptions.timeoutMs ?? 5_000);
          }),
        ]);
        clearTimeout(timer);
      }
      sendStatus();
      clearInterval(statusTimer);
      finished = true;
      await service?.destroy().catch(() => {});
      log.info({ ...scope, confirmedLsn: frontier && formatLsn(frontier.frontier) }, 'WAL slot reader stopped');
      resolveEnded();
    })();
    return stopPromise;
  }

  function stats(): WalSlotReaderStats {
    return {
      received: counts.received,
      handedOver: counts.handedOver,
      buffered: counts.received - counts.done,
      maxBuffered: counts.maxBuffered,
      confirmedLsn: frontier === undefined ? '0/0' : formatLsn(frontier.frontier),
      unconfirmed: frontier?.open ?? 0,
      statusUpdates: counts.statusUpdates,
      keepalivesAnswered: counts.keepalivesAnswered,
    };
  }

  return { start, confirm, stop, ended, stats };
}
