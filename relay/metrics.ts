/**
 * Prometheus metrics and health endpoints of the relay daemon (prom-client).
 */
import { createServer, type Server } from 'node:http';
import client from 'prom-client';
import type pg from 'pg';
import type { Relay } from './relay.js';
import { backlog, laneOwners } from './sql.js';
import { quoteSchema } from '../src/schema-name.js';
import { refuseUnknownOptions } from '../src/errors.js';

/** Bucket bounds of the send latency histogram, in seconds (1 ms to 30 s). */
export const PUBLISH_DURATION_BUCKETS = Object.freeze([
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
]);

/**
 * Metrics of one relay, registered on `registry`:
 *
 * - `outboxkit_relay_published_total`: events published and acknowledged by the broker.
 * - `outboxkit_relay_failures_total`: failed relay passes (broker or database trouble; retried).
 * - `outboxkit_relay_publish_duration_seconds`: duration of one send to Kafka until the broker's
 *   acknowledgement (acks=all), for acknowledged sends.
 * - `outboxkit_relay_lanes_held`: lanes this instance holds.
 * - `outboxkit_relay_producer_connected`: 1 while the relay has a connected Kafka producer.
 * - At scrape time, from the database (all lanes, all relays): `outboxkit_relay_backlog`,
 *   `outboxkit_relay_oldest_pending_seconds`, `outboxkit_relay_parked`,
 *   `outboxkit_relay_lanes_unowned` (lanes with no live lease: their events wait).
 *
 * ops/grafana/outboxkit.json and ops/prometheus/alerts.yml use these names.
 */
export function relayMetrics(relay: Relay, pool: pg.Pool, registry: client.Registry): void {
  const schema = quoteSchema(relay.options.schema);
  const published = new client.Counter({
    name: 'outboxkit_relay_published_total',
    help: 'Outbox events published to Kafka and acknowledged by the broker.',
    registers: [registry],
  });
  const failures = new client.Counter({
    name: 'outboxkit_relay_failures_total',
    help: 'Relay passes that failed (the rows stay pending and are retried with backoff).',
    registers: [registry],
  });
  const lanes = new client.Gauge({
    name: 'outboxkit_relay_lanes_held',
    help: 'Lanes this relay instance holds.',
    registers: [registry],
  });
  const duration = new client.Histogram({
    name: 'outboxkit_relay_publish_duration_seconds',
    help: "Duration of one send to Kafka until the broker's acknowledgement (acks=all), in seconds.",
    buckets: [...PUBLISH_DURATION_BUCKETS],
    registers: [registry],
  });
  new client.Gauge({
    name: 'outboxkit_relay_producer_connected',
    help: 'Whether this relay has a connected Kafka producer (1) or is backing off without one (0).',
    registers: [registry],
    collect() {
      this.set(relay.producerConnected ? 1 : 0);
    },
  });
  relay.on('relay:published', ({ count }) => published.inc(count));
  relay.on('relay:sent', ({ durationMs, ok }) => {
    if (ok) duration.observe(durationMs / 1_000);
  });
  relay.on('relay:error', () => failures.inc());
  relay.on('relay:lanes', ({ held }) => lanes.set(held.length));

  // Backlog figures are read from the database when Prometheus scrapes, not on the hot path.
  const q = { query: async <R>(text: string) => ({ rows: (await pool.query(text)).rows as R[], rowCount: 0 }) };
  // One query serves the three backlog gauges of a scrape.
  let pending: ReturnType<typeof backlog> | undefined;
  const figures = () => {
    pending ??= backlog(q, schema).finally(() => setImmediate(() => (pending = undefined)));
    return pending;
  };
  new client.Gauge({
    name: 'outboxkit_relay_backlog',
    help: 'Outbox events waiting to be published (all lanes).',
    registers: [registry],
    async collect() {
      this.set((await figures()).pending);
    },
  });
  new client.Gauge({
    name: 'outboxkit_relay_oldest_pending_seconds',
    help: 'Age of the oldest pending outbox event, in seconds.',
    registers: [registry],
    async collect() {
      this.set((await figures()).oldestPendingMs / 1000);
    },
  });
  new client.Gauge({
    name: 'outboxkit_relay_parked',
    help: 'Outbox events parked after repeated publish failures.',
    registers: [registry],
    async collect() {
      this.set((await figures()).parked);
    },
  });
  new client.Gauge({
    name: 'outboxkit_relay_lanes_unowned',
    help: 'Lanes without a live lease (free, or held by a relay whose lease expired): their events wait.',
    registers: [registry],
    async collect() {
      const owners = await laneOwners(q, schema);
      this.set(owners.filter((o) => o.owner_id === null || !o.live).reduce((n, o) => n + o.lanes, 0));
    },
  });
}

