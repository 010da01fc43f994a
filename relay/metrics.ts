/**
 * Prometheus metrics and health endpoints of the relay daemon (prom-client).
 */
import { createServer, type Server } from 'node:http';
import { isIP } from 'node:net';
import client from 'prom-client';
import type pg from 'pg';
import type { Relay } from './relay.js';
import { backlog, laneOwners } from './sql.js';
import { quoteSchema } from '../src/schema-name.js';
import { InvalidOptionsError, optionNames, refuseUnknownOptions } from '../src/errors.js';

/** Bucket bounds of the send latency histogram, in seconds (1 ms to 30 s). */
export const PUBLISH_DURATION_BUCKETS = Object.freeze([
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
]);

/**
 * How old, at most, the database figures of `/metrics` and `/readyz` may be, in ms: a scrape or a
 * probe within this long of the last read reuses it, so a flood of requests costs one round of
 * queries per interval (never one per request, never two at once) and cannot starve the relay's
 * small pool. Prometheus scrapes every 15 s or more by default.
 */
export const RELAY_METRICS_REFRESH_MS = 5_000;

/**
 * `load`, run at most once per `refreshMs`: a caller within `refreshMs` of the end of the last run
 * gets its outcome (value or error), a caller during a run shares it. Only the first caller after
 * the interval starts a new run.
 */
export function refreshedAtMostEvery<T>(refreshMs: number, load: () => Promise<T>): () => Promise<T> {
  let current: Promise<T> | undefined;
  let running = false;
  let settledAt = 0;
  return () => {
    if (current !== undefined && (running || performance.now() - settledAt < refreshMs)) return current;
    running = true;
    current = load().finally(() => {
      running = false;
      settledAt = performance.now();
    });
    current.catch(() => undefined); // each caller handles the rejection it gets
    return current;
  };
}

/** Checks `refreshMs` (an integer of 0 or more, in ms) and returns it, or the default. */
function refreshMsOf(value: number | undefined, what: string): number {
  const refreshMs = value ?? RELAY_METRICS_REFRESH_MS;
  if (!Number.isSafeInteger(refreshMs) || refreshMs < 0) {
    throw new InvalidOptionsError(`${what}: refreshMs must be an integer of 0 or more (ms), got ${String(value)}.`);
  }
  return refreshMs;
}

/** Options of {@link relayMetrics}. */
export interface RelayMetricsOptions {
  /**
   * Longest age of the database gauges (backlog, oldest pending age, parked, unowned lanes; the
   * events waiting per blocked topic-partition), in ms: they are read by one round of two queries
   * (and a third while some partition is blocked) at most once per interval, whatever the scrape
   * rate. 0 reads them at every scrape (still one round at a time).
   * @defaultValue 5_000 ({@link RELAY_METRICS_REFRESH_MS})
   */
  refreshMs?: number;
}

/** Every option name of {@link relayMetrics}. */
const METRICS_OPTION_NAMES = optionNames<RelayMetricsOptions>({ refreshMs: true });

/** What {@link relayMetrics} reads from the database (all lanes, all relays), in its gauges' units. */
interface DatabaseFigures {
  pending: number;
  oldestPendingSeconds: number;
  parked: number;
  unowned: number;
}

/** A gauge's name and help text. */
type GaugeText = [name: string, help: string];

/** The gauge of each database figure, in the order they are registered. */
const DATABASE_GAUGES: Readonly<Record<keyof DatabaseFigures, GaugeText>> = {
  pending: ['outboxkit_relay_backlog', 'Outbox events waiting to be published (all lanes).'],
  oldestPendingSeconds: [
    'outboxkit_relay_oldest_pending_seconds',
    'Age of the oldest pending outbox event, in seconds.',
  ],
  parked: ['outboxkit_relay_parked', 'Outbox events parked after repeated publish failures.'],
  unowned: [
    'outboxkit_relay_lanes_unowned',
    'Lanes without a live lease (free, or held by a relay whose lease expired): their events wait.',
  ],
};

