/**
 * `outboxkit relay --source wal`: the WAL relay daemon (relay/wal/wal-relay.ts;
 * docs/wal-source.md). Loaded by cli/commands/relay.ts for this source only, after the shared
 * flags (Kafka connection, client library, logging) were resolved there.
 *
 * What it adds to `createWalRelay()`: it creates the publication when missing, keeps
 * trying while another relay holds the slot's lease (a second relay waits as a standby, polling
 * the lease every third of `--wal-lease-ms`, and takes over when it is released or expires),
 * serves `/metrics`, `/healthz` and `/readyz`, and drains on SIGTERM/SIGINT as the table relay.
 */
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import pg from 'pg';
import client from 'prom-client';
import { fullJitterBackoffMs } from '../../src/backoff.js';
import { withTimeout } from '../../src/deadline.js';
import { InvalidOptionsError, PermissionDeniedError, isOutboxkitError } from '../../src/errors.js';
import { SQLSTATE, sqlStateOf } from '../../src/postgres.js';
import type { ResolvedKafkaConfig } from '../../src/kafka/config.js';
import type { KafkaClient } from '../../src/kafka/types.js';
import type { Logger } from '../../src/logger.js';
import { quoteSchema, walPublicationName, walSlotName } from '../../src/schema-name.js';
import {
  RELAY_METRICS_REFRESH_MS,
  refreshedAtMostEvery,
  serveMetrics,
  type WalRelayReadiness,
} from '../../relay/metrics.js';
import { checkWalServer } from '../../relay/wal/server-check.js';
import { ensurePublication, walSlotsStatus, type WalSlotStatus } from '../../relay/wal/slot-sql.js';
import {
  createWalRelay,
  WAL_RELAY_DEFAULTS,
  WAL_SAME_RELAY_ID,
  type WalRelay,
  type WalRelayEvents,
  type WalResyncReason,
} from '../../relay/wal/wal-relay.js';
import { applicationName, drainOnSignals, lifetime, q, withSchemaHint } from '../shared.js';

/** How old, at most, the answer of `/readyz` about the replication stream is, in ms. */
const STREAM_CHECK_REFRESH_MS = 1_000;
/** Longest wait for PostgreSQL's answer to the readiness query, in ms. */
const READINESS_TIMEOUT_MS = 2_000;

/**
 * Whether the slot is read by a walsender of the connection named `applicationName`: this
 * relay's own, not another reader's.
 */
const STREAM_SQL = `SELECT EXISTS (
  SELECT 1 FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
   WHERE s.slot_name = $1 AND a.application_name = $2) AS streaming`;

/** The flags `createWalRelay()` options come from, to name them in errors. */
const OPTION_FLAGS: Record<string, string> = {
  batchSize: '--batch-size',
  maxBatchBytes: '--max-batch-bytes',
  brokerTimeoutMs: '--broker-timeout-ms',
  statusIntervalMs: '--wal-status-interval-ms',
  leaseMs: '--wal-lease-ms',
  publishedRetentionMs: '--published-retention-ms',
  cleanupRowsPerSecond: '--cleanup-rows-per-second',
  relayId: '--relay-id',
  slot: '--wal-slot',
  publication: '--wal-publication',
  schema: '--schema',
};

/**
 * The replication connection's configuration: `url` with `application_name` set to `name`, so the
 * readiness query can tell this relay's walsender from another reader's. In the URL, since pg lets
 * a URL's parameters win over the configuration's (an `application_name` there is replaced).
 */
