/**
 * Local services for development, tests and CI: PostgreSQL and a real Apache Kafka broker,
 * without Docker.
 *
 * - PostgreSQL: `DATABASE_URL`, else the Debian cluster on 127.0.0.1:5432 (started with
 *   `pg_ctlcluster` when it is installed but down).
 * - PostgreSQL at `wal_level=logical` for the WAL source's tests: `WAL_DATABASE_URL`, else a
 *   cluster of this project's own on 127.0.0.1:5433 (`initdb` + `pg_ctl` into
 *   `.services/postgres-<major>-wal/`; see {@link ensureWalPostgres}). The machine's server is
 *   never reconfigured.
 * - Kafka: `KAFKA_BROKERS`, else whatever answers on 127.0.0.1:9092, else a single-node KRaft
 *   broker (combined broker + controller) whose jars Maven resolves from Maven Central through
 *   `scripts/kafka/pom.xml` into `.services/kafka-<version>/`. `OUTBOXKIT_KAFKA_VERSION` picks the
 *   line: `3` / `3.9` (default, 3.9.2) or `4` (4.4.0), or an exact `3.9.x` / `4.x.y`.
 * - `OUTBOXKIT_KAFKA_NODES=3`: instead of that broker, a 3-node KRaft cluster on 127.0.0.1:9192,
 *   :9292 and :9392 (each node a broker and a controller; ports, settings and heaps in
 *   scripts/broker-config.ts), storage under `.services/cluster-<version>/node-<id>/`. Helpers for
 *   fault-injection tests: {@link clusterNodes}, {@link killClusterNode},
 *   {@link restartClusterNode}, {@link restartClusterNodes}, {@link partitionLeaders},
 *   {@link activeController}.
 *
 * Usable as a module (vitest global setup, the demo) and as a CLI:
 *   tsx scripts/services.ts up | down | status
 *
 * Brokers are started detached, so they outlive the process that started them; `down` (or
 * {@link stopKafka} and {@link stopKafkaCluster}) stops them, and only brokers this project
 * started (pid files).
 */
import { execFile, spawn } from 'node:child_process';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import kafkajs from 'kafkajs';
import pg from 'pg';

import {
  CLUSTER_HEAP_MB,
  CLUSTER_NODE_IDS,
  CONTROLLER_ADDRESS,
  KAFKA_LINES,
  LOCAL_BROKER,
  SINGLE_BROKER_HEAP_MB,
  clusterAddresses,
  kafkaLine,
  parseQuorumState,
  quorumLeader,
  resolveKafkaNodes,
  serverProperties,
} from './broker-config.js';
import { applyKafkajsMetadataFix } from '../src/kafka/kafkajs/metadata-fix.js';
import { probeDocker, startContainers } from './containers.js';
import { isCi, needsDockerProbe, planCluster, planServices, type ServiceFacts } from './service-plan.js';

const { Kafka, Partitioners, logLevel } = kafkajs;

export type Log = (msg: string) => void;

const noop: Log = () => {};

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SERVICES_DIR = path.join(ROOT, '.services');
const KAFKA_SCRIPTS_DIR = path.join(ROOT, 'scripts', 'kafka');
const POM = path.join(KAFKA_SCRIPTS_DIR, 'pom.xml');
const LOCK_FILE = path.join(SERVICES_DIR, 'kafka.lock');
const CLUSTER_LOCK_FILE = path.join(SERVICES_DIR, 'kafka-cluster.lock');

const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/postgres';

const POSTGRES_WAIT_MS = 30_000;
const KAFKA_ENV_WAIT_MS = 30_000;
const KAFKA_READY_MS = 90_000;
/** Three JVMs starting at once on two cores, then a quorum election and three registrations. */
const KAFKA_CLUSTER_READY_MS = 150_000;
const KAFKA_STOP_MS = 30_000;
/** Long enough for a cold Maven download plus a broker start by another process. */
const LOCK_WAIT_MS = 300_000;
const LOCK_STALE_MS = 600_000;
const JAVA_MIN_MAJOR = 17;

const TOOLCHAIN_HINT =
  'Install Java 17+ and Maven, or Docker with docker-compose.yml, or set KAFKA_BROKERS to a running broker.';

// ---------------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------------

/**
 * Returns a database URL that answers: `DATABASE_URL` if set, else
 * `postgres://postgres@127.0.0.1:5432/postgres` (trust auth), starting the local Debian cluster
 * with `pg_ctlcluster` when nothing answers there.
 *
 * @throws Error when nothing answers within 30 s, naming what was tried.
 */
export async function ensurePostgres(log: Log = noop): Promise<string> {
  const fromEnv = process.env.DATABASE_URL?.trim() || undefined;
  const url = fromEnv ?? DEFAULT_DATABASE_URL;
  const shown = redactUrl(url);

  let probe = await probePostgres(url);
  if (probe.ok) {
    log(`PostgreSQL answers at ${shown}`);
    return url;
  }
  if (!probe.unreachable) {
    // Something answered but refused us (auth, missing database): starting a server won't help.
    throw new Error(`PostgreSQL at ${shown} answered but the connection failed: ${probe.error}`);
  }

  if (fromEnv) {
    log(`PostgreSQL at ${shown} (DATABASE_URL) does not answer yet; waiting up to ${POSTGRES_WAIT_MS / 1000} s`);
  } else {
    await startLocalPostgres(log);
  }

  const deadline = Date.now() + POSTGRES_WAIT_MS;
  while (Date.now() < deadline) {
    await sleep(500);
    probe = await probePostgres(url);
    if (probe.ok) {
      log(`PostgreSQL answers at ${shown}`);
      return url;
    }
    if (!probe.unreachable) break;
  }
  throw new Error(
    `PostgreSQL does not answer at ${shown}: ${probe.error}. ` +
      (fromEnv
        ? 'Check DATABASE_URL and that the server is running.'
        : 'Install and start PostgreSQL (Debian: apt-get install postgresql), or set DATABASE_URL.'),
  );
}

interface PgProbe {
  ok: boolean;
  /** True when nothing is listening (yet): worth starting or waiting. */
  unreachable: boolean;
  error?: string;
  /** The probe query's first column of its first row. */
  value?: string;
}

async function probePostgres(url: string, query = 'select 1'): Promise<PgProbe> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3_000 });
  // An error emitted after connect() failed would otherwise be unhandled.
  client.on('error', () => {});
  try {
    await client.connect();
    const res = await client.query<Record<string, unknown>>(query);
    const first = res.rows[0] === undefined ? undefined : Object.values(res.rows[0])[0];
    return { ok: true, unreachable: false, ...(first === undefined ? {} : { value: String(first) }) };
  } catch (err) {
    const e = err as { code?: string; message?: string };
    const unreachable =
      e.code === 'ECONNREFUSED' ||
      e.code === 'ENOENT' ||
      e.code === 'ECONNRESET' ||
      e.code === '57P03' || // cannot_connect_now: the server is starting up
      /timeout/i.test(e.message ?? '');
    return {
      ok: false,
      unreachable,
      error: `${e.code ? `${e.code} ` : ''}${e.message ?? String(err)}`,
    };
  } finally {
    await client.end().catch(() => {});
  }
}

async function startLocalPostgres(log: Log): Promise<void> {
  const etc = '/etc/postgresql';
  if (!fs.existsSync(etc)) {
    throw new Error(
      `PostgreSQL does not answer at ${redactUrl(DEFAULT_DATABASE_URL)} and no local cluster is installed (${etc} is missing). ` +
        'Install PostgreSQL (Debian: apt-get install postgresql) or set DATABASE_URL.',
    );
  }
  // Newest installed major first, e.g. ['16', '15'].
  const versions = fs
    .readdirSync(etc)
    .filter((v) => fs.existsSync(path.join(etc, v, 'main')))
    .sort((a, b) => Number(b) - Number(a));
  const version = versions[0];
  if (version === undefined) {
    throw new Error(
      `PostgreSQL is installed but ${etc} has no "main" cluster; create one (pg_createcluster) or set DATABASE_URL.`,
    );
  }
  log(`PostgreSQL does not answer; starting cluster ${version}/main with pg_ctlcluster`);
  const res = await run('pg_ctlcluster', ['--skip-systemctl-redirect', version, 'main', 'start'], {
    timeoutMs: 60_000,
  });
  // Exit 2 means "already running" (e.g. listening on another address); the wait below decides.
  if (res.code !== 0 && !/already running/i.test(res.stderr)) {
    throw new Error(
      `pg_ctlcluster ${version} main start failed (exit ${res.code}): ${lastLines(res.stderr || res.stdout, 10)}`,
    );
  }
}

