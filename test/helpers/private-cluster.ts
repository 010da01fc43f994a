/**
 * A PostgreSQL cluster of a test file's own, for tests that need server-wide settings the shared
 * servers (5432, 5433) must not get: `initdb` into a folder of os.tmpdir() and `pg_ctl` on a free
 * port, through scripts/services.ts (`localCluster`, `startLocalCluster`, `runAs`: as root the
 * server runs as `postgres`). Started in the test process's session (an interrupted run stops it
 * too), stopped (`pg_ctl stop -m immediate`) and removed by `stop()`, whatever happened. Without
 * PostgreSQL binaries it gives a skip reason instead, which it also prints once.
 */
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';

import { localCluster, runAs, startLocalCluster } from '../../scripts/services.js';

/**
 * The settings every private cluster of the tests starts from, on `port`: loopback only, logical
 * WAL with a few slots and senders, a small server, and no fsync (a throwaway cluster on a loaded
 * machine). A test spreads its own settings over them.
 */
export function privateClusterBaseSettings(port: number): Record<string, string> {
  return {
    listen_addresses: `'127.0.0.1'`,
    port: String(port),
    wal_level: 'logical',
    max_replication_slots: '4',
    max_wal_senders: '4',
    max_connections: '30',
    shared_buffers: `'16MB'`,
    fsync: 'off',
  };
}

export interface PrivateClusterOptions {
  /** The test file, in the skip warning: `test/wal/slot-invalidation.test.ts`. */
  file: string;
  /** The folder's prefix under os.tmpdir(): `outboxkit-slot-lost`. */
  folder: string;
  /** The server in log lines and errors: `slot invalidation test`. */
  what: string;
  /** The settings of its `outboxkit.conf` on `port` (`listen_addresses` and `port` among them). */
  settings: (port: number) => Record<string, string>;
}

export interface PrivateCluster {
  /** Why the file skips (no PostgreSQL binaries), or undefined when it can run. */
  readonly skipReason: string | undefined;
  /** Starts the cluster (on another free port when one was taken meanwhile); its URL (user and database `postgres`). */
  start(): Promise<string>;
  /** Stops the cluster if it runs, and removes its folder. */
  stop(): Promise<void>;
}

/** A TCP port nothing listens on now, on 127.0.0.1. */
async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

export function privateCluster(o: PrivateClusterOptions): PrivateCluster {
  const cluster = localCluster(() =>
    path.join(os.tmpdir(), `${o.folder}-${process.pid}-${randomBytes(4).toString('hex')}`),
  );
  const skipReason =
    cluster === undefined
      ? 'skipped: no PostgreSQL binaries (/usr/lib/postgresql/<major>/bin/initdb); this file runs a cluster of its own'
      : undefined;
  if (skipReason !== undefined) console.warn(`${o.file} ${skipReason}`);
  return {
    skipReason,
    async start() {
      if (cluster === undefined) throw new Error(`${o.file}: ${skipReason}`);
      // Another process may take the free port before the server binds it: try again on another.
      let lastError: unknown;
      for (let attempt = 0; attempt < 3; attempt += 1) {
        const port = await freePort();
        try {
          await startLocalCluster(cluster, {
            title: `PostgreSQL (${o.what})`,
            role: `the ${o.what}'s cluster`,
            fallback: 'install PostgreSQL (Debian: apt-get install postgresql)',
            settings: o.settings(port),
            startTimeoutMs: 60_000,
            // In the test process's session: an interrupted run stops it too.
            detached: false,
          });
          return `postgres://postgres@127.0.0.1:${port}/postgres`;
        } catch (err) {
          lastError = err;
        }
      }
      throw lastError;
    },
    async stop() {
      if (cluster === undefined) return;
      if (fs.existsSync(path.join(cluster.dataDir, 'postmaster.pid'))) {
        await runAs(cluster, cluster.bin('pg_ctl'), ['-D', cluster.dataDir, '-m', 'immediate', '-w', 'stop'], 30_000);
      }
      fs.rmSync(cluster.home, { recursive: true, force: true });
    },
  };
}