/**
 * Metrics of one relay, registered on `registry`:
 *
 * - `outboxkit_relay_published_total`: events published and acknowledged by the broker.
 * - `outboxkit_relay_failures_total`: failed relay passes (broker or database trouble; retried).
 * - `outboxkit_relay_publish_duration_seconds`: duration of one send to Kafka until the broker's
 *   acknowledgement (acks=all), for acknowledged sends.
 * - `outboxkit_relay_lanes_held`: lanes this instance holds.
 * - `outboxkit_relay_producer_connected`: 1 while the relay has a connected Kafka producer.
 * - `outboxkit_relay_stand_downs_total`: times this relay stood down (it could not publish for
 *   longer than a lease and released its lanes; event `relay:standing-down`).
 * - `outboxkit_relay_partitions_blocked`: topic-partitions this relay found unable to take writes
 *   (no leader, or fewer in-sync replicas than `min.insync.replicas`; {@link Relay.blockedPartitions}).
 * - `outboxkit_relay_partition_waiting_events{topic,partition}`: events of this relay's lanes held
 *   back by each blocked topic-partition (those of keys whose events go there, counting the keys'
 *   later events on any topic; {@link Relay.waitingEvents}), read at most once per
 *   `options.refreshMs`. Only blocked partitions have a series; a partition that takes writes again
 *   drops out. The labels are the relay's topics and their partition numbers, never a key.
 * - From the database (all lanes, all relays), read at most once per `options.refreshMs`:
 *   `outboxkit_relay_backlog`, `outboxkit_relay_oldest_pending_seconds`, `outboxkit_relay_parked`,
 *   `outboxkit_relay_lanes_unowned` (lanes with no live lease: their events wait).
 *
 * ops/grafana/outboxkit.json and ops/prometheus/alerts.yml use these names.
 *
 * @throws {@link InvalidOptionsError} on an unknown option name or a bad `refreshMs`.
 */