function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '<unparseable DATABASE_URL>';
  }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL at wal_level=logical (the WAL source's tests)
// ---------------------------------------------------------------------------------------------

/** Port of this project's own logical-replication cluster (the machine's server keeps 5432). */
export const WAL_POSTGRES_PORT = 5433;
const DEFAULT_WAL_DATABASE_URL = `postgres://postgres@127.0.0.1:${WAL_POSTGRES_PORT}/postgres`;
const WAL_LOCK_FILE = path.join(SERVICES_DIR, 'postgres-wal.lock');
const WAL_POSTGRES_START_MS = 60_000;

/**
 * Settings of the WAL cluster, rewritten into its `outboxkit.conf` at every start (so a checkout's
 * older data directory picks up new ones). Small: it runs beside the machine's server, a broker
 * and the tests on two cores.
 */
const WAL_POSTGRES_SETTINGS: Readonly<Record<string, string>> = {
  listen_addresses: `'127.0.0.1'`,
  port: String(WAL_POSTGRES_PORT),
  wal_level: 'logical',
  max_replication_slots: '20',
  max_wal_senders: '20',
  max_connections: '60',
  shared_buffers: `'32MB'`,
  // Replication slots the tests forget would otherwise retain WAL without bound on this disk.
  max_slot_wal_keep_size: `'1GB'`,
};

/**
 * Returns the URL of a PostgreSQL server at `wal_level=logical` for the WAL source's tests:
 * `WAL_DATABASE_URL` if set, else this project's own cluster on 127.0.0.1:5433 (trust auth),
 * created with `initdb` under `.services/postgres-<major>-wal/` and started with `pg_ctl` when
 * nothing answers there. The machine's server on 5432 is never reconfigured. As root, `initdb`
 * and `pg_ctl` run as the `postgres` user (PostgreSQL refuses to run as root), and the cluster
 * lives in `/var/tmp/outboxkit-<hash>/` when that user cannot traverse the checkout. The server is
 * started in a session of its own, so it outlives the caller; {@link stopWalPostgres} stops it.
 *
 * @throws Error when the server does not answer, answers below `wal_level=logical`, or cannot be
 *   created or started (no PostgreSQL binaries, no `postgres` user as root), naming what to fix.
 */
export async function ensureWalPostgres(log: Log = noop): Promise<string> {
  const fromEnv = process.env.WAL_DATABASE_URL?.trim() || undefined;
  const url = fromEnv ?? DEFAULT_WAL_DATABASE_URL;
  const shown = redactUrl(url);
  let probe = await probeWalPostgres(url);
  if (probe.ok || !probe.unreachable || fromEnv) return walProbeResult(probe, url, fromEnv !== undefined, log);

  const release = await acquireLock(log, WAL_LOCK_FILE, 'PostgreSQL (WAL)');
  try {
    // Another process may have started it while we waited for the lock.
    probe = await probeWalPostgres(url);
    if (!probe.ok && probe.unreachable) {
      const started = Date.now();
      await startWalCluster(log);
      probe = await probeWalPostgres(url);
      if (probe.ok) log(`PostgreSQL (WAL) started at ${shown} in ${seconds(Date.now() - started)}`);
    }
  } finally {
    release();
  }
  return walProbeResult(probe, url, false, log);
}

/**
 * Stops the WAL cluster this checkout started (`pg_ctl stop -m fast` on its own data directory);
 * any other server, the one on 5432 included, is left alone.
 *
 * @returns whether a running cluster was stopped.
 */
export async function stopWalPostgres(log: Log = noop): Promise<boolean> {
  const cluster = walCluster();
  if (cluster === undefined || !fs.existsSync(path.join(cluster.dataDir, 'postmaster.pid'))) {
    log('No PostgreSQL (WAL) cluster started by this project is running');
    return false;
  }
  const res = await runAs(cluster, cluster.bin('pg_ctl'), ['-D', cluster.dataDir, '-m', 'fast', '-w', 'stop'], 60_000);
  if (res.code !== 0) {
    if (/Is server running\?/i.test(res.stderr)) {
      log('No PostgreSQL (WAL) cluster started by this project is running');
      return false;
    }
    throw new Error(`pg_ctl stop failed (exit ${res.code}): ${lastLines(res.stderr || res.stdout, 10)}`);
  }
  log(`PostgreSQL (WAL) stopped (${shownPath(cluster.home)})`);
  return true;
}

async function probeWalPostgres(url: string): Promise<PgProbe> {
  return probePostgres(url, 'show wal_level');
}

function walProbeResult(probe: PgProbe, url: string, fromEnv: boolean, log: Log): string {
  const shown = redactUrl(url);
  if (!probe.ok) {
    throw new Error(
      `PostgreSQL (WAL) does not answer at ${shown}: ${probe.error}. ` +
        (fromEnv
          ? 'Check WAL_DATABASE_URL and that the server is running.'
          : 'Install PostgreSQL (Debian: apt-get install postgresql) or set WAL_DATABASE_URL.'),
    );
  }
  if (probe.value !== 'logical') {
    throw new Error(
      `PostgreSQL at ${shown}${fromEnv ? ' (WAL_DATABASE_URL)' : ''} runs at wal_level=${probe.value ?? '?'}; ` +
        'the WAL source needs wal_level=logical. ' +
        (fromEnv
          ? 'Point WAL_DATABASE_URL at such a server.'
          : `Free port ${WAL_POSTGRES_PORT} for this project's own cluster, or set WAL_DATABASE_URL.`),
    );
  }
  log(`PostgreSQL (WAL) answers at ${shown}`);
  return url;
}

/** A PostgreSQL cluster of this project's own, run with the machine's `initdb` and `pg_ctl`. */
export interface LocalCluster {
  home: string;
  dataDir: string;
  bin(name: string): string;
  /** The user that owns the data directory and runs the server: set when we are root. */
  runAsUser?: string;
}

/**
 * A cluster in `home(major)` (its data directory `<home>/data`) on the newest installed major's
 * binaries (`/usr/lib/postgresql/<major>/bin/initdb`), or undefined when none is installed. As root
 * it runs as `postgres` (PostgreSQL refuses to run as root), which must be able to reach `home`.
 */
export function localCluster(home: (major: string) => string): LocalCluster | undefined {
  const libDir = '/usr/lib/postgresql';
  let majors: string[];
  try {
    majors = fs
      .readdirSync(libDir)
      .filter((v) => fs.existsSync(path.join(libDir, v, 'bin', 'initdb')))
      .sort((a, b) => Number(b) - Number(a));
  } catch {
    return undefined;
  }
  const major = majors[0];
  if (major === undefined) return undefined;
  const dir = home(major);
  return {
    home: dir,
    dataDir: path.join(dir, 'data'),
    bin: (name) => path.join(libDir, major, 'bin', name),
    ...(process.getuid?.() === 0 ? { runAsUser: 'postgres' } : {}),
  };
}

/** The newest installed major's binaries and where the WAL cluster's data directory lives, or undefined. */
function walCluster(): LocalCluster | undefined {
  return localCluster((major) => {
    const name = `postgres-${major}-wal`;
    // As root the server runs as `postgres`, which must traverse the checkout's folders; a checkout
    // under a closed folder (/root) keeps the cluster in /var/tmp instead, under a name of its own.
    return process.getuid?.() !== 0 || traversableBy('postgres', SERVICES_DIR)
      ? path.join(SERVICES_DIR, name)
      : path.join('/var/tmp', `outboxkit-${createHash('sha256').update(ROOT).digest('hex').slice(0, 12)}`, name);
  });
}

/** A path inside the checkout relative to it, any other absolute. */
function shownPath(p: string): string {
  const rel = path.relative(ROOT, p);
  return rel.startsWith('..') ? p : rel;
}

/**
 * Whether `user` may traverse every existing folder on the way to `dir` (their execute bits, read
 * against /etc/passwd and /etc/group; no ACLs). False when the user is unknown.
 */
function traversableBy(user: string, dir: string): boolean {
  const entry = readText('/etc/passwd')
    ?.split('\n')
    .map((l) => l.split(':'))
    .find((f) => f[0] === user);
  const uid = Number(entry?.[2]);
  const gid = Number(entry?.[3]);
  if (!Number.isInteger(uid) || !Number.isInteger(gid)) return false;
  const gids = new Set([gid]);
  for (const line of readText('/etc/group')?.split('\n') ?? []) {
    const f = line.split(':');
    if (f[3]?.split(',').includes(user)) gids.add(Number(f[2]));
  }
  for (let d = path.resolve(dir); ; d = path.dirname(d)) {
    let st: fs.Stats | undefined;
    try {
      st = fs.statSync(d);
    } catch {
      st = undefined; // Not created yet: whoever creates it decides.
    }
    if (st !== undefined) {
      const bit = st.uid === uid ? 0o100 : gids.has(st.gid) ? 0o010 : 0o001;
      if ((st.mode & bit) === 0) return false;
    }
    if (d === path.dirname(d)) return true;
  }
}

async function startWalCluster(log: Log): Promise<void> {
  const cluster = walCluster();
  if (cluster === undefined) {
    throw new Error(
      `PostgreSQL (WAL) does not answer at ${redactUrl(DEFAULT_WAL_DATABASE_URL)} and no PostgreSQL binaries were found ` +
        '(/usr/lib/postgresql/<major>/bin/initdb). Install PostgreSQL (Debian: apt-get install postgresql) or set WAL_DATABASE_URL.',
    );
  }
  await startLocalCluster(
    cluster,
    {
      title: 'PostgreSQL (WAL)',
      role: 'the WAL cluster',
      fallback: 'set WAL_DATABASE_URL',
      settings: WAL_POSTGRES_SETTINGS,
      startTimeoutMs: WAL_POSTGRES_START_MS,
      // Its own session: a Ctrl-C in the terminal that ran `services:up` or the tests does not stop it.
      detached: true,
      ...(cluster.home.startsWith(SERVICES_DIR)
        ? {}
        : { note: `${SERVICES_DIR} is closed to the "postgres" user: the WAL cluster lives in ${cluster.home}` }),
    },
    log,
  );
}

/** How {@link startLocalCluster} names, configures and starts a cluster. */
export interface LocalClusterStart {
  /** The server in log lines: `PostgreSQL (WAL)`. */
  title: string;
  /** The cluster in error messages: `the WAL cluster`. */
  role: string;
  /** What else the user can do, ending error messages: `set WAL_DATABASE_URL`. */
  fallback: string;
  /** Settings written into the data directory's `outboxkit.conf` at every start; `port` among them. */
  settings: Readonly<Record<string, string>>;
  /** ms `pg_ctl start -w` waits for the server. */
  startTimeoutMs: number;
  /** Starts the server in a session of its own, so it outlives the caller. */
  detached: boolean;
  /** Logged once the cluster's folder exists. */
  note?: string;
}

/**
 * Creates the cluster's data directory with `initdb` when it has none (trust auth, user
 * `postgres`), writes `start.settings` (and its socket directory, `home`) into its
 * `outboxkit.conf`, and starts it with `pg_ctl start -w`, logging to `<home>/postgres.log`.
 *
 * @throws Error when there is no user to run it as, that user cannot reach `home`, or `initdb` or
 *   `pg_ctl` fail (with the tail of their output and of the server's log).
 */
export async function startLocalCluster(
  cluster: LocalCluster,
  start: LocalClusterStart,
  log: Log = noop,
): Promise<void> {
  const { title, role, fallback } = start;
  if (cluster.runAsUser !== undefined) {
    const id = await run('id', ['-u', cluster.runAsUser], { timeoutMs: 5_000 });
    if (id.code !== 0) {
      throw new Error(
        `PostgreSQL refuses to run as root and there is no "${cluster.runAsUser}" user to run ${role} as; ` +
          `create it (Debian packages do), run as another user, or ${fallback}.`,
      );
    }
  }
  fs.mkdirSync(cluster.home, { recursive: true });
  if (start.note !== undefined) log(start.note);
  if (cluster.runAsUser !== undefined) {
    // The server's user must reach its data directory through the checkout's folders.
    await run('chown', [cluster.runAsUser, cluster.home], { timeoutMs: 5_000 });
    const reach = await runAs(cluster, 'test', ['-w', cluster.home], 5_000);
    if (reach.code !== 0) {
      throw new Error(
        `The "${cluster.runAsUser}" user cannot reach ${cluster.home} (a parent folder is closed to it), so it cannot ` +
          `hold ${role}; clone the repository under a folder others can traverse, or ${fallback}.`,
      );
    }
  }
  if (!fs.existsSync(path.join(cluster.dataDir, 'PG_VERSION'))) {
    log(`Creating ${title} cluster in ${shownPath(cluster.dataDir)}`);
    fs.rmSync(cluster.dataDir, { recursive: true, force: true });
    const init = await runAs(
      cluster,
      cluster.bin('initdb'),
      ['-D', cluster.dataDir, '-U', 'postgres', '--auth=trust', '--encoding=UTF8', '--locale=C', '--no-sync'],
      120_000,
    );
    if (init.code !== 0) {
      throw new Error(`initdb failed (exit ${init.code}): ${lastLines(init.stderr || init.stdout, 10)}`);
    }
    fs.appendFileSync(path.join(cluster.dataDir, 'postgresql.conf'), "\ninclude 'outboxkit.conf'\n");
  }
  const settings = {
    ...start.settings,
    // Its socket beside its data, not in /var/run/postgresql beside the machine's server.
    unix_socket_directories: `'${cluster.home.replaceAll("'", "''")}'`,
  };
  fs.writeFileSync(
    path.join(cluster.dataDir, 'outboxkit.conf'),
    '# Written by scripts/services.ts at every start; edits are lost.\n' +
      Object.entries(settings)
        .map(([k, v]) => `${k} = ${v}\n`)
        .join(''),
    { mode: 0o644 },
  );
  log(`Starting ${title} on 127.0.0.1:${start.settings.port ?? '5432'} (${shownPath(cluster.dataDir)})`);
  const logFile = path.join(cluster.home, 'postgres.log');
  const res = await runAs(
    cluster,
    cluster.bin('pg_ctl'),
    ['-D', cluster.dataDir, '-l', logFile, '-w', '-t', String(start.startTimeoutMs / 1000), 'start'],
    start.startTimeoutMs + 5_000,
    { detached: start.detached },
  );
  if (res.code !== 0) {
    throw new Error(
      `pg_ctl start failed (exit ${res.code}): ${lastLines(res.stderr || res.stdout, 5)}\n` +
        `${logFile}:\n${lastLines(readText(logFile) ?? '', 10)}`,
    );
  }
}

/** Runs a command as the cluster's user (`runuser` when we are root), else as ourselves. */
export function runAs(
  cluster: LocalCluster,
  cmd: string,
  args: string[],
  timeoutMs: number,
  opts: { detached?: boolean } = {},
): Promise<RunResult> {
  const [file, argv] =
    cluster.runAsUser === undefined ? [cmd, args] : ['runuser', ['-u', cluster.runAsUser, '--', cmd, ...args]];
  return new Promise((resolve) => {
    const child = spawn(file, argv, {
      cwd: '/',
      detached: opts.detached ?? false,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', (err) => {
      clearTimeout(timer);
      resolve({ code: null, stdout, stderr, error: `${file}: ${err.message}` });
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Kafka
// ---------------------------------------------------------------------------------------------

export interface KafkaInfo {
  brokers: string[];
  /** True when this call started the broker (it keeps running after this process exits). */
  startedHere: boolean;
}

/**
 * Returns brokers that answer: `KAFKA_BROKERS` (comma list) if set, else 127.0.0.1:9092 if a
 * broker answers there, else starts a local single-node KRaft broker (see the module doc) and
 * waits until it can list, create and delete topics. Safe to call from several processes at once:
 * a lock file makes sure only one of them starts a broker.
 *
 * @throws Error with the fix in the message: missing Java/Maven, a Maven failure, or a broker that
 * did not become ready in 90 s (the tail of its log is included).
 */
export async function ensureKafka(log: Log = noop): Promise<KafkaInfo> {
  const fromEnv = parseBrokers(process.env.KAFKA_BROKERS);
  if (fromEnv.length > 0) {
    const ready = await waitUntil(() => kafkaAnswers(fromEnv), KAFKA_ENV_WAIT_MS);
    if (!ready.ok) {
      throw new Error(
        `Kafka at ${fromEnv.join(',')} (KAFKA_BROKERS) did not answer within ${KAFKA_ENV_WAIT_MS / 1000} s: ${ready.error}. ` +
          'Start that broker, or unset KAFKA_BROKERS to let scripts/services.ts start a local one.',
      );
    }
    log(`Kafka answers at ${fromEnv.join(',')} (KAFKA_BROKERS)`);
    return { brokers: fromEnv, startedHere: false };
  }

  const brokers = [LOCAL_BROKER];
  if ((await kafkaAnswers(brokers)).ok) {
    log(`Kafka answers at ${LOCAL_BROKER}${describeOwnBroker()}`);
    warnVersionMismatch(log);
    return { brokers, startedHere: false };
  }

  const release = await acquireLock(log);
  try {
    // Another process may have started it while we waited for the lock.
    if ((await kafkaAnswers(brokers)).ok) {
      log(`Kafka answers at ${LOCAL_BROKER}${describeOwnBroker()}`);
      warnVersionMismatch(log);
      return { brokers, startedHere: false };
    }
    const own = findOwnBrokers().find((b) => b.alive);
    if (own) {
      // Ours, alive, not answering yet: still booting (e.g. its starter died). Don't start a second.
      log(`Kafka ${own.version} (pid ${own.pid}) is running but not answering yet; waiting`);
      await waitForBroker(brokers, own.pid, kafkaHome(own.version), log);
      return { brokers, startedHere: false };
    }
    removeStalePidFiles();

    const version = resolveKafkaVersion();
    await checkJava();
    await resolveKafkaJars(version, log);
    const started = Date.now();
    const logFrom = logSize(kafkaHome(version));
    const pid = await startBroker(version, log);
    await waitForBroker(brokers, pid, kafkaHome(version), log, logFrom);
    log(`Kafka ${version} ready at ${LOCAL_BROKER} (pid ${pid}, ${seconds(Date.now() - started)} after launch)`);
    return { brokers, startedHere: true };
  } finally {
    release();
  }
}

/**
 * Stops the local broker(s) this project started (found through `.services/kafka-*\/kafka.pid`):
 * SIGTERM, then SIGKILL after 30 s. Does nothing for a broker it did not start.
 *
 * @returns whether a running broker was stopped.
 */
export async function stopKafka(log: Log = noop): Promise<boolean> {
  let stopped = false;
  for (const b of findOwnBrokers()) {
    if (!b.alive) {
      fs.rmSync(b.pidFile, { force: true });
      continue;
    }
    log(`Stopping Kafka ${b.version} (pid ${b.pid})`);
    await terminate(b.pid, log);
    fs.rmSync(b.pidFile, { force: true });
    log(`Kafka ${b.version} stopped`);
    stopped = true;
  }
  if (!stopped) log('No Kafka broker started by this project is running');
  return stopped;
}

/** A throwaway broker for fault-injection tests (see {@link startScratchBroker}). */
export interface ScratchBroker {
  brokers: string[];
  pid: number;
  /** Kills the broker (SIGKILL by default, like a crash) and waits for the process to exit. */
  kill(signal?: NodeJS.Signals): Promise<void>;
  /** Starts it again on the same storage and waits until it answers. */
  restart(): Promise<void>;
  /** Stops it for good and deletes its storage. */
  destroy(): Promise<void>;
}

/** Whether a listener can bind 127.0.0.1:`port` now (closed again at once). */
function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(false));
    server.listen({ port, host: '127.0.0.1', exclusive: true }, () => server.close(() => resolve(true)));
  });
}

/**
 * The first block of `count` consecutive ports, from `from` upward in steps of `count`, that all
 * bind on 127.0.0.1 now: tests and harnesses that start brokers on ports of their choice must not
 * pick one another service of the machine holds (RabbitMQ's 25672, MariaDB's 3306, …). Another
 * process may still take a port between this check and the broker's bind; each caller starts its
 * scan at a base of its own so that parallel test files do not meet.
 *
 * @throws Error when no such block is found below port 65,535 or within 500 tries.
 */
export async function freePortBlock(count: number, from: number): Promise<number> {
  for (let base = from, tries = 0; base + count - 1 < 65_535 && tries < 500; base += count, tries++) {
    let free = true;
    for (let p = base; p < base + count && free; p++) free = await portFree(p);
    if (free) return base;
  }
  throw new Error(`No ${count} consecutive free ports on 127.0.0.1 from ${from}`);
}

/**
 * Starts a second, private single-node broker on 127.0.0.1:`port` (controller on `port + 1`) with
 * its own storage under `.services/scratch-<port>`, for tests that kill and restart a broker
 * without touching the shared one. Uses the jars of the configured Kafka version.
 */
export async function startScratchBroker(port: number, log: Log = noop): Promise<ScratchBroker> {
  const version = resolveKafkaVersion();
  await checkJava();
  await resolveKafkaJars(version, log);
  const home = path.join(SERVICES_DIR, `scratch-${port}`);
  fs.rmSync(home, { recursive: true, force: true });
  fs.mkdirSync(home, { recursive: true });
  const listen = `127.0.0.1:${port}`;
  const launchSpec = singleBrokerLaunch(version, home, listen, `127.0.0.1:${port + 1}`);
  const brokers = [listen];
  const launch = async (): Promise<number> => {
    const from = logSize(home);
    const pid = await startBroker(version, log, launchSpec);
    await waitForBroker(brokers, pid, home, log, from);
    return pid;
  };
  let pid = await launch();
  const exited = async (p: number) => {
    const deadline = Date.now() + KAFKA_STOP_MS;
    while (isAlive(p) && Date.now() < deadline) await sleep(50);
  };
  return {
    brokers,
    get pid() {
      return pid;
    },
    async kill(signal: NodeJS.Signals = 'SIGKILL') {
      if (isAlive(pid)) process.kill(pid, signal);
      await exited(pid);
    },
    async restart() {
      pid = await launch();
    },
    async destroy() {
      if (isAlive(pid)) process.kill(pid, 'SIGKILL');
      await exited(pid);
      fs.rmSync(home, { recursive: true, force: true });
    },
  };
}

// ---------------------------------------------------------------------------------------------
// The local 3-node cluster (OUTBOXKIT_KAFKA_NODES=3)
// ---------------------------------------------------------------------------------------------

/** One node of the local cluster (see {@link clusterNodes}). */
export interface ClusterNode {
  /** `node.id` (1–3). */
  id: number;
  /** `host:port` of its client listener (127.0.0.1:9192, :9292, :9392). */
  broker: string;
  /** `host:port` of its KRaft controller listener (127.0.0.1:9193, :9293, :9393). */
  controller: string;
  /** The pid of its JVM while it runs, if this checkout started it; undefined when it is down. */
  pid: number | undefined;
  /** `log.dirs`: its partitions and the KRaft metadata log (`__cluster_metadata-0/`). */
  logDir: string;
  /** Its own log (log4j, INFO): start-up, elections, fencing, shutdown. */
  serverLog: string;
  /** The Kafka version its storage belongs to (the running one, else `OUTBOXKIT_KAFKA_VERSION`'s). */
  version: string;
}

/** A cluster node's pid file, as found under `.services/cluster-<version>/node-<id>/kafka.pid`. */
interface ClusterProcess {
  version: string;
  id: number;
  pid: number;
  pidFile: string;
  /** The pid still runs that node's JVM (command line checked: pids get reused). */
  alive: boolean;
}

/** One partition of a topic as the cluster's metadata describes it (see {@link partitionLeaders}). */
export interface PartitionLeadership {
  partition: number;
  /** The node that leads it; undefined while it has none (-1 in Kafka's metadata). */
  leader: number | undefined;
  /** The nodes that hold a replica, preferred leader first. */
  replicas: number[];
  /** The in-sync replicas. */
  isr: number[];
}

/**
 * Starts the local 3-node cluster, or the nodes of it that are down, and waits until it is ready:
 * all three brokers registered (unfenced), and a topic at replication factor 3 can be created,
 * written with acks=all and deleted. Nodes that run keep running; a node this checkout did not
 * start is used only while all three answer (see `planCluster` in scripts/service-plan.ts).
 * `KAFKA_BROKERS` plays no part here: {@link ensureServices} decides between it and the cluster.
 * Safe to call from several processes at once (a lock file of its own).
 *
 * Nodes start detached, formatted once with one cluster id per version
 * (`.services/cluster-<version>/cluster-id`); ports, settings and heaps: scripts/broker-config.ts.
 *
 * @throws Error with the fix in the message: missing Java/Maven, a Maven failure, a node that
 * exited during start-up or a cluster not ready in 150 s (the nodes started by this call are then
 * stopped; the tails of their logs are included), or brokers of another checkout on the ports.
 */
export async function ensureKafkaCluster(log: Log = noop): Promise<KafkaInfo> {
  const addresses = clusterAddresses();
  const brokers = addresses.map((a) => a.broker);
  const release = await acquireLock(log, CLUSTER_LOCK_FILE);
  try {
    const answers = await Promise.all(addresses.map((a) => kafkaAnswers([a.broker])));
    const running = findClusterProcesses().filter((p) => p.alive);
    const plan = planCluster({
      nodes: addresses.map((a, i) => ({
        id: a.id,
        broker: a.broker,
        answers: answers[i]?.ok === true,
        running: running.find((p) => p.id === a.id)?.version,
      })),
      wanted: resolveKafkaVersion(),
      wantedExplicitly: Boolean(process.env.OUTBOXKIT_KAFKA_VERSION?.trim()),
    });
    if (plan.action === 'error') throw new Error(plan.message);
    if (plan.warning) log(plan.warning);

    if (plan.action === 'use-running') {
      const watch = running.map((p) => watched(p.version, p.id, p.pid));
      await waitForCluster(watch, [], () => clusterUsable(brokers), log);
      log(`Kafka cluster answers at ${brokers.join(',')}${describeOwnCluster()}`);
      return { brokers, startedHere: false };
    }

    const { version } = plan;
    if (plan.start.length > 0) {
      const situation = clusterNotRunning();
      await checkJava(situation);
      await resolveKafkaJars(version, log, situation);
      const idFile = path.join(clusterHome(version), 'cluster-id');
      if (!readText(idFile)?.trim() && running.length === 0) {
        // Storage formatted for a cluster id that is gone could never join a new one: start afresh.
        for (const id of CLUSTER_NODE_IDS)
          fs.rmSync(clusterNodeLaunch(version, id).logDir, { recursive: true, force: true });
      }
      await ensureClusterId(idFile);
      log(`Starting Kafka ${version} cluster node${plan.start.length === 1 ? '' : 's'} ${plan.start.join(', ')}`);
    }
    const launched = Date.now();
    const logFrom = new Map(CLUSTER_NODE_IDS.map((id) => [id, logSize(nodeHome(version, id))]));
    // Formats (first start only) and launches the nodes together: a lone voter cannot elect a leader.
    const results = await Promise.allSettled(
      plan.start.map((id) => startBroker(version, log, clusterNodeLaunch(version, id))),
    );
    const startedPids = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await Promise.all(startedPids.map((pid) => terminate(pid, log)));
      throw failed.reason;
    }
    const watch = [
      ...plan.start.map((id, i) => ({ id, pid: startedPids[i] })),
      ...plan.wait.map((id) => ({ id, pid: running.find((p) => p.id === id)?.pid })),
    ].flatMap(({ id, pid }) => (pid === undefined ? [] : [watched(version, id, pid, logFrom.get(id))]));
    await waitForCluster(watch, startedPids, () => clusterUsable(brokers), log);
    log(
      `Kafka ${version} 3-node cluster ready at ${brokers.join(',')} (${watch.map((n) => `node ${n.id} pid ${n.pid}`).join(', ')}; ` +
        `${seconds(Date.now() - launched)} after launch)`,
    );
    return { brokers, startedHere: plan.start.length > 0 };
  } finally {
    release();
  }
}

/**
 * Stops every node of the local cluster this checkout started (all versions): SIGTERM to all at
 * once (each broker's controlled shutdown needs the quorum of the others), then SIGKILL to any
 * still running 30 s later. Does nothing for nodes it did not start.
 *
 * @returns whether a running node was stopped.
 */
export async function stopKafkaCluster(log: Log = noop): Promise<boolean> {
  const found = findClusterProcesses();
  for (const p of found) if (!p.alive) fs.rmSync(p.pidFile, { force: true });
  const alive = found.filter((p) => p.alive);
  if (alive.length === 0) {
    log('No Kafka cluster node started by this project is running');
    return false;
  }
  const started = Date.now();
  log(`Stopping Kafka cluster nodes ${alive.map((p) => `${p.id} (${p.version}, pid ${p.pid})`).join(', ')}`);
  await Promise.all(
    alive.map(async (p) => {
      // A node frozen by a test (SIGSTOP) would only act on SIGTERM once resumed.
      try {
        process.kill(p.pid, 'SIGCONT');
      } catch {
        // Exited meanwhile: terminate() finds it gone.
      }
      await terminate(p.pid, log);
      fs.rmSync(p.pidFile, { force: true });
    }),
  );
  log(`Kafka cluster stopped in ${seconds(Date.now() - started)}`);
  return true;
}

/**
 * The local cluster's three nodes: addresses, the pid of each node this checkout runs, and where
 * each keeps its data and its log. Reads pid files only (no network).
 */
export function clusterNodes(): ClusterNode[] {
  const running = findClusterProcesses().filter((p) => p.alive);
  const version = running[0]?.version ?? resolveKafkaVersion();
  return clusterAddresses().map((a) => {
    const proc = running.find((p) => p.id === a.id);
    const launch = clusterNodeLaunch(proc?.version ?? version, a.id);
    return {
      ...a,
      pid: proc?.pid,
      logDir: launch.logDir,
      serverLog: path.join(launch.home, 'logs', 'server.log'),
      version: proc?.version ?? version,
    };
  });
}

/**
 * Sends `signal` (SIGKILL by default: a crash, no controlled shutdown) to node `id` and waits
 * until its process has exited (at most 30 s). Its partitions get new leaders once the active
 * controller fences it, `broker.session.timeout.ms` (6 s, scripts/broker-config.ts) after its
 * last heartbeat (about 9 s after the kill when it was the active controller: a successor is
 * elected first); at once when the signal lets it shut down in a controlled way (SIGTERM).
 * SIGSTOP (a frozen node, fenced like a dead one) and SIGCONT return at once: the process stays.
 *
 * @throws Error when the node is unknown, not running (or not started by this checkout), or still
 * running 30 s after the signal.
 */
export async function killClusterNode(id: number, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
  const node = findClusterNode(id);
  const pid = node.pid;
  if (pid === undefined)
    throw new Error(`Kafka cluster node ${id} is not running (or was not started from this checkout)`);
  process.kill(pid, signal);
  if (signal === 'SIGSTOP' || signal === 'SIGCONT') return;
  const exited = await waitUntil(async () => ({ ok: !isAlive(pid) }), KAFKA_STOP_MS, 50);
  if (!exited.ok)
    throw new Error(`Kafka cluster node ${id} (pid ${pid}) still runs ${KAFKA_STOP_MS / 1000} s after ${signal}`);
  fs.rmSync(path.join(nodeHome(node.version, id), 'kafka.pid'), { force: true });
}

/**
 * Starts node `id` again on its storage (stopping it first, SIGTERM then SIGKILL after 30 s, if
 * it runs) and waits until it answers on its own listener and the cluster's metadata lists it as
 * a registered, unfenced broker (without the first, a node killed while the metadata quorum was
 * lost looked registered at once: the survivors still listed its dead incarnation). Its
 * replicas then catch up in the background: wait for the ISR you need (see
 * {@link partitionLeaders}). The other nodes need not all run (two of three keep the quorum).
 *
 * @returns the new pid.
 * @throws Error when the node exits during start-up or is not registered within 150 s (it is
 * then stopped; the tail of its log is in the message).
 */
export async function restartClusterNode(id: number, log: Log = noop): Promise<number> {
  const [pid] = await restartClusterNodes([id], log);
  return pid!;
}

/**
 * {@link restartClusterNode} for several nodes at once: each is stopped if it runs, all are
 * launched together and waited for together (each answers on its own listener and the cluster's
 * metadata lists it) (two nodes killed at once come back in about the time
 * of one: with two of the three voters back, the metadata quorum has a leader again).
 *
 * @returns the new pids, in the order of `ids`.
 * @throws Error when a node exits during start-up or is not registered within 150 s (the nodes
 * started by this call are then stopped; the tails of their logs are in the message).
 */
export async function restartClusterNodes(ids: readonly number[], log: Log = noop): Promise<number[]> {
  const release = await acquireLock(log, CLUSTER_LOCK_FILE);
  try {
    const nodes = ids.map((id) => findClusterNode(id));
    for (const node of nodes) {
      if (node.pid !== undefined) {
        log(`Stopping Kafka cluster node ${node.id} (pid ${node.pid})`);
        await terminate(node.pid, log);
      }
    }
    const started = Date.now();
    const launched = await Promise.all(
      nodes.map(async (node) => {
        const launch = clusterNodeLaunch(node.version, node.id);
        const from = logSize(launch.home);
        const pid = await startBroker(node.version, log, launch);
        return { node, pid, watch: watched(node.version, node.id, pid, from) };
      }),
    );
    const pids = launched.map((l) => l.pid);
    const brokers = runningBrokers();
    await waitForCluster(
      launched.map((l) => l.watch),
      pids,
      async () => {
        for (const node of nodes) {
          // Its own listener first: while the metadata quorum is lost (two nodes down), the
          // survivor still lists the dead incarnation as registered.
          const own = await kafkaAnswers([node.broker]);
          if (!own.ok) return { ok: false, error: `node ${node.id} does not answer yet: ${own.error}` };
          const probe = await brokerRegistered(brokers, node.id);
          if (!probe.ok) return probe;
        }
        return { ok: true };
      },
      log,
    );
    log(
      `Kafka cluster node${ids.length === 1 ? '' : 's'} ${ids.join(', ')} registered again (${launched
        .map((l) => `pid ${l.pid}`)
        .join(', ')}, ${seconds(Date.now() - started)} after launch)`,
    );
    return pids;
  } finally {
    release();
  }
}

/**
 * Leader, replicas and ISR of each partition of `topic`, as the cluster's metadata says (kafkajs
 * admin, Metadata request to a running node). A killed leader is still named until the active
 * controller fences it (`broker.session.timeout.ms`, 6 s).
 *
 * @throws the kafkajs error when no node answers or the topic does not exist.
 */
export async function partitionLeaders(topic: string): Promise<PartitionLeadership[]> {
  const admin = probeClient(runningBrokers(), 3).admin();
  try {
    await admin.connect();
    const { topics } = await admin.fetchTopicMetadata({ topics: [topic] });
    const partitions = topics.find((t) => t.name === topic)?.partitions ?? [];
    return partitions
      .map((p) => ({
        partition: p.partitionId,
        leader: p.leader >= 0 ? p.leader : undefined,
        replicas: [...p.replicas],
        isr: [...p.isr],
      }))
      .sort((a, b) => a.partition - b.partition);
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

/** The node that leads `topic`-`partition` (see {@link partitionLeaders}); undefined when none. */
export async function partitionLeader(topic: string, partition: number): Promise<number | undefined> {
  return (await partitionLeaders(topic)).find((p) => p.partition === partition)?.leader;
}

/**
 * The node that is the active controller (the leader of the KRaft metadata quorum), read from the
 * running nodes' `<log.dirs>/__cluster_metadata-0/quorum-state` files (`quorumLeader` in
 * scripts/broker-config.ts says how; Kafka's Metadata answers cannot tell in KRaft). Undefined
 * during an election, or when no node of this checkout runs.
 */
export function activeController(): number | undefined {
  return quorumLeader(
    clusterNodes().map((n) => ({
      id: n.id,
      running: n.pid !== undefined,
      state: parseQuorumState(readText(path.join(n.logDir, '__cluster_metadata-0', 'quorum-state')) ?? ''),
    })),
  );
}

function findClusterNode(id: number): ClusterNode {
  const node = clusterNodes().find((n) => n.id === id);
  if (!node) throw new Error(`The local Kafka cluster has no node ${id} (its nodes: ${CLUSTER_NODE_IDS.join(', ')})`);
  return node;
}

/** Client addresses of the nodes this checkout runs; all three when it runs none (another's). */
function runningBrokers(): string[] {
  const nodes = clusterNodes();
  const running = nodes.filter((n) => n.pid !== undefined);
  return (running.length > 0 ? running : nodes).map((n) => n.broker);
}

function clusterHome(version: string): string {
  return path.join(SERVICES_DIR, `cluster-${version}`);
}

function nodeHome(version: string, id: number): string {
  return path.join(clusterHome(version), `node-${id}`);
}

/** Node `id` of the cluster: its settings, its storage, the shared cluster id, its heap. */
function clusterNodeLaunch(version: string, id: number): BrokerLaunch {
  const addresses = clusterAddresses();
  const self = addresses.find((a) => a.id === id);
  if (!self) throw new Error(`The local Kafka cluster has no node ${id}`);
  const home = nodeHome(version, id);
  const logDir = path.join(home, 'data');
  return {
    home,
    logDir,
    properties: serverProperties({
      version,
      nodeId: id,
      listen: self.broker,
      controller: self.controller,
      voters: addresses.map((a) => ({ id: a.id, controller: a.controller })),
      logDir,
    }),
    clusterIdFile: path.join(clusterHome(version), 'cluster-id'),
    heapMb: CLUSTER_HEAP_MB,
  };
}

/** Pid files of cluster nodes, every version; `alive` only if the pid is still that node. */
function findClusterProcesses(): ClusterProcess[] {
  let entries: string[];
  try {
    entries = fs.readdirSync(SERVICES_DIR);
  } catch {
    return [];
  }
  const found: ClusterProcess[] = [];
  for (const name of entries) {
    const version = /^cluster-(.+)$/.exec(name)?.[1];
    if (!version) continue;
    for (const id of CLUSTER_NODE_IDS) {
      const home = nodeHome(version, id);
      const pidFile = path.join(home, 'kafka.pid');
      const pid = Number(readText(pidFile)?.trim());
      if (!Number.isInteger(pid) || pid <= 0) continue;
      found.push({ version, id, pid, pidFile, alive: isAlive(pid) && isOurBroker(pid, home) });
    }
  }
  return found;
}

function describeOwnCluster(): string {
  const running = findClusterProcesses().filter((p) => p.alive);
  if (running.length === 0) return '';
  return ` (Kafka ${running[0]?.version}, ${running.map((p) => `node ${p.id} pid ${p.pid}`).join(', ')}, started by this project)`;
}

/** How an error about a missing toolchain starts for the cluster. */
function clusterNotRunning(): string {
  return `The Kafka cluster is not running at ${clusterAddresses()
    .map((a) => a.broker)
    .join(',')}`;
}

/** Every node of the cluster answers on its own (an admin client lists topics through it). */
async function clusterAnswers(): Promise<Probe> {
  const probes = await Promise.all(clusterAddresses().map(async (a) => ({ a, p: await kafkaAnswers([a.broker]) })));
  const down = probes.filter(({ p }) => !p.ok);
  if (down.length === 0) return { ok: true };
  return { ok: false, error: down.map(({ a, p }) => `${a.broker}: ${p.error}`).join('; ') };
}

/**
 * Ready for tests: all three brokers registered (the cluster's metadata lists only unfenced
 * brokers), and a topic at replication factor 3 can be created, written with acks=all (which
 * needs `min.insync.replicas`, 2, in sync) and deleted.
 */
async function clusterUsable(brokers: string[]): Promise<Probe> {
  const kafka = probeClient(brokers, 2);
  const admin = kafka.admin();
  const producer = kafka.producer({
    allowAutoTopicCreation: false,
    createPartitioner: Partitioners.DefaultPartitioner,
    retry: { retries: 3, initialRetryTime: 200 },
  });
  const topic = `outboxkit-probe-${randomBytes(4).toString('hex')}`;
  let created = false;
  try {
    await admin.connect();
    const registered = (await admin.describeCluster()).brokers.map((b) => b.nodeId).sort((a, b) => a - b);
    const missing = CLUSTER_NODE_IDS.filter((id) => !registered.includes(id));
    if (missing.length > 0) {
      return {
        ok: false,
        error: `brokers registered: ${registered.join(', ') || 'none'}; not yet: ${missing.join(', ')}`,
      };
    }
    created = await admin.createTopics({
      topics: [{ topic, numPartitions: 1, replicationFactor: CLUSTER_NODE_IDS.length }],
      waitForLeaders: true,
      timeout: 10_000,
    });
    if (!created) return { ok: false, error: `probe topic ${topic} already existed` };
    await producer.connect();
    await producer.send({ topic, acks: -1, timeout: 10_000, messages: [{ value: 'probe' }] });
    await admin.deleteTopics({ topics: [topic], timeout: 10_000 });
    created = false;
    return { ok: true };
  } catch (err) {
    return { ok: false, error: errorText(err) };
  } finally {
    await producer.disconnect().catch(() => {});
    if (created) await admin.deleteTopics({ topics: [topic], timeout: 10_000 }).catch(() => {});
    await admin.disconnect().catch(() => {});
  }
}

/** Node `id` is in the cluster's metadata: registered with the active controller and unfenced. */
async function brokerRegistered(brokers: string[], id: number): Promise<Probe> {
  const admin = probeClient(brokers, 2).admin();
  try {
    await admin.connect();
    const registered = (await admin.describeCluster()).brokers.map((b) => b.nodeId);
    if (registered.includes(id)) return { ok: true };
    return {
      ok: false,
      error: `brokers registered: ${registered.sort((a, b) => a - b).join(', ') || 'none'}; not yet: ${id}`,
    };
  } catch (err) {
    return { ok: false, error: errorText(err) };
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

/** A node process that {@link waitForCluster} watches: it must not exit while the cluster starts. */
interface WatchedNode {
  id: number;
  pid: number;
  home: string;
  /** Offset of its server.log when it was launched (failure reports show only this start). */
  logFrom: number;
}

function watched(version: string, id: number, pid: number, logFrom?: number): WatchedNode {
  const home = nodeHome(version, id);
  return { id, pid, home, logFrom: logFrom ?? logSize(home) };
}

/**
 * Polls `ready` every 0.5 s for up to 150 s, and fails at once when a watched node exits. On
 * either failure the nodes in `startedHere` are stopped (half a cluster helps nobody) and the
 * error carries the tails of the watched nodes' logs.
 */
async function waitForCluster(
  watch: readonly WatchedNode[],
  startedHere: readonly number[],
  ready: () => Promise<Probe>,
  log: Log,
): Promise<void> {
  const stopStarted = async () => {
    await Promise.all(startedHere.filter(isAlive).map((pid) => terminate(pid, log)));
    for (const n of watch) if (startedHere.includes(n.pid)) fs.rmSync(path.join(n.home, 'kafka.pid'), { force: true });
  };
  const deadline = Date.now() + KAFKA_CLUSTER_READY_MS;
  let nextReport = Date.now() + 15_000;
  let last: Probe = { ok: false, error: 'not probed yet' };
  while (Date.now() < deadline) {
    const dead = watch.find((n) => !isAlive(n.pid));
    if (dead) {
      const tail = logTail(dead.home, dead.logFrom);
      fs.rmSync(path.join(dead.home, 'kafka.pid'), { force: true });
      await stopStarted();
      throw new Error(`Kafka cluster node ${dead.id} (pid ${dead.pid}) exited during start-up.\n${tail}`);
    }
    last = await ready();
    if (last.ok) return;
    if (Date.now() >= nextReport) {
      log(`Kafka cluster not ready yet: ${last.error}`);
      nextReport += 15_000;
    }
    await sleep(500);
  }
  const tails = watch.map((n) => `=== node ${n.id} ===\n${logTail(n.home, n.logFrom)}`).join('\n');
  log(
    `Kafka cluster did not become ready within ${KAFKA_CLUSTER_READY_MS / 1000} s (last error: ${last.error}); stopping the nodes started here`,
  );
  await stopStarted();
  throw new Error(
    `Kafka cluster did not become ready within ${KAFKA_CLUSTER_READY_MS / 1000} s (last error: ${last.error}).\n${tails}`,
  );
}

/** Resident memory of a process in MiB, from /proc (undefined elsewhere). */
function residentMb(pid: number): number | undefined {
  const kb = /^VmRSS:\s+(\d+) kB/m.exec(readText(`/proc/${pid}/status`) ?? '')?.[1];
  return kb === undefined ? undefined : Math.round(Number(kb) / 1024);
}

export interface Services {
  databaseUrl: string;
  kafkaBrokers: string[];
  /**
   * A server at `wal_level=logical` for the WAL source's tests ({@link ensureWalPostgres}):
   * `WAL_DATABASE_URL`, else this project's cluster on 127.0.0.1:5433. Set even when it could not
   * be started (then {@link walDatabaseError} says why): only the WAL tests need it, and they fail
   * with that reason rather than every other test.
   */
  walDatabaseUrl: string;
  /** Why {@link walDatabaseUrl} does not answer at `wal_level=logical`; undefined when it does. */
  walDatabaseError?: string;
  /**
   * Stops the containers this call started through testcontainers (none on the local paths);
   * idempotent. The local Kafka broker is never stopped here: it outlives the process on purpose.
   */
  stop(): Promise<void>;
}

export interface EnsureServicesOptions {
  /**
   * Whether containers that live only as long as this process are acceptable (testcontainers,
   * see scripts/service-plan.ts): true for the tests, the demo and the benchmarks; false for the
   * `up` command, which points at `docker compose up -d --wait` instead.
   * @defaultValue true
   */
  ephemeralOk?: boolean;
}

/**
 * {@link ensurePostgres} and {@link ensureKafka} together, or testcontainers when neither the
 * environment, nor a local service, nor a local toolchain can provide one and a Docker engine
 * answers. The decision is {@link planServices} (scripts/service-plan.ts); this function gathers
 * its facts and carries it out.
 *
 * @throws Error listing, per missing service, what was tried and how to fix it.
 */
export async function ensureServices(log: Log = noop, options: EnsureServicesOptions = {}): Promise<Services> {
  const plan = planServices(await gatherFacts(options.ephemeralOk ?? true));

  const containersWanted = {
    postgres: plan.postgres.action === 'start-testcontainer',
    kafka: plan.kafka.action === 'start-testcontainer',
  };
  const errors = [plan.postgres, plan.kafka].flatMap((p) => (p.action === 'error' ? [p.message] : []));
  if (errors.length > 0) throw new Error(errors.join('\n'));

  const containers =
    containersWanted.postgres || containersWanted.kafka
      ? startContainers({ ...containersWanted, kafkaLine: kafkaLine(resolveKafkaVersion()) }, log)
      : undefined;
  // allSettled: a PostgreSQL failure must not leave a Kafka start running unreported.
  const [pgResult, kafkaResult, containerResult, walResult] = await Promise.allSettled([
    containersWanted.postgres ? undefined : ensurePostgres(log),
    containersWanted.kafka
      ? undefined
      : plan.kafka.action !== 'use-env' && resolveKafkaNodes() === 3
        ? ensureKafkaCluster(log)
        : ensureKafka(log),
    containers,
    ensureWalPostgres(log),
  ]);
  const walDatabaseUrl = process.env.WAL_DATABASE_URL?.trim() || DEFAULT_WAL_DATABASE_URL;
  const wal =
    walResult.status === 'fulfilled'
      ? { walDatabaseUrl }
      : { walDatabaseUrl, walDatabaseError: errorText(walResult.reason) };
  if (wal.walDatabaseError !== undefined) log(`WARNING: ${wal.walDatabaseError}`);
  const stop = async () => {
    if (containerResult.status === 'fulfilled') await containerResult.value?.stop();
  };
  if (pgResult.status === 'fulfilled' && kafkaResult.status === 'fulfilled' && containerResult.status === 'fulfilled') {
    const databaseUrl = pgResult.value ?? containerResult.value?.databaseUrl;
    const kafkaBrokers = kafkaResult.value?.brokers ?? containerResult.value?.kafkaBrokers;
    if (databaseUrl !== undefined && kafkaBrokers !== undefined) return { databaseUrl, kafkaBrokers, ...wal, stop };
  }
  await stop();
  const failures = [pgResult, kafkaResult, containerResult].flatMap((r) =>
    r.status === 'rejected' ? [errorText(r.reason)] : [],
  );
  throw new Error(failures.join('\n') || 'ensureServices: a planned service produced no address (bug)');
}

/**
 * The facts {@link planServices} needs, probing only what matters: the local servers when no
 * environment variable names one, Java/Maven when no broker answers, Docker when nothing else is
 * left (it loads testcontainers).
 */
async function gatherFacts(ephemeralOk: boolean): Promise<ServiceFacts> {
  const databaseUrl = process.env.DATABASE_URL?.trim() || undefined;
  const kafkaBrokers = parseBrokers(process.env.KAFKA_BROKERS);
  const nodes = resolveKafkaNodes();
  const [pgLocal, kafkaLocal] = await Promise.all([
    databaseUrl === undefined ? probePostgres(DEFAULT_DATABASE_URL) : undefined,
    kafkaBrokers.length === 0 ? (nodes === 3 ? clusterAnswers() : kafkaAnswers([LOCAL_BROKER])) : undefined,
  ]);
  const facts: Omit<ServiceFacts, 'docker'> = {
    databaseUrl,
    kafkaBrokers,
    postgres: {
      // Not probed when DATABASE_URL is set: the plan uses it whatever the local server does.
      local: pgLocal === undefined || pgLocal.ok ? 'answers' : pgLocal.unreachable ? 'down' : 'refused',
      clusterInstalled: localClusterInstalled(),
    },
    kafka: {
      nodes,
      localAnswers: kafkaLocal?.ok ?? true,
      maven: kafkaLocal === undefined || kafkaLocal.ok ? undefined : await mavenBrokerPossible(nodes),
    },
    ci: isCi(process.env.CI),
    ephemeralOk,
  };
  return { ...facts, docker: needsDockerProbe(facts) ? await probeDocker() : undefined };
}

function localClusterInstalled(): boolean {
  const etc = '/etc/postgresql';
  try {
    return fs.readdirSync(etc).some((v) => fs.existsSync(path.join(etc, v, 'main')));
  } catch {
    return false;
  }
}

/** Java 17+ runs, and Maven runs or the jars of the configured version are already resolved. */
async function mavenBrokerPossible(nodes: 1 | 3): Promise<{ ok: boolean; reason?: string }> {
  try {
    const version = resolveKafkaVersion();
    // A broker of ours that is still booting needs no toolchain check: ensureKafka waits for it.
    if (nodes === 1 && findOwnBrokers().some((b) => b.alive)) return { ok: true };
    await checkJava(nodes === 3 ? clusterNotRunning() : undefined);
    if (readText(path.join(kafkaHome(version), 'lib', '.complete')) === kafkaJarsStamp(version)) return { ok: true };
    await checkMaven(nodes === 3 ? clusterNotRunning() : undefined);
    return { ok: true };
  } catch (err) {
    // checkJava/checkMaven phrase a whole error; the plan's message only needs what failed.
    const reason = errorText(err)
      .replace(/^(?:The )?Kafka (?:cluster )?is not running at \S+ and cannot be started: /, '')
      .replace(TOOLCHAIN_HINT, '')
      .trim();
    return { ok: false, reason };
  }
}

function parseBrokers(value: string | undefined): string[] {
  return (value ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

/**
 * Maps `OUTBOXKIT_KAFKA_VERSION` to an exact version: unset, `3` or `3.9` give the pinned 3.9.x,
 * `4` (or the pinned 4.x's `major.minor`) gives the pinned 4.x; an exact `3.9.z` / `4.y.z` is used
 * as given (not pinned, so not tested here).
 */
export function resolveKafkaVersion(value = process.env.OUTBOXKIT_KAFKA_VERSION): string {
  const v = (value ?? '').trim();
  if (v === '') return KAFKA_LINES[3];
  for (const [line, pinned] of Object.entries(KAFKA_LINES)) {
    if (v === line || v === pinned || v === pinned.split('.').slice(0, 2).join('.')) return pinned;
  }
  if (/^(3\.9|4\.\d+)\.\d+$/.test(v)) return v;
  throw new Error(
    `OUTBOXKIT_KAFKA_VERSION=${v} is not supported; use 3 (${KAFKA_LINES[3]}, the default), 4 (${KAFKA_LINES[4]}), or an exact 3.9.x / 4.x.y.`,
  );
}

function kafkaHome(version: string): string {
  return path.join(SERVICES_DIR, `kafka-${version}`);
}

// --- probing -----------------------------------------------------------------------------------

interface Probe {
  ok: boolean;
  error?: string;
}

/** `retries`: kafkajs retries per request (0 for a probe; a few where a seed broker may be down). */
function probeClient(brokers: string[], retries = 0) {
  // A partition without a leader (a node of the cluster is down) must not make every node look down.
  applyKafkajsMetadataFix();
  return new Kafka({
    clientId: 'outboxkit-services',
    brokers,
    logLevel: logLevel.NOTHING,
    connectionTimeout: 2_000,
    requestTimeout: 10_000,
    retry: { retries, initialRetryTime: 200 },
  });
}

/** A broker answers when an admin client can list topics. */
async function kafkaAnswers(brokers: string[]): Promise<Probe> {
  const admin = probeClient(brokers).admin();
  try {
    await admin.connect();
    await admin.listTopics();
    return { ok: true };
  } catch (err) {
    return { ok: false, error: errorText(err) };
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

/**
 * Ready for tests: topics can be listed, created (with a leader) and deleted. Listing alone can
 * succeed while the controller is still catching up.
 */
async function kafkaUsable(brokers: string[]): Promise<Probe> {
  const admin = probeClient(brokers).admin();
  const topic = `outboxkit-probe-${randomBytes(4).toString('hex')}`;
  try {
    await admin.connect();
    await admin.listTopics();
    const created = await admin.createTopics({
      topics: [{ topic, numPartitions: 1, replicationFactor: 1 }],
      waitForLeaders: true,
      timeout: 10_000,
    });
    if (!created) return { ok: false, error: `probe topic ${topic} already existed` };
    await admin.deleteTopics({ topics: [topic], timeout: 10_000 });
    return { ok: true };
  } catch (err) {
    return { ok: false, error: errorText(err) };
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

async function waitForBroker(brokers: string[], pid: number, home: string, log: Log, logFrom = 0): Promise<void> {
  const deadline = Date.now() + KAFKA_READY_MS;
  let last: Probe = { ok: false, error: 'not probed yet' };
  while (Date.now() < deadline) {
    if (!isAlive(pid)) {
      fs.rmSync(path.join(home, 'kafka.pid'), { force: true });
      throw new Error(`Kafka (pid ${pid}) exited during startup.\n${logTail(home, logFrom)}`);
    }
    last = await kafkaUsable(brokers);
    if (last.ok) return;
    await sleep(500);
  }
  log(`Kafka did not become ready within ${KAFKA_READY_MS / 1000} s (last error: ${last.error}); stopping it`);
  const tail = logTail(home, logFrom);
  await terminate(pid, log);
  fs.rmSync(path.join(home, 'kafka.pid'), { force: true });
  throw new Error(`Kafka did not become ready within ${KAFKA_READY_MS / 1000} s (last error: ${last.error}).\n${tail}`);
}

/** Byte offset of the broker's log, so a failure report shows only this start's lines. */
function logSize(home: string): number {
  try {
    return fs.statSync(path.join(home, 'logs', 'server.log')).size;
  } catch {
    return 0;
  }
}

/**
 * What went wrong, for an error message: the ERROR/FATAL and `Caused by` lines logged since
 * `fromByte` (the cause is usually buried mid-stack-trace), then the last lines without stack frames.
 */
function logTail(home: string, fromByte = 0): string {
  const parts: string[] = [];
  const serverLog = path.join(home, 'logs', 'server.log');
  const text = readFrom(serverLog, fromByte);
  if (text.trim()) {
    const lines = text.trimEnd().split('\n');
    const errors = [...new Set(lines.filter((l) => /^\[[^\]]+\] (ERROR|FATAL) |^Caused by: /.test(l)))].slice(-8);
    if (errors.length > 0) parts.push(`--- errors in ${path.relative(ROOT, serverLog)} ---\n${errors.join('\n')}`);
    const tail = lines.filter((l) => !/^\s+(at |\.\.\. \d+ more)/.test(l)).slice(-20);
    parts.push(`--- last lines of ${path.relative(ROOT, serverLog)} ---\n${tail.join('\n')}`);
  }
  const out = path.join(home, 'kafka.out');
  const outText = readFrom(out, 0);
  if (outText.trim()) parts.push(`--- last lines of ${path.relative(ROOT, out)} ---\n${lastLines(outText, 20)}`);
  return parts.join('\n') || `(no log written under ${path.relative(ROOT, home)})`;
}

function readFrom(file: string, fromByte: number): string {
  try {
    const buf = fs.readFileSync(file);
    return buf.subarray(fromByte <= buf.length ? fromByte : 0).toString('utf8');
  } catch {
    return '';
  }
}

// --- toolchain and jars ------------------------------------------------------------------------

function javaBin(): string {
  const home = process.env.JAVA_HOME;
  if (home && fs.existsSync(path.join(home, 'bin', 'java'))) return path.join(home, 'bin', 'java');
  return 'java';
}

/** `situation`: how an error message starts, e.g. "Kafka is not running at 127.0.0.1:9092". */
async function checkJava(situation = `Kafka is not running at ${LOCAL_BROKER}`): Promise<void> {
  const java = await run(javaBin(), ['-version'], { timeoutMs: 30_000 });
  if (java.code !== 0) {
    throw new Error(
      `${situation} and cannot be started: \`java -version\` failed (${java.error ?? lastLines(java.stderr, 3)}). ${TOOLCHAIN_HINT}`,
    );
  }
  // `openjdk version "17.0.15" ...` or, before Java 9, `java version "1.8.0_412"`.
  const m = /version "(\d+)(?:\.(\d+))?/.exec(java.stderr);
  const major = m ? (m[1] === '1' ? Number(m[2]) : Number(m[1])) : NaN;
  if (!(major >= JAVA_MIN_MAJOR)) {
    throw new Error(
      `${situation} and cannot be started: Java ${JAVA_MIN_MAJOR}+ is needed, found ${Number.isNaN(major) ? 'an unknown version' : `Java ${major}`} (${javaBin()}). ${TOOLCHAIN_HINT}`,
    );
  }
}

async function checkMaven(situation = `Kafka is not running at ${LOCAL_BROKER}`): Promise<void> {
  const mvn = await run('mvn', ['-v'], { timeoutMs: 60_000 });
  if (mvn.code !== 0) {
    throw new Error(
      `${situation} and cannot be started: \`mvn -v\` failed (${mvn.error ?? lastLines(mvn.stderr || mvn.stdout, 3)}). ${TOOLCHAIN_HINT}`,
    );
  }
}

/** What `.services/kafka-<version>/lib/.complete` holds once the jars of this pom are resolved. */
function kafkaJarsStamp(version: string): string {
  return JSON.stringify({
    version,
    pom: createHash('sha256').update(fs.readFileSync(POM)).digest('hex'),
  });
}

/**
 * Copies the broker's runtime jars into `.services/kafka-<version>/lib` with Maven. A marker file
 * written after success (holding the pom's hash) makes later calls skip Maven entirely. Exported
 * for test brokers of their own (test/relay/secure-broker.ts).
 *
 * @param situation - how a missing-Maven error starts (default: "Kafka is not running at 127.0.0.1:9092").
 * @throws when Maven is missing or cannot resolve the version.
 */
export async function resolveKafkaJars(version: string, log: Log = noop, situation?: string): Promise<void> {
  const lib = path.join(kafkaHome(version), 'lib');
  const marker = path.join(lib, '.complete');
  const stamp = kafkaJarsStamp(version);
  if (readText(marker) === stamp) return;
  await checkMaven(situation);

  log(`Resolving Apache Kafka ${version} from Maven Central into ${path.relative(ROOT, lib)} (first run only)`);
  const started = Date.now();
  fs.rmSync(lib, { recursive: true, force: true });
  const res = await run(
    'mvn',
    [
      '-q',
      '-B',
      '-Dstyle.color=never',
      '-f',
      POM,
      `-Dkafka.line=${kafkaLine(version)}`,
      `-Dkafka.version=${version}`,
      `-Dservices.dir=${SERVICES_DIR}`,
      'package',
    ],
    { timeoutMs: 600_000 },
  );
  if (res.code !== 0) {
    throw new Error(
      `Maven could not resolve Apache Kafka ${version} (exit ${res.code ?? res.error}):\n${lastLines(res.stdout + res.stderr, 30)}\n` +
        `Check access to Maven Central, or run: mvn -B -f ${path.relative(process.cwd(), POM)} -Dkafka.line=${kafkaLine(version)} -Dkafka.version=${version} package`,
    );
  }
  if (!fs.existsSync(path.join(lib, `kafka_2.13-${version}.jar`))) {
    throw new Error(`Maven finished but ${path.relative(ROOT, lib)} has no kafka_2.13-${version}.jar`);
  }
  fs.writeFileSync(marker, stamp);
  log(`Resolved Kafka ${version} in ${seconds(Date.now() - started)}`);
}

// --- broker ------------------------------------------------------------------------------------

function jvmLoggingArgs(version: string, home: string): string[] {
  const args = [`-Dkafka.logs.dir=${path.join(home, 'logs')}`];
  if (kafkaLine(version) === 4) {
    args.push(`-Dlog4j2.configurationFile=${path.join(KAFKA_SCRIPTS_DIR, 'log4j2.xml')}`);
  } else {
    args.push(`-Dlog4j.configuration=${pathToFileURL(path.join(KAFKA_SCRIPTS_DIR, 'log4j.properties')).href}`);
  }
  return args;
}

/** What {@link startBroker} starts: one broker process and where it keeps its files. */
interface BrokerLaunch {
  /** The process's folder: `server.properties`, `kafka.pid`, `kafka.out`, `logs/`. */
  home: string;
  /** `log.dirs` (formatted once; `meta.properties` there says it is). */
  logDir: string;
  /** The text of `server.properties`, rewritten on every start. */
  properties: string;
  /** Keeps the KRaft cluster id across runs; the nodes of one cluster share it. */
  clusterIdFile: string;
  /** `-Xms` = `-Xmx`, in MiB. */
  heapMb: number;
}

/** The single broker (or a scratch broker at another address): one node, its own cluster id. */
function singleBrokerLaunch(
  version: string,
  home = kafkaHome(version),
  listen = LOCAL_BROKER,
  controller = CONTROLLER_ADDRESS,
): BrokerLaunch {
  const logDir = path.join(home, 'data');
  return {
    home,
    logDir,
    properties: serverProperties({ version, nodeId: 1, listen, controller, voters: [{ id: 1, controller }], logDir }),
    clusterIdFile: path.join(home, 'cluster-id'),
    heapMb: SINGLE_BROKER_HEAP_MB,
  };
}

/**
 * The cluster id in `file`, created when the file is missing or empty. A new id is what
 * `kafka-storage random-uuid` prints (Kafka's `Uuid.randomUuid()`: a random version-4 UUID as
 * URL-safe base64 without padding, 22 characters, drawn again when it starts with '-'), made here
 * rather than by a JVM of its own: that took 1-3 s before each new broker's format, and every
 * scratch broker (startScratchBroker) is a new one.
 */
async function ensureClusterId(file: string): Promise<string> {
  const existing = readText(file)?.trim();
  if (existing) return existing;
  let clusterId: string;
  do clusterId = Buffer.from(randomUUID().replaceAll('-', ''), 'hex').toString('base64url');
  while (clusterId.startsWith('-'));
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, `${clusterId}\n`);
  return clusterId;
}

/** Formats KRaft storage once (cluster id kept across runs), then launches the broker detached. */
async function startBroker(
  version: string,
  log: Log,
  launch: BrokerLaunch = singleBrokerLaunch(version),
): Promise<number> {
  const home = launch.home;
  const props = path.join(home, 'server.properties');
  const classpath = path.join(kafkaHome(version), 'lib', '*');
  fs.mkdirSync(path.join(home, 'logs'), { recursive: true });
  fs.writeFileSync(props, launch.properties);
  const logging = jvmLoggingArgs(version, home);

  if (!fs.existsSync(path.join(launch.logDir, 'meta.properties'))) {
    const clusterId = await ensureClusterId(launch.clusterIdFile);
    log(`Formatting KRaft storage of ${path.relative(ROOT, home)} (cluster id ${clusterId})`);
    // Static voters (controller.quorum.voters): no --standalone, which 4.x rejects in that case.
    const res = await run(
      javaBin(),
      [...logging, '-cp', classpath, 'kafka.tools.StorageTool', 'format', '-t', clusterId, '-c', props],
      {
        timeoutMs: 60_000,
      },
    );
    if (res.code !== 0) {
      throw new Error(
        `kafka.tools.StorageTool format failed (exit ${res.code}): ${lastLines(res.stdout + res.stderr, 10)}`,
      );
    }
  }

  const out = fs.openSync(path.join(home, 'kafka.out'), 'a');
  let pid: number | undefined;
  try {
    const child = spawn(
      javaBin(),
      [
        `-Xms${launch.heapMb}m`,
        `-Xmx${launch.heapMb}m`,
        '-XX:+UseG1GC',
        '-XX:MaxGCPauseMillis=20',
        '-XX:InitiatingHeapOccupancyPercent=35',
        '-XX:+ExplicitGCInvokesConcurrent',
        '-XX:ActiveProcessorCount=2',
        '-XX:+ExitOnOutOfMemoryError',
        '-Djava.awt.headless=true',
        // Lets stopKafka recognise the process behind a pid file (pids get reused).
        `-Doutboxkit.kafka.home=${home}`,
        ...logging,
        '-cp',
        classpath,
        'kafka.Kafka',
        props,
      ],
      { cwd: home, detached: true, stdio: ['ignore', out, out] },
    );
    child.unref();
    pid = child.pid;
  } finally {
    fs.closeSync(out);
  }
  if (pid === undefined) throw new Error(`Could not launch ${javaBin()} for Kafka ${version}`);
  fs.writeFileSync(path.join(home, 'kafka.pid'), `${pid}\n`);
  log(`Started Kafka ${version} (pid ${pid}); log: ${path.relative(ROOT, path.join(home, 'logs', 'server.log'))}`);
  return pid;
}

interface OwnBroker {
  version: string;
  pid: number;
  pidFile: string;
  alive: boolean;
}

/** Brokers recorded in `.services/kafka-*\/kafka.pid`; `alive` only if the pid is still that broker. */
function findOwnBrokers(): OwnBroker[] {
  let entries: string[];
  try {
    entries = fs.readdirSync(SERVICES_DIR);
  } catch {
    return [];
  }
  const found: OwnBroker[] = [];
  for (const name of entries) {
    const m = /^kafka-(.+)$/.exec(name);
    if (!m?.[1]) continue;
    const pidFile = path.join(SERVICES_DIR, name, 'kafka.pid');
    const pid = Number(readText(pidFile)?.trim());
    if (!Number.isInteger(pid) || pid <= 0) continue;
    found.push({
      version: m[1],
      pid,
      pidFile,
      alive: isAlive(pid) && isOurBroker(pid, path.join(SERVICES_DIR, name)),
    });
  }
  return found;
}

function removeStalePidFiles(): void {
  for (const b of findOwnBrokers()) if (!b.alive) fs.rmSync(b.pidFile, { force: true });
}

function describeOwnBroker(): string {
  const own = findOwnBrokers().find((b) => b.alive);
  return own ? ` (Kafka ${own.version}, pid ${own.pid}, started by this project)` : '';
}

/**
 * Whatever answers on 127.0.0.1:9092 is used as is; when OUTBOXKIT_KAFKA_VERSION explicitly asks
 * for another version than the broker this project has running, say so (a test run against "4.x"
 * that silently used 3.9 would prove nothing).
 */
function warnVersionMismatch(log: Log): void {
  if (!process.env.OUTBOXKIT_KAFKA_VERSION?.trim()) return;
  const wanted = resolveKafkaVersion();
  const own = findOwnBrokers().find((b) => b.alive);
  if (own && own.version !== wanted) {
    log(
      `WARNING: OUTBOXKIT_KAFKA_VERSION asks for Kafka ${wanted}, but Kafka ${own.version} is running at ${LOCAL_BROKER}; ` +
        'using it. Run `npm run services:down` first to switch versions.',
    );
  }
}

function isOurBroker(pid: number, home: string): boolean {
  try {
    const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    return cmdline.includes('kafka.Kafka') && cmdline.includes(`-Doutboxkit.kafka.home=${home}`);
  } catch {
    // No /proc (macOS): trust the pid file.
    return process.platform !== 'linux';
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  // A zombie (exited, not yet reaped by its parent) still answers kill(0).
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch {
    return true;
  }
}

async function terminate(pid: number, log: Log): Promise<void> {
  try {
    process.kill(pid, 'SIGTERM');
  } catch {
    return;
  }
  const exited = await waitUntil(async () => ({ ok: !isAlive(pid) }), KAFKA_STOP_MS, 200);
  if (!exited.ok) {
    log(`Kafka (pid ${pid}) still running ${KAFKA_STOP_MS / 1000} s after SIGTERM; sending SIGKILL`);
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      return;
    }
    await waitUntil(async () => ({ ok: !isAlive(pid) }), 5_000, 100);
  }
}

// --- lock --------------------------------------------------------------------------------------

/**
 * An exclusive lock file (O_EXCL) so that concurrent callers (vitest workers, the demo and the
 * tests) never start two brokers. A lock whose owner pid is gone, or older than 10 min, is stale.
 */
async function acquireLock(log: Log, file = LOCK_FILE, what = 'Kafka'): Promise<() => void> {
  fs.mkdirSync(SERVICES_DIR, { recursive: true });
  const deadline = Date.now() + LOCK_WAIT_MS;
  let announced = false;
  for (;;) {
    try {
      const fd = fs.openSync(file, 'wx');
      fs.writeSync(fd, JSON.stringify({ pid: process.pid, at: new Date().toISOString() }));
      fs.closeSync(fd);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        fs.rmSync(file, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    if (isStaleLock(file)) {
      fs.rmSync(file, { force: true });
      continue;
    }
    if (Date.now() > deadline) {
      throw new Error(
        `Timed out after ${LOCK_WAIT_MS / 1000} s waiting for ${path.relative(ROOT, file)} (another process is starting ${what}); delete it if no such process exists.`,
      );
    }
    if (!announced) {
      log(`${what} is being started by another process (or caller); waiting for it`);
      announced = true;
    }
    await sleep(250);
  }
}

function isStaleLock(file: string): boolean {
  try {
    const stat = fs.statSync(file);
    if (Date.now() - stat.mtimeMs > LOCK_STALE_MS) return true;
    const owner = JSON.parse(fs.readFileSync(file, 'utf8')) as { pid?: unknown };
    return typeof owner.pid === 'number' && !isAlive(owner.pid);
  } catch (err) {
    // Gone already (ENOENT) → retry; half-written by its owner (bad JSON) → not stale yet.
    return (err as NodeJS.ErrnoException).code === 'ENOENT';
  }
}

// --- helpers -----------------------------------------------------------------------------------

export interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
  /** Set when the program could not be run at all (e.g. ENOENT: not installed). */
  error?: string;
}

function run(cmd: string, args: string[], opts: { timeoutMs: number }): Promise<RunResult> {
  return new Promise((resolve) => {
    execFile(cmd, args, { timeout: opts.timeoutMs, maxBuffer: 16 * 1024 * 1024, cwd: ROOT }, (err, stdout, stderr) => {
      if (!err) return resolve({ code: 0, stdout, stderr });
      const e = err as NodeJS.ErrnoException & { code?: number | string; killed?: boolean };
      if (typeof e.code === 'string') {
        return resolve({
          code: null,
          stdout,
          stderr,
          error: e.code === 'ENOENT' ? `${cmd}: command not found` : `${cmd}: ${e.message}`,
        });
      }
      resolve({
        code: typeof e.code === 'number' ? e.code : null,
        stdout,
        stderr,
        ...(e.killed ? { error: `${cmd} timed out after ${opts.timeoutMs / 1000} s` } : {}),
      });
    });
  });
}

async function waitUntil(check: () => Promise<Probe>, timeoutMs: number, intervalMs = 500): Promise<Probe> {
  const deadline = Date.now() + timeoutMs;
  let last = await check();
  while (!last.ok && Date.now() < deadline) {
    await sleep(intervalMs);
    last = await check();
  }
  return last;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function readText(file: string): string | undefined {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
}

function lastLines(text: string, n: number): string {
  return text.trimEnd().split('\n').slice(-n).join('\n');
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)} s`;
}

// ---------------------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------------------

async function status(): Promise<boolean> {
  const databaseUrl = process.env.DATABASE_URL?.trim() || DEFAULT_DATABASE_URL;
  const pgProbe = await probePostgres(databaseUrl);
  console.log(
    `postgres  ${pgProbe.ok ? 'up  ' : 'down'}  ${redactUrl(databaseUrl)}${pgProbe.ok ? '' : `  (${pgProbe.error})`}`,
  );

  const fromEnv = parseBrokers(process.env.KAFKA_BROKERS);
  const cluster = resolveKafkaNodes() === 3;
  const brokers = fromEnv.length > 0 ? fromEnv : cluster ? clusterAddresses().map((a) => a.broker) : [LOCAL_BROKER];
  const kProbe = fromEnv.length === 0 && cluster ? await clusterAnswers() : await kafkaAnswers(brokers);
  const source = fromEnv.length > 0 ? ' (KAFKA_BROKERS)' : cluster ? ' (3-node cluster)' : '';
  console.log(
    `kafka     ${kProbe.ok ? 'up  ' : 'down'}  ${brokers.join(',')}${source}${kProbe.ok ? '' : `  (${kProbe.error})`}`,
  );
  for (const b of findOwnBrokers()) {
    console.log(
      `          ${b.alive ? 'running' : 'stale pid file'}: Kafka ${b.version}, pid ${b.pid}, started by this project (${path.relative(ROOT, kafkaHome(b.version))})`,
    );
  }
  const nodes = clusterNodes();
  if (cluster || nodes.some((n) => n.pid !== undefined)) {
    for (const n of nodes) {
      const rss = n.pid === undefined ? undefined : residentMb(n.pid);
      console.log(
        `          cluster node ${n.id} ${n.broker}: ${n.pid === undefined ? 'not running (here)' : `running, Kafka ${n.version}, pid ${n.pid}${rss === undefined ? '' : `, ${rss} MiB resident`}`} (${path.relative(ROOT, path.dirname(n.logDir))})`,
      );
    }
    const controller = activeController();
    if (controller !== undefined) console.log(`          active controller: node ${controller}`);
  }
  const walUrl = process.env.WAL_DATABASE_URL?.trim() || DEFAULT_WAL_DATABASE_URL;
  const walProbe = await probeWalPostgres(walUrl);
  const walOk = walProbe.ok && walProbe.value === 'logical';
  console.log(
    `wal-pg    ${walOk ? 'up  ' : 'down'}  ${redactUrl(walUrl)}${walProbe.ok ? `  (wal_level=${walProbe.value ?? '?'})` : `  (${walProbe.error})`}`,
  );
  return pgProbe.ok && kProbe.ok && walOk;
}

async function main(argv: string[]): Promise<number> {
  const log: Log = (msg) => console.error(`[services] ${msg}`);
  const command = argv[0];
  switch (command) {
    case 'up': {
      const started = Date.now();
      // A container would stop when this command exits: the plan points at docker compose instead.
      const { databaseUrl, kafkaBrokers, walDatabaseUrl, walDatabaseError } = await ensureServices(log, {
        ephemeralOk: false,
      });
      log(`ready in ${seconds(Date.now() - started)}`);
      console.log(`DATABASE_URL=${databaseUrl}`);
      console.log(`KAFKA_BROKERS=${kafkaBrokers.join(',')}`);
      console.log(`WAL_DATABASE_URL=${walDatabaseUrl}`);
      // The WAL tests need it: fail here, where the reason is clear, rather than in the suite.
      return walDatabaseError === undefined ? 0 : 1;
    }
    case 'jars':
      // Only Maven's copy of the broker's jars (what `up` does first when they are missing): CI
      // fetches the second pass's Kafka 4.4 while the first pass's services start.
      await resolveKafkaJars(resolveKafkaVersion(), log);
      return 0;
    case 'down':
      await stopKafka(log);
      await stopKafkaCluster(log);
      await stopWalPostgres(log);
      return 0;
    case 'status':
      return (await status()) ? 0 : 1;
    default:
      console.error(
        'usage: tsx scripts/services.ts up|down|status|jars\n' +
          '  up      start PostgreSQL, PostgreSQL at wal_level=logical (port 5433) and Kafka if needed;\n' +
          '          prints DATABASE_URL, KAFKA_BROKERS and WAL_DATABASE_URL\n' +
          '  down    stop the Kafka broker, the cluster nodes and the WAL PostgreSQL this project started\n' +
          '  status  show what answers\n' +
          "  jars    only copy the Kafka version's jars into .services/ with Maven (what up does first)\n" +
          'env: DATABASE_URL, KAFKA_BROKERS, WAL_DATABASE_URL (use these instead of local services),\n' +
          `     OUTBOXKIT_KAFKA_VERSION (3 = ${KAFKA_LINES[3]}, default; 4 = ${KAFKA_LINES[4]}),\n` +
          `     OUTBOXKIT_KAFKA_NODES (1 = the broker on ${LOCAL_BROKER}, default; 3 = a 3-node cluster on ${clusterAddresses()
            .map((a) => a.broker)
            .join(',')})`,
      );
      return 2;
  }
}

const invokedAs = process.argv[1];
if (invokedAs && import.meta.url === pathToFileURL(fs.realpathSync(invokedAs)).href) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      console.error(`[services] ${errorText(err)}`);
      process.exitCode = 1;
    },
  );
}
