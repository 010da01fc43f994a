/**
 * The WAL relay through a PostgreSQL outage: its connections go through a TCP proxy the test cuts
 * (every connection closed, new ones refused) and restores. The lost replication stream is a
 * `stream` error; the attempts that follow, refused by the database while the relay checks its
 * slot and starts a reader, are `database` errors (the daemon's
 * `outboxkit_wal_relay_errors_total{what="database"}`), and the relay streams again once the
 * database is back.
 */
import net from 'node:net';
import { beforeAll, describe, expect, it } from 'vitest';
import { createWalRelay, type WalRelayEvents } from '../../relay/wal/wal-relay.js';
import { withPgTransaction } from '../../src/database.js';
import { isOutboxkitError } from '../../src/errors.js';
import type { Logger } from '../../src/logger.js';
import { createOutbox } from '../../src/outbox/enqueue.js';
import type { TestDatabase } from '../helpers/db.js';
import { createTopics } from '../helpers/kafka.js';
import { waitFor } from '../helpers/wait-for.js';
import { walRelayTestFile } from '../helpers/wal.js';

const PUBLICATION = 'outboxkit_wal_outage';
const outbox = createOutbox({ source: 'wal' });
const file = walRelayTestFile(PUBLICATION, { poolSize: 2 });
const { relays } = file;
let db: TestDatabase;
beforeAll(() => {
  db = file.db;
});

/** A TCP proxy to `target` on a port of its own: `down()` closes every connection and the port, `up()` opens it again. */
async function databaseProxy(target: URL) {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: target.hostname, port: Number(target.port) });
    for (const [a, b] of [
      [client, upstream],
      [upstream, client],
    ] as const) {
      sockets.add(a);
      a.pipe(b);
      a.on('error', () => b.destroy());
      a.on('close', () => {
        sockets.delete(a);
        b.destroy();
      });
    }
  });
  const listen = (port: number) =>
    new Promise<number>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => {
        server.off('error', reject);
        resolve((server.address() as net.AddressInfo).port);
      });
    });
  const port = await listen(0);
  return {
    port,
    async down() {
      const closed = new Promise((resolve) => server.close(resolve));
      for (const s of sockets) s.destroy();
      await closed;
    },
    async up() {
      await listen(port);
    },
    async end() {
      for (const s of sockets) s.destroy();
      if (server.listening) await new Promise((resolve) => server.close(resolve));
    },
  };
}

describe('WAL relay during a database outage', () => {
  // Breach caught: a database outage counted as replication-stream failures only, so that
  // outboxkit_wal_relay_errors_total{what="database"} stays 0 while PostgreSQL refuses the relay.
  it('counts the refused reconnections as database errors, then streams again', async () => {
    const [topic] = await createTopics(['wal-db-outage'], { partitions: 1 });
    const slot = await file.createStreamingSlot('outage');
    const target = new URL(db.url);
    const proxy = await databaseProxy(target);
    // The relay's log, shown if the test fails (a CI run once saw no publish within 20 s after the outage).
    const lines: string[] = [];
    const line = (level: string) => (obj: Record<string, unknown>, msg?: string) =>
      lines.push(
        `${level} ${msg ?? ''} ${JSON.stringify(obj, (_k, v: unknown) => (v instanceof Error ? v.message : v)).slice(0, 400)}`,
      );
    const logger: Logger = { debug: () => {}, info: line('info'), warn: line('warn'), error: line('error') };
    try {
      const viaProxy = new URL(db.url);
      viaProxy.host = `127.0.0.1:${proxy.port}`;
      const relay = createWalRelay(
        file.relayOptions(slot, { connection: viaProxy.toString(), retryMaxMs: 300, logger }),
      );
      relays.push(relay);
      const errors: WalRelayEvents['wal:error'][0][] = [];
      relay.on('wal:error', (e) => errors.push(e));
      await relay.start();
      const write = (n: number) =>
        withPgTransaction(db.pool, (c) =>
          outbox.enqueue(c, [{ topic: topic!, key: 'k', type: 'test.event', payload: n }]),
        );
      await write(1);
      await waitFor(() => relay.stats().published === 1, { timeoutMs: 15_000, message: 'first event not published' });

      await proxy.down();
      await waitFor(() => errors.filter((e) => e.what === 'database').length >= 2, {
        timeoutMs: 15_000,
        message: () => `no database errors while PostgreSQL refuses (${JSON.stringify(errors.map((e) => e.what))})`,
      });
      // The stream's loss first, then the refused checks of the slot (or starts of a reader).
      expect(errors[0]?.what).toBe('stream');
      const refused = errors.filter((e) => e.what === 'database');
      expect(refused.every((e) => isOutboxkitError(e.error, 'OUTBOXKIT_WAL_STREAM_FAILED'))).toBe(true);
      expect(refused.map((e) => (e.error.cause as { code?: string } | undefined)?.code)).toContain('ECONNREFUSED');

      await proxy.up();
      await write(2);
      let ended: unknown;
      relay.ended.catch((err: unknown) => (ended = err));
      await waitFor(() => relay.stats().published === 2, {
        timeoutMs: 40_000,
        message: () =>
          `not published after the outage (stats ${JSON.stringify(relay.stats())}, ended ${String(ended)}, ` +
          `errors ${JSON.stringify(errors.slice(-5).map((e) => [e.what, e.error.message]))}, log:\n${lines.slice(-30).join('\n')})`,
      });
    } finally {
      for (const r of relays.splice(0)) await r.stop({ timeoutMs: 2_000 });
      await proxy.end();
    }
  }, 90_000);
});
