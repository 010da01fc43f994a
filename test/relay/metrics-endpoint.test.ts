/**
 * The relay's /metrics, /healthz and /readyz under a flood of requests, and where they listen:
 * a flood costs one round of database queries per refresh interval (counted on the real pool the
 * endpoints use), and the server listens on 127.0.0.1 unless told otherwise (a non-loopback
 * address of this host is refused).
 */
import type { Server } from 'node:http';
import { connect } from 'node:net';
import { networkInterfaces } from 'node:os';
import pg from 'pg';
import client from 'prom-client';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  relayMetrics,
  relayReadiness,
  serveMetrics,
  RELAY_METRICS_REFRESH_MS,
  type RelayReadiness,
} from '../../relay/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { startRelay } from '../helpers/relay.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
const servers: Server[] = [];
beforeAll(async () => {
  db = await createTestDatabase();
});
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});
afterAll(async () => {
  await db.drop();
});

async function serve(
  registry: client.Registry,
  ready: () => Promise<boolean | RelayReadiness>,
  options?: { host?: string },
): Promise<{ server: Server; port: number }> {
  const server = await serveMetrics(registry, 0, ready, options);
  servers.push(server);
  return { server, port: (server.address() as { port: number }).port };
}

/** An IPv4 address of this host that is not loopback, if it has one. */
function nonLoopbackAddress(): string | undefined {
  return Object.values(networkInterfaces())
    .flat()
    .find((a) => a !== undefined && a.family === 'IPv4' && !a.internal)?.address;
}

/** Whether a TCP connection to host:port is accepted. */
function accepts(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port, timeout: 5_000 });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
    socket.once('timeout', () => {
      socket.destroy();
      resolve(false);
    });
  });
}

describe('relay endpoints under a flood of requests', () => {
  it('60 concurrent scrapes and probes cost one round of queries; the next round comes after the refresh interval', async () => {
    const relay = await startRelay(db.url);
    const pool = new pg.Pool({ connectionString: db.url, max: 2 });
    // The real pool, with every query it runs counted (the endpoints' only way to the database).
    const queries: string[] = [];
    const query = pool.query.bind(pool) as (text: string) => Promise<pg.QueryResult>;
    (pool as unknown as { query: (text: string) => Promise<pg.QueryResult> }).query = (text: string) => {
      queries.push(text);
      return query(text);
    };
    try {
      const registry = new client.Registry();
      relayMetrics(relay, pool, registry);
      const { port } = await serve(registry, relayReadiness(relay, pool));
      const get = async (path: string) => {
        const res = await fetch(`http://127.0.0.1:${port}${path}`);
        return { status: res.status, body: await res.text() };
      };
      const flood = () => Promise.all(Array.from({ length: 60 }, (_, i) => get(i % 2 === 0 ? '/metrics' : '/readyz')));

      // The snapshot is read during this flood: the next one is due an interval after that read,
      // so at least an interval after the flood began.
      const floodBegan = performance.now();
      const first = await flood();
      expect(first.map((r) => r.status)).toEqual(Array(60).fill(200));
      expect(first[0]!.body).toMatch(/outboxkit_relay_lanes_unowned 0\n/);
      expect(first[1]!.body).toBe('ready\n');
      // One backlog query, one lane query, one SELECT 1: not one (or two) per request.
      expect(queries).toHaveLength(3);

      await flood();
      expect(queries).toHaveLength(3);

      // Scrapes keep coming; the database is asked again only once the interval has passed.
      await waitFor(
        async () => {
          await get('/metrics');
          return queries.length > 3;
        },
        { intervalMs: 200 },
      );
      expect(performance.now() - floodBegan).toBeGreaterThanOrEqual(RELAY_METRICS_REFRESH_MS);
      expect(queries).toHaveLength(5);
    } finally {
      await relay.stopAndForget();
      await pool.end();
    }
  });
});

describe('where the endpoints listen', () => {
  it('127.0.0.1 by default: a non-loopback address of this host is refused; 0.0.0.0 when asked', async () => {
    const registry = new client.Registry();
    const local = await serve(registry, async () => true);
    expect(local.server.address()).toMatchObject({ address: '127.0.0.1' });
    expect(await accepts('127.0.0.1', local.port)).toBe(true);
    const outside = nonLoopbackAddress();
    if (outside !== undefined) expect(await accepts(outside, local.port)).toBe(false);

    const everywhere = await serve(registry, async () => true, { host: '0.0.0.0' });
    expect(everywhere.server.address()).toMatchObject({ address: '0.0.0.0' });
    if (outside !== undefined) {
      const res = await fetch(`http://${outside}:${everywhere.port}/healthz`);
      expect(await res.text()).toBe('ok\n');
    }
  });

  it('refuses a host that is not an IP address, and an unknown option', async () => {
    const registry = new client.Registry();
    await expect(serveMetrics(registry, 0, async () => true, { host: 'example.com' })).rejects.toMatchObject({
      code: 'OUTBOXKIT_INVALID_OPTIONS',
    });
    await expect(serveMetrics(registry, 0, async () => true, { hots: '::' } as never)).rejects.toMatchObject({
      code: 'OUTBOXKIT_INVALID_OPTIONS',
    });
  });
});