export function relayMetrics(
  relay: Relay,
  pool: pg.Pool,
  registry: client.Registry,
  options: RelayMetricsOptions = {},
): void {
  refuseUnknownOptions(options ?? {}, METRICS_OPTION_NAMES, 'relayMetrics');
  const refreshMs = refreshMsOf(options?.refreshMs, 'relayMetrics');
  const schema = quoteSchema(relay.options.schema);

  // Each metric fed by the relay's events, next to the event that feeds it.
  const published = new client.Counter({
    name: 'outboxkit_relay_published_total',
    help: 'Outbox events published to Kafka and acknowledged by the broker.',
    registers: [registry],
  });
  relay.on('relay:published', ({ count }) => published.inc(count));
  const failures = new client.Counter({
    name: 'outboxkit_relay_failures_total',
    help: 'Relay passes that failed (the rows stay pending and are retried with backoff).',
    registers: [registry],
  });
  relay.on('relay:error', () => failures.inc());
  const lanes = new client.Gauge({
    name: 'outboxkit_relay_lanes_held',
    help: 'Lanes this relay instance holds.',
    registers: [registry],
  });
  relay.on('relay:lanes', ({ held }) => lanes.set(held.length));
  const duration = new client.Histogram({
    name: 'outboxkit_relay_publish_duration_seconds',
    help: "Duration of one send to Kafka until the broker's acknowledgement (acks=all), in seconds.",
    buckets: [...PUBLISH_DURATION_BUCKETS],
    registers: [registry],
  });
  relay.on('relay:sent', ({ durationMs, ok }) => {
    if (ok) duration.observe(durationMs / 1_000);
  });
  new client.Gauge({
    name: 'outboxkit_relay_producer_connected',
    help: 'Whether this relay has a connected Kafka producer (1) or is backing off without one (0).',
    registers: [registry],
    collect() {
      this.set(relay.producerConnected ? 1 : 0);
    },
  });

  const standDowns = new client.Counter({
    name: 'outboxkit_relay_stand_downs_total',
    help: 'Times this relay stood down: it could not publish for longer than a lease and released its lanes.',
    registers: [registry],
  });
  relay.on('relay:standing-down', () => standDowns.inc());
  new client.Gauge({
    name: 'outboxkit_relay_partitions_blocked',
    help: 'Topic-partitions this relay found unable to take writes (no leader, or too few in-sync replicas): their events wait.',
    registers: [registry],
    collect() {
      this.set(relay.blockedPartitions().length);
    },
  });
  // One query while some partition is blocked (none otherwise), at most once per refreshMs.
  const waiting = refreshedAtMostEvery(refreshMs, () => relay.waitingEvents());
  new client.Gauge({
    name: 'outboxkit_relay_partition_waiting_events',
    help: "Events of this relay's lanes held back by a topic-partition that cannot take writes (blocked partitions only).",
    labelNames: ['topic', 'partition'],
    registers: [registry],
    async collect() {
      const now = await waiting();
      // Reset first: a partition that takes writes again leaves the scrape instead of showing its last count.
      this.reset();
      for (const { topic, partition, events } of now) this.set({ topic, partition: String(partition) }, events);
    },
  });

  // The database gauges come from one snapshot, read off the hot path and at most once per
  // refreshMs: the two queries run one after the other, on one connection at a time.
  const q = { query: async <R>(text: string) => ({ rows: (await pool.query(text)).rows as R[], rowCount: 0 }) };
  const snapshot = refreshedAtMostEvery(refreshMs, async (): Promise<DatabaseFigures> => {
    const { pending, parked, oldestPendingMs } = await backlog(q, schema);
    const owners = await laneOwners(q, schema);
    const unowned = owners.filter((o) => o.owner_id === null || !o.live).reduce((n, o) => n + o.lanes, 0);
    return { pending, oldestPendingSeconds: oldestPendingMs / 1000, parked, unowned };
  });
  for (const [figure, [name, help]] of Object.entries(DATABASE_GAUGES) as [keyof DatabaseFigures, GaugeText][]) {
    new client.Gauge({
      name,
      help,
      registers: [registry],
      async collect() {
        this.set((await snapshot())[figure]);
      },
    });
  }
}

/** What `/readyz` reports. */
export interface RelayReadiness {
  /** `database`, `kafka` and `lanes` all hold: the relay can publish its share of the outbox. */
  ready: boolean;
  /** PostgreSQL answered `SELECT 1` within the timeout (at the last check, at most `refreshMs` ago). */
  database: boolean;
  /** The relay holds a connected Kafka producer ({@link Relay.producerConnected}). */
  kafka: boolean;
  /**
   * The relay does not stand down ({@link Relay.standingDown}): it holds its fair share of the
   * lanes, or stands by for healthy peers that hold them all. False from the moment it could not
   * publish for longer than a lease (it released its lanes) until a new producer connects.
   */
  lanes: boolean;
  /**
   * Topic-partitions the relay finds unable to take writes now ({@link Relay.blockedPartitions},
   * a count). Informational: they never make the relay unready, since every lane spans every
   * partition and the relay's other partitions keep flowing; their events wait (G7).
   */
  blockedPartitions: number;
}

/**
 * What `/readyz` reports for a WAL relay (`outboxkit relay --source wal`; docs/wal-source.md).
 */
export interface WalRelayReadiness {
  /** `database` and `kafka` hold, and `stream` or `resyncing` does. */
  ready: boolean;
  /** PostgreSQL answered the readiness query. */
  database: boolean;
  /** The relay's own replication connection holds its slot (a walsender of its connection reads it). */
  stream: boolean;
  /** No send to Kafka has failed for the broker's sake since the last batch Kafka acknowledged. */
  kafka: boolean;
  /**
   * The relay resyncs: it publishes the outbox table's rows before its stream starts (a slot
   * that was missing, lost, unrecorded, or a resync interrupted; docs/wal-source.md). It counts
   * as streaming: the relay publishes, so it is ready if the database and Kafka are.
   */
  resyncing?: boolean;
}