export function replicationConnection(url: string, name: string): pg.ClientConfig {
  if (!/^postgres(ql)?:\/\//i.test(url)) return { connectionString: url, application_name: name };
  const at = url.indexOf('?');
  const params = new URLSearchParams(at === -1 ? '' : url.slice(at + 1));
  params.set('application_name', name);
  return { connectionString: `${at === -1 ? url : url.slice(0, at)}?${params.toString()}` };
}

/** Runs the WAL relay daemon from the `outboxkit relay` options; returns once it streams. */
export async function runWalRelay(args: {
  opts: Record<string, string | number | boolean | undefined>;
  logger: Logger;
  kafka: KafkaClient;
  resolved: ResolvedKafkaConfig;
  library: string;
}): Promise<void> {
  const { opts, logger, kafka, resolved, library } = args;
  const schema = String(opts.schema);
  quoteSchema(schema); // the default names are made from it: checked first
  const slot = opts.walSlot === undefined ? walSlotName(schema) : String(opts.walSlot);
  const publication = opts.walPublication === undefined ? walPublicationName(schema) : String(opts.walPublication);
  const url = String(opts.databaseUrl);
  const streamName = `outboxkit-wal-relay-${randomBytes(4).toString('hex')}`;
  // One id for the process, whatever the number of attempts (each makes a relay).
  const relayId =
    opts.relayId === undefined
      ? `${hostname()}-${process.pid}-${randomBytes(4).toString('hex')}`
      : String(opts.relayId);
  const build = (): WalRelay => {
    try {
      return createWalRelay({
        connection: replicationConnection(url, streamName),
        schema,
        slot,
        publication,
        kafka,
        producerOptions: resolved.producer,
        batchSize: Number(opts.batchSize),
        maxBatchBytes: Number(opts.maxBatchBytes),
        brokerTimeoutMs: Number(opts.brokerTimeoutMs),
        statusIntervalMs: Number(opts.walStatusIntervalMs),
        leaseMs: Number(opts.walLeaseMs),
        holdKeyBehindFailure: Boolean(opts.holdKeyBehindFailure),
        publishedRetentionMs: Number(opts.publishedRetentionMs),
        cleanupRowsPerSecond: Number(opts.cleanupRowsPerSecond),
        relayId,
        logger,
      });
    } catch (err) {
      if (!(err instanceof InvalidOptionsError)) throw err;
      // The operator gave flags, not createWalRelay()'s options: named by flag.
      const flagged = err.message
        .replace(/^createWalRelay: /, '')
        .replace(
          /\b(batchSize|maxBatchBytes|brokerTimeoutMs|statusIntervalMs|leaseMs|publishedRetentionMs|cleanupRowsPerSecond|relayId|slot|publication|schema)\b/g,
          (name) => OPTION_FLAGS[name]!,
        );
      throw new InvalidOptionsError(flagged, { cause: err });
    }
  };
  // Options checked before anything connects (this relay is not started; each attempt makes one).
  build();

  const pool = new pg.Pool({
    connectionString: url,
    max: 2,
    keepAlive: true,
    fallback_application_name: applicationName('relay'),
  });
  pool.on('error', (err) => logger.warn({ err }, 'idle PostgreSQL connection failed'));
  let relay: WalRelay | undefined;
  let stopping = false;
  let cancelSleep: (() => void) | undefined;
  /** The lease owner this standby last logged, so that it logs when the owner changes, not every poll. */
  let standbyLogged: string | undefined;
  try {
    await prepare(pool, { schema, publication, statusIntervalMs: Number(opts.walStatusIntervalMs), logger });
    logger.info({ kafka: resolved.description, kafkaClient: library, slot, publication, schema }, 'WAL relay settings');

    // Metrics and readiness, fed by whichever relay runs.
    const registry = new client.Registry();
    client.collectDefaultMetrics({ register: registry });
    const counters = walCounters(registry);
    walSlotGauges(registry, slot, {
      slot: refreshedAtMostEvery(RELAY_METRICS_REFRESH_MS, async () =>
        (await walSlotsStatus(q(pool), quoteSchema(schema), slot)).find((s) => s.slot === slot),
      ),
      resyncing: () => relay?.stats().resyncing === true,
    });
    walHoldGauges(registry, () => relay?.stats());
    let kafkaFailing = false;
    const port = Number(opts.metricsPort);
    if (port >= 0) {
      const streaming = refreshedAtMostEvery(STREAM_CHECK_REFRESH_MS, async () => {
        const { rows } = await pool.query<{ streaming: boolean }>(STREAM_SQL, [slot, streamName]);
        return rows[0]?.streaming === true;
      });
      const readiness = async (): Promise<WalRelayReadiness> => {
        const answer = await withTimeout(streaming(), READINESS_TIMEOUT_MS, () => new Error('timeout')).then(
          (stream) => ({ database: true, stream }),
          () => ({ database: false, stream: false }),
        );
        const kafkaOk = !kafkaFailing;
        // A resync publishes the table's rows before the stream starts: the relay works, it is ready.
        const resyncing = relay?.stats().resyncing === true;
        return {
          ready: answer.database && (answer.stream || resyncing) && kafkaOk && !stopping,
          ...answer,
          kafka: kafkaOk,
          resyncing,
        };
      };
      const server = await serveMetrics(registry, port, readiness, { host: String(opts.metricsHost) });
      const address = server.address();
      logger.info(
        typeof address === 'object' && address ? { host: address.address, port: address.port } : { port },
        'metrics and health endpoints listening',
      );
    }

    drainOnSignals(logger, async () => {
      stopping = true;
      cancelSleep?.();
      await relay?.stop({ timeoutMs: 30_000 });
      await pool.end();
    });

    // A relay per attempt (one runs once): another reader may hold the slot for a while.
    for (let attempt = 1; ; attempt++) {
      if (stopping) return;
      const current = build();
      relay = current;
      current.on('wal:published', ({ events, parked, held }) => {
        kafkaFailing = false;
        counters.published.inc(events);
        counters.parked.inc(parked);
        counters.held.inc(held);
      });
      current.on('wal:error', ({ what }) => {
        if (what === 'send') kafkaFailing = true;
        counters.errors.inc({ what });
      });
      // A resync's pages go through the stream's send path without a `wal:published` event.
      current.on('wal:resync-page', ({ events, parked, held }) => {
        kafkaFailing = false;
        counters.published.inc(events);
        counters.parked.inc(parked);
        counters.held.inc(held);
        counters.resynced.inc(events);
      });
      current.on('wal:resync', ({ reason }) => counters.resyncs.inc({ reason }));
      try {
        await current.start();
        break;
      } catch (err) {
        // A signal during start(): stop() ended the attempt (its pool, its reader); not a failure.
        if (stopping) return;
        if (!isOutboxkitError(err, 'OUTBOXKIT_WAL_STREAM_FAILED') || !err.retriable) throw err;
        const standbyOf = current.stats().standbyOf;
        const backoffMs =
          WAL_RELAY_DEFAULTS.retryInitialMs +
          fullJitterBackoffMs(attempt, WAL_RELAY_DEFAULTS.retryInitialMs, WAL_RELAY_DEFAULTS.retryMaxMs);
        // A standby polls the lease every third of it: it takes over within about a lease.
        const delayMs = standbyOf === undefined ? backoffMs : Math.floor(Number(opts.walLeaseMs) / 3);
        if (standbyOf === undefined) {
          logger.warn({ err, attempt, delayMs, slot }, 'the replication slot cannot be read now; retrying');
        } else if (standbyOf !== standbyLogged) {
          // Said once per owner (each attempt is a new relay): a relay running under this one's id
          // is a configuration mistake (warn).
          if (err.message.includes(WAL_SAME_RELAY_ID)) {
            logger.warn({ slot, relayId: standbyOf, pollMs: delayMs }, `${WAL_SAME_RELAY_ID}; standing by`);
          } else {
            logger.info({ slot, owner: standbyOf, pollMs: delayMs }, 'standing by until the slot lease is free');
          }
        }
        standbyLogged = standbyOf;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, delayMs);
          cancelSleep = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        cancelSleep = undefined;
      }
    }
  } catch (err) {
    await pool.end().catch(() => undefined);
    throw withSchemaHint(err, schema);
  }
  lifetime.daemon = true;
  // An error the relay cannot retry (the slot was dropped, a row it cannot read) ends the process.
  relay.ended.catch(async (err: unknown) => {
    if (stopping) return;
    logger.error({ err }, 'WAL relay stopped on an error it cannot retry; exiting');
    // Its stop releases the slot's lease: a standby (or this relay's restart) reads at once.
    await relay?.stop().catch(() => undefined);
    await pool.end().catch(() => undefined);
    process.exit(1);
  });
}

