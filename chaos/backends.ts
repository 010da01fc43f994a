/**
 * Which PostgreSQL backends serve a process of the run, found by its sockets rather than by
 * `application_name`: a WAL relay names its own connections (`outboxkit-wal-relay-<random>`), so
 * `PGAPPNAME` does not tell one relay process from another. Linux only (`/proc`).
 */
import fs from 'node:fs';
import type pg from 'pg';

/**
 * Local TCP ports of the sockets process `pid` holds open to remote port `remotePort`: its file
 * descriptors that are sockets (`/proc/<pid>/fd`), looked up by inode in `/proc/net/tcp` and
 * `/proc/net/tcp6` (a local port may serve connections to other servers too). Empty when the
 * process is gone or `/proc` cannot be read.
 */
export function socketPortsOf(pid: number, remotePort: number): number[] {
  const inodes = new Set<string>();
  let fds: string[] = [];
  try {
    fds = fs.readdirSync(`/proc/${pid}/fd`);
  } catch {
    return [];
  }
  for (const fd of fds) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (m) inodes.add(m[1]!);
    } catch {
      // closed meanwhile
    }
  }
  const ports: number[] = [];
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8');
    } catch {
      continue;
    }
    // Columns: sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      const port = (address: string) => parseInt(address.split(':').at(-1)!, 16);
      if (f.length > 9 && inodes.has(f[9]!) && port(f[2]!) === remotePort) ports.push(port(f[1]!));
    }
  }
  return ports;
}

/**
 * The pids of the client backends (not walsenders) of the run's database whose client port is one
 * of process `pid`'s sockets.
 */
export async function backendsOfProcess(pool: pg.Pool, pid: number): Promise<number[]> {
  const server = await pool.query<{ port: number }>('SELECT inet_server_port() AS port');
  const ports = socketPortsOf(pid, server.rows[0]!.port);
  if (ports.length === 0) return [];
  const r = await pool.query<{ pid: number }>(
    `SELECT pid FROM pg_stat_activity
      WHERE datname = current_database() AND backend_type = 'client backend'
        AND client_port = ANY($1::int[]) AND pid <> pg_backend_pid()`,
    [ports],
  );
  return r.rows.map((row) => row.pid);
}
