/**
 * What the demo (`npm run demo`) and the chaos harness (`npm run chaos`) share to run the
 * pipeline: child processes of the example's services with their last output lines, a poll-until
 * helper that notices a dead child, a database of their own for one run, and in WAL mode the WAL
 * relays' slot (who reads it; dropping it at the end).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import pg from 'pg';
import { dropWalSlot, walSlotsStatus } from '../../relay/wal/slot-sql.js';

const here = path.dirname(fileURLToPath(import.meta.url));

/** The repository root (the children's working directory). */
export const ROOT = path.resolve(here, '..', '..');
/** Scripts of the pipeline's services, run with tsx. */
export const SCRIPTS = Object.freeze({
  orders: path.join(here, 'server.ts'),
  shipping: path.join(here, 'shipping.ts'),
  cli: path.join(ROOT, 'cli', 'main.ts'),
});

/** One running service. */
export interface Child {
  name: string;
  proc: ChildProcess;
  /** The last `keepLines` lines of stdout and stderr, interleaved. */
  lines: string[];
}

/**
 * Spawns `node --import tsx <script> <args>` with `env` on top of this process's environment,
 * keeping its last `keepLines` lines; `onLine` sees every line (stdout and stderr) as it comes.
 */
export function startChild(
  name: string,
  script: string,
  args: string[],
  env: Record<string, string>,
  keepLines = 200,
  onLine?: (line: string) => void,
): Child {
  const proc = spawn(process.execPath, ['--import', 'tsx', script, ...args], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const child: Child = { name, proc, lines: [] };
  for (const stream of [proc.stdout, proc.stderr]) {
    createInterface({ input: stream! }).on('line', (line) => {
      child.lines.push(line);
      if (child.lines.length > keepLines) child.lines.shift();
      onLine?.(line);
    });
  }
  return child;
}

/** Whether the child has exited (or was killed). */
export function hasExited(child: Child): boolean {
  return child.proc.exitCode !== null || child.proc.signalCode !== null;
}

/** SIGTERM, then SIGKILL after `timeoutMs` (ms); resolves once the child has exited. */
export async function stopChild(child: Child, timeoutMs = 20_000): Promise<void> {
  if (hasExited(child)) return;
  const exited = new Promise<void>((r) => child.proc.once('exit', () => r()));
  child.proc.kill('SIGTERM');
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), timeoutMs);
  await exited;
  clearTimeout(timer);
}

/**
 * Polls `check` every 200 ms until it returns true (a throw counts as false). Fails after
 * `timeoutMs` (ms), or at once when one of `watched` exits, with its last output lines.
 */
export async function waitUntil(
  what: string,
  check: () => Promise<boolean>,
  timeoutMs: number,
  watched: () => Child[],
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    for (const c of watched()) {
      if (c.proc.exitCode !== null)
        throw new Error(
          `${c.name} exited (${c.proc.exitCode}) while waiting for ${what}:\n${c.lines.slice(-20).join('\n')}`,
        );
    }
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** A database created for one run. */
export interface RunDatabase {
  name: string;
  /** Its connection string. */
  url: string;
  /** Drops it (`WITH (FORCE)`: the run's services may still hold connections). */
  drop(): Promise<void>;
}

/** Creates database `name` (a plain identifier) through `adminUrl` and returns its URL. */
export async function createRunDatabase(adminUrl: string, name: string): Promise<RunDatabase> {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name)) throw new Error(`Not a plain database name: ${name}`);
  const admin = async (sql: string) => {
    const c = new pg.Client({ connectionString: adminUrl });
    await c.connect();
    try {
      await c.query(sql);
    } finally {
      await c.end();
    }
  };
  await admin(`CREATE DATABASE ${name}`);
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return { name, url: url.toString(), drop: () => admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`) };
}

/** The relay holding the lease of the WAL relays' slot `slot` (null when none). */
export async function slotReader(pool: pg.Pool, slot: string): Promise<string | null> {
  const db = {
    query: async <R>(text: string, values: readonly unknown[] = []) => {
      const r = await pool.query(text, [...values]);
      return { rows: r.rows as R[], rowCount: r.rowCount ?? 0 };
    },
  };
  const [status] = await walSlotsStatus(db, '"outboxkit"', slot);
  return status?.active === true && (status.leaseRemainingMs ?? 0) > 0 ? status.leaseOwner : null;
}

/**
 * Drops the WAL relays' slot `slot` (and its rows) once their walsenders have ended (they end with
 * the stopped relays' connections): a slot keeps WAL, and its database from being dropped, until
 * it is dropped. Tries for up to 20 s; then throws the last error.
 */
export async function dropRelaySlot(pool: pg.Pool, slot: string): Promise<void> {
  let last: unknown;
  await waitUntil(
    'the WAL relays to release the slot',
    async () => {
      try {
        await dropWalSlot(pool, '"outboxkit"', slot);
        return true;
      } catch (err) {
        last = err;
        return false;
      }
    },
    20_000,
    () => [],
  ).catch((err: Error) => {
    throw last ?? err;
  });
}