/**
 * Checks the schema and the server, then creates the publication when missing (the relay refuses
 * to start without it; the slot is the relay's own: it creates it, and resyncs, when missing).
 */
async function prepare(
  pool: pg.Pool,
  o: { schema: string; publication: string; statusIntervalMs: number; logger: Logger },
): Promise<void> {
  const table = `${quoteSchema(o.schema)}.outbox_events`;
  await pool.query(`SELECT 1 FROM ${table} LIMIT 0`);
  // A server that cannot stream, or a role that may not, is refused before anything is created
  // (the relay's own check would refuse it after a publication was made for nothing). Its notes
  // are the relay's to log, once it holds the slot.
  await checkWalServer(q(pool), { statusIntervalMs: o.statusIntervalMs });
  // Checked before creating: CREATE PUBLICATION needs privileges a relay's role may lack.
  const { rowCount } = await pool.query('SELECT 1 FROM pg_publication WHERE pubname = $1', [o.publication]);
  if (rowCount !== 0) return;
  const created = await ensurePublication(q(pool), o.publication, [`${o.schema}.outbox_events`]).catch(
    (err: unknown) => {
      // Typed here: withSchemaHint() would take this 42501 for a missing grant on the schema.
      if (sqlStateOf(err) !== SQLSTATE.INSUFFICIENT_PRIVILEGE) throw err;
      throw new PermissionDeniedError(
        `The database role may not create publication ${o.publication} (${(err as Error).message}): that takes ` +
          `CREATE on the database and the ownership of ${table}. Create it as the tables' owner: ` +
          `\`outboxkit migrate --schema ${o.schema} --wal-publication ${o.publication}\`.`,
        { cause: err },
      );
    },
  );
  if (created) o.logger.info({ publication: o.publication }, 'publication created');
}

