/**
 * Prometheus metrics and health endpoints of the relay daemon (prom-client).
 */
import { createServer, type Server } from 'node:http';
import client from 'prom-client';
import type pg from 'pg';
import type { Relay } from './relay.js';
import { backlog } from './sql.js';
import { quoteSchema } from '../src/schema-name.js';

/** Metrics of one relay, registered on `registry`. */
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
  relay.on('relay:published', ({ count }) => published.inc(count));
  relay.on('relay:error', () => failures.inc());
  relay.on('relay:lanes', ({ held }) => lanes.set(held.length));

  // Backlog figures are read from the database when Prometheus scrapes, not on the hot path.
  const q = { query: async <R>(text: string) => ({ rows: (await pool.query(text)).rows as R[], rowCount: 0 }) };
  const figures = () => backlog(q, schema);
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
}

/**
 * Serves `/metrics` (Prometheus text format), `/healthz` (the process answers) and `/readyz`
 * (the relay holds lanes or is waiting for them, and PostgreSQL answers).
 *
 * @param port - TCP port on 0.0.0.0; 0 picks a free one.
 */
export async function serveMetrics(
  registry: client.Registry,
  port: number,
  ready: () => Promise<boolean>,
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
          const ok = await ready().catch(() => false);
          res.writeHead(ok ? 200 : 503, { 'content-type': 'text/plain' }).end(ok ? 'ready\n' : 'not ready\n');
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