/** Every option name of {@link relayReadiness}. */
const READINESS_OPTION_NAMES = optionNames<NonNullable<Parameters<typeof relayReadiness>[2]>>({
  timeoutMs: true,
  refreshMs: true,
});

/**
 * The relay daemon's readiness check. Ready only when the relay can publish its share of the
 * outbox: PostgreSQL answers (`SELECT 1` on `pool` within `timeoutMs`), the relay holds a
 * connected Kafka producer, and it does not stand down (it holds its share of the lanes, or stands
 * by for healthy peers). Never ready while it can publish nothing: without a producer, or after it
 * released its lanes because it could not publish for longer than a lease.
 *
 * Lanes are key-hash buckets that span every partition of every topic, so readiness is about the
 * relay's reach of the cluster as a whole: a topic-partition that cannot take writes (no leader,
 * too few in-sync replicas) does not make it unready. Its events wait and every other partition
 * keeps flowing; `blockedPartitions` counts such partitions, and the metrics
 * `outboxkit_relay_partitions_blocked` and `outboxkit_relay_partition_waiting_events` report them.
 *
 * The producer and lane states are the relay's own, read at each call; the database check runs
 * at most once per `refreshMs` and calls in between get its last answer, so probes (or a flood of
 * requests) never cost a query each. The producer is dropped on a failed connect, send or idle
 * probe, or one Kafka did not answer within the relay's `brokerTimeoutMs`, and replaced once the
 * broker answers again, so an unreachable broker or rejected credentials show here (about 5 s into
 * an outage with the defaults; 8 s for an idle relay, which probes every third of a lease); a
 * lease into the outage the relay also stands down (`lanes` false) until a producer connects. An
 * unreachable database shows within `refreshMs` + `timeoutMs`.
 *
 * @param options.timeoutMs - longest wait for PostgreSQL, in ms. @defaultValue 2_000
 * @param options.refreshMs - longest age of the database answer, in ms (0: ask at every call,
 *   one check at a time). @defaultValue 5_000 ({@link RELAY_METRICS_REFRESH_MS})
 * @throws {@link InvalidOptionsError} naming an unknown option name, or on a bad `refreshMs`.
 */
export function relayReadiness(
  relay: Relay,
  pool: pg.Pool,
  options: { timeoutMs?: number; refreshMs?: number } = {},
): () => Promise<RelayReadiness> {
  refuseUnknownOptions(options ?? {}, READINESS_OPTION_NAMES, 'relayReadiness');
  const timeoutMs = options.timeoutMs ?? 2_000;
  const databaseAnswers = refreshedAtMostEvery(refreshMsOf(options.refreshMs, 'relayReadiness'), async () => {
    let timer: NodeJS.Timeout | undefined;
    const answered = await Promise.race([
      pool.query('SELECT 1').then(
        () => true,
        () => false,
      ),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs))),
    ]);
    clearTimeout(timer);
    return answered;
  });
  return async () => {
    const database = await databaseAnswers();
    const kafka = relay.producerConnected;
    const lanes = !relay.standingDown;
    return {
      ready: database && kafka && lanes,
      database,
      kafka,
      lanes,
      blockedPartitions: relay.blockedPartitions().length,
    };
  };
}

/**
 * The body of `/readyz`: `ready`, with the number of blocked topic-partitions when there are some
 * (`ready; 2 topic-partitions cannot take writes, their events wait`), or `not ready` naming what
 * is missing (`not ready: no connected Kafka producer, standing down (lanes released)`).
 */