/**
 * The WAL relay's counters on `registry`. Each `what` of the errors counter starts at 0, so a
 * scrape lists them before the first failure (a labelled counter without values is not printed).
 */
function walCounters(registry: client.Registry) {
  const counters = {
    published: new client.Counter({
      name: 'outboxkit_relay_published_total',
      help: 'Outbox events published to Kafka and acknowledged by the broker.',
      registers: [registry],
    }),
    parked: new client.Counter({
      name: 'outboxkit_wal_relay_parked_total',
      help: 'Outbox events the WAL relay parked (Kafka refused them for themselves).',
      registers: [registry],
    }),
    held: new client.Counter({
      name: 'outboxkit_wal_relay_held_total',
      help:
        'Outbox events the WAL relay held in the table as the stream brought them (their partition could not take ' +
        'writes, or their key was held); they are published later, and counted in outboxkit_relay_published_total then.',
      registers: [registry],
    }),
    errors: new client.Counter({
      name: 'outboxkit_wal_relay_errors_total',
      help: 'Failures the WAL relay retries: sends to Kafka, database statements, the replication stream.',
      labelNames: ['what'],
      registers: [registry],
    }),
    resyncs: new client.Counter({
      name: 'outboxkit_wal_relay_resyncs_total',
      help: 'Resyncs the WAL relay ended (it published the outbox table before streaming), by why they began.',
      labelNames: ['reason'],
      registers: [registry],
    }),
    resynced: new client.Counter({
      name: 'outboxkit_wal_relay_resynced_events_total',
      help: 'Outbox events the WAL relay published from the table in resyncs, page by page (Kafka acknowledged them; also in outboxkit_relay_published_total).',
      registers: [registry],
    }),
  };
  for (const what of WAL_ERROR_KINDS) counters.errors.labels(what).inc(0);
  for (const reason of WAL_RESYNC_REASONS) counters.resyncs.labels(reason).inc(0);
  return counters;
}