/** What `/readyz` reports. */
export interface RelayReadiness {
  /** Both checks below passed. */
  ready: boolean;
  /** PostgreSQL answered `SELECT 1` within the timeout. */
  database: boolean;
  /** The relay holds a connected Kafka producer ({@link Relay.producerConnected}). */
  kafka: boolean;
}

/** Every option name of {@link relayReadiness}. */
const READINESS_OPTION_NAMES: readonly string[] = Object.keys({
  timeoutMs: true,
} satisfies Record<keyof NonNullable<Parameters<typeof relayReadiness>[2]>, true>);

/**
 * The relay daemon's readiness check: ready only when PostgreSQL answers (`SELECT 1` on `pool`
 * within `timeoutMs`) and the relay holds a connected Kafka producer. The producer is dropped on a
 * failed connect, send or idle probe, or one Kafka did not answer within the relay's
 * `brokerTimeoutMs`, and replaced once the broker answers again, so an unreachable broker or
 * rejected credentials show here (about 5 s into an outage with the defaults; 8 s for an idle relay,
 * which probes every third of a lease).
 *
 * @param options.timeoutMs - longest wait for PostgreSQL, in ms. @defaultValue 2_000
 * @throws {@link InvalidOptionsError} naming an unknown option name.
 */
export function relayReadiness(
  relay: Relay,
  pool: pg.Pool,
  options: { timeoutMs?: number } = {},
): () => Promise<RelayReadiness> {
  refuseUnknownOptions(options ?? {}, READINESS_OPTION_NAMES, 'relayReadiness');
  const timeoutMs = options.timeoutMs ?? 2_000;
  return async () => {
    let timer: NodeJS.Timeout | undefined;
    const database = await Promise.race([
      pool.query('SELECT 1').then(
        () => true,
        () => false,
      ),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs))),
    ]);
    clearTimeout(timer);
    const kafka = relay.producerConnected;
    return { ready: database && kafka, database, kafka };
  };
}

/**
 * Serves `/metrics` (Prometheus text format), `/healthz` (the process answers) and `/readyz`
 * (200 `ready`, or 503 naming what is missing; see {@link relayReadiness}).
 *
 * @param port - TCP port on 0.0.0.0; 0 picks a free one.
 * @param ready - the readiness check; a boolean or a {@link RelayReadiness}. A throw counts as not ready.
 */
export async function serveMetrics(
  registry: client.Registry,
  port: number,
  ready: () => Promise<boolean | RelayReadiness>,
): Promise<Server> {
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
          const missing =
            typeof r === 'boolean'
              ? ''
              : [r.database ? '' : 'database unreachable', r.kafka ? '' : 'no connected Kafka producer']
                  .filter(Boolean)
                  .join(', ');
          res
            .writeHead(ok ? 200 : 503, { 'content-type': 'text/plain' })
            .end(ok ? 'ready\n' : `not ready${missing ? `: ${missing}` : ''}\n`);
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
    server.listen(port, resolve);
  });
  server.unref();
  return server;
}