function readinessText(r: boolean | RelayReadiness | WalRelayReadiness): string {
  if (typeof r === 'boolean') return r ? 'ready\n' : 'not ready\n';
  if ('stream' in r) {
    if (r.ready) return r.resyncing && !r.stream ? 'ready; resyncing the outbox table before streaming\n' : 'ready\n';
    const missing = [
      r.database ? '' : 'database unreachable',
      r.stream ? '' : 'replication stream down',
      r.kafka ? '' : 'sends to Kafka failing',
    ].filter(Boolean);
    return `not ready${missing.length > 0 ? `: ${missing.join(', ')}` : ''}\n`;
  }
  if (r.ready) {
    const blocked = r.blockedPartitions;
    return blocked > 0
      ? `ready; ${blocked} topic-partition${blocked === 1 ? '' : 's'} cannot take writes, their events wait\n`
      : 'ready\n';
  }
  const missing = [
    r.database ? '' : 'database unreachable',
    r.kafka ? '' : 'no connected Kafka producer',
    r.lanes === false ? 'standing down (lanes released)' : '',
  ].filter(Boolean);
  return `not ready${missing.length > 0 ? `: ${missing.join(', ')}` : ''}\n`;
}

/** The address {@link serveMetrics} listens on unless told otherwise: this host only. */
export const DEFAULT_METRICS_HOST = '127.0.0.1';

/** Options of {@link serveMetrics}. */
export interface ServeMetricsOptions {
  /**
   * The IP address to listen on (IPv4 or IPv6). The default keeps the endpoints on this host;
   * `0.0.0.0` (or `::`) exposes them on every interface, as a Prometheus on another host or a
   * container's port mapping needs.
   * @defaultValue '127.0.0.1' ({@link DEFAULT_METRICS_HOST})
   */
  host?: string;
}

/** Every option name of {@link serveMetrics}. */
const SERVE_OPTION_NAMES = optionNames<ServeMetricsOptions>({ host: true });

/**
 * Serves `/metrics` (Prometheus text format), `/healthz` (the process answers) and `/readyz`
 * (200 `ready`, or 503 naming what is missing: `database unreachable`, `no connected Kafka
 * producer`, `standing down (lanes released)`; see {@link relayReadiness}).
 *
 * @param port - TCP port; 0 picks a free one.
 * @param ready - the readiness check; a boolean, a {@link RelayReadiness} or a
 *   {@link WalRelayReadiness} (503 then names `replication stream down`, `sends to Kafka failing`).
 *   A throw counts as not ready.
 * @param options.host - the IP address to listen on. @defaultValue '127.0.0.1'
 * @throws {@link InvalidOptionsError} on an unknown option name or a host that is not an IP address;
 *   the listen error (`EADDRINUSE`, `EADDRNOTAVAIL`) when the port is taken or the address is not
 *   this host's.
 */
export async function serveMetrics(
  registry: client.Registry,
  port: number,
  ready: () => Promise<boolean | RelayReadiness | WalRelayReadiness>,
  options: ServeMetricsOptions = {},
): Promise<Server> {
  refuseUnknownOptions(options ?? {}, SERVE_OPTION_NAMES, 'serveMetrics');
  const host = options?.host ?? DEFAULT_METRICS_HOST;
  if (typeof host !== 'string' || isIP(host) === 0) {
    throw new InvalidOptionsError(
      `serveMetrics: host must be an IP address such as 127.0.0.1, 0.0.0.0 or ::, got ${JSON.stringify(host)}.`,
    );
  }
  const server = createServer((req, res) => {
    void (async () => {
      try {
        if (req.url === '/metrics') {
          const body = await registry.metrics();
          res.writeHead(200, { 'content-type': registry.contentType }).end(body);
        } else if (req.url === '/healthz') {
          res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
        } else if (req.url === '/readyz') {
          const r = await ready().catch(() => false as const);
          const ok = typeof r === 'boolean' ? r : r.ready;
          res.writeHead(ok ? 200 : 503, { 'content-type': 'text/plain' }).end(readinessText(r));
        } else {
          res.writeHead(404).end();
        }
      } catch (err) {
        res.writeHead(500, { 'content-type': 'text/plain' }).end(`${(err as Error).message}\n`);
      }
    })();
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  server.unref();
  return server;
}