/**
 * The WAL relay's held keys on `registry` (docs/wal-source.md, "Held keys"), read from the running
 * relay's `stats()` at each scrape: the topic-partitions it finds unable to take writes (the table
 * relay's gauge name) and the keys whose events wait in the table.
 */
function walHoldGauges(registry: client.Registry, stats: () => ReturnType<WalRelay['stats']> | undefined): void {
  new client.Gauge({
    name: 'outboxkit_relay_partitions_blocked',
    help: 'Topic-partitions the relay finds unable to take writes now (no leader, or too few in-sync replicas): their events wait.',
    registers: [registry],
    collect() {
      this.set(stats()?.blockedPartitions.length ?? 0);
    },
  });
  new client.Gauge({
    name: 'outboxkit_wal_relay_held_keys',
    help: 'Keys whose events the WAL relay holds in the outbox table now (behind a blocked partition or a parked event).',
    registers: [registry],
    collect() {
      this.set(stats()?.heldKeys ?? 0);
    },
  });
}

/**
 * The WAL relay's gauges on `registry`: whether a resync runs, and what its slot holds back
 * (docs/wal-source.md, "Slot loss and resync"), read at most once per
 * {@link RELAY_METRICS_REFRESH_MS} and waited for at most {@link READINESS_TIMEOUT_MS} per scrape.
 * The byte gauges are labelled by `slot` and have no series while their value is unknown: the slot
 * missing or lost (the relay creates it again and resyncs, which
 * `outboxkit_wal_relay_resyncs_total` counts), a standby server, or PostgreSQL not answering.
 */
function walSlotGauges(
  registry: client.Registry,
  slot: string,
  read: { slot: () => Promise<WalSlotStatus | undefined>; resyncing: () => boolean },
): void {
  new client.Gauge({
    name: 'outboxkit_wal_relay_resyncing',
    help: '1 while the WAL relay resyncs (publishes the outbox table before streaming), else 0.',
    registers: [registry],
    collect() {
      this.set(read.resyncing() ? 1 : 0);
    },
  });
  const figures: [string, string, (s: WalSlotStatus) => number | null][] = [
    [
      'outboxkit_wal_slot_retained_bytes',
      "WAL the relay's replication slot keeps on disk (restart_lsn to the current WAL position), in bytes.",
      (s) => s.retainedBytes,
    ],
    [
      'outboxkit_wal_slot_confirmed_lag_bytes',
      "How far the slot's confirmed position (Kafka acknowledged everything before it) is behind the current WAL position, in bytes.",
      (s) => s.confirmedLagBytes,
    ],
  ];
  for (const [name, help, figure] of figures) {
    new client.Gauge({
      name,
      help,
      labelNames: ['slot'],
      registers: [registry],
      async collect() {
        // A scrape never waits long, nor fails, on PostgreSQL: an unknown value is no series.
        const state = await withTimeout(read.slot(), READINESS_TIMEOUT_MS, () => new Error('timeout')).catch(
          () => undefined,
        );
        const value = state === undefined ? null : figure(state);
        this.reset();
        if (value !== null) this.set({ slot }, value);
      },
    });
  }
}

/** Why a WAL relay resyncs (relay/wal/wal-relay.ts). */
const WAL_RESYNC_REASONS: readonly WalResyncReason[] = ['missing', 'lost', 'unrecorded', 'interrupted', 'undecodable'];

/** The `what` of the WAL relay's `wal:error` event (relay/wal/wal-relay.ts). */
const WAL_ERROR_KINDS: readonly WalRelayEvents['wal:error'][0]['what'][] = ['send', 'database', 'stream'];
