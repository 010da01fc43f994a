/**
 * Local services for development, tests and CI: PostgreSQL and a real Apache Kafka broker,
 * without Docker.
 *
 * - PostgreSQL: `DATABASE_URL`, else the Debian cluster on 127.0.0.1:5432 (started with
 *   `pg_ctlcluster` when it is installed but down).
 * - Kafka: `KAFKA_BROKERS`, else whatever answers on 127.0.0.1:9092, else a single-node KRaft
 *   broker (combined broker + controller) whose jars Maven resolves from Maven Central through
 *   `scripts/kafka/pom.xml` into `.services/kafka-<version>/`. `OUTBOXKIT_KAFKA_VERSION` picks the
 *   line: `3` / `3.9` (default, 3.9.2) or `4` (4.4.0), or an exact `3.9.x` / `4.x.y`.
 *
 * Usable as a module (vitest global setup, the demo) and as a CLI:
 *   tsx scripts/services.ts up | down | status
 *
 * The broker is started detached, so it outlives the process that started it; `down` (or
 * {@link stopKafka}) stops it, and only a broker this project started (pid file).
 */
import { execFile, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import kafkajs from 'kafkajs';
import pg from 'pg';

import { probeDocker, startContainers } from './containers.js';
import { isCi, needsDockerProbe, planServices, type ServiceFacts } from './service-plan.js';

const { Kafka, logLevel } = kafkajs;

export type Log = (msg: string) => void;

const noop: Log = () => {};

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const SERVICES_DIR = path.join(ROOT, '.services');
const KAFKA_SCRIPTS_DIR = path.join(ROOT, 'scripts', 'kafka');
const POM = path.join(KAFKA_SCRIPTS_DIR, 'pom.xml');
const LOCK_FILE = path.join(SERVICES_DIR, 'kafka.lock');

const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/postgres';
const LOCAL_BROKER = '127.0.0.1:9092';
const CONTROLLER_ADDRESS = '127.0.0.1:9093';

/** Pinned versions per major line. Keep in step with `kafka3.version` / `kafka4.version` in the pom. */
const KAFKA_LINES = { 3: '3.9.2', 4: '4.4.0' } as const;
type KafkaLine = keyof typeof KAFKA_LINES;

const POSTGRES_WAIT_MS = 30_000;
const KAFKA_ENV_WAIT_MS = 30_000;
const KAFKA_READY_MS = 90_000;
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
}

async function probePostgres(url: string): Promise<PgProbe> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3_000 });
  // An error emitted after connect() failed would otherwise be unhandled.
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('select 1');
    return { ok: true, unreachable: false };
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
  const layout = { home, listen, controller: `127.0.0.1:${port + 1}` };
  const brokers = [listen];
  const launch = async (): Promise<number> => {
    const from = logSize(home);
    const pid = await startBroker(version, log, layout);
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

export interface Services {
  databaseUrl: string;
  kafkaBrokers: string[];
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
  const [pgResult, kafkaResult, containerResult] = await Promise.allSettled([
    containersWanted.postgres ? undefined : ensurePostgres(log),
    containersWanted.kafka ? undefined : ensureKafka(log),
    containers,
  ]);
  const stop = async () => {
    if (containerResult.status === 'fulfilled') await containerResult.value?.stop();
  };
  if (pgResult.status === 'fulfilled' && kafkaResult.status === 'fulfilled' && containerResult.status === 'fulfilled') {
    const databaseUrl = pgResult.value ?? containerResult.value?.databaseUrl;
    const kafkaBrokers = kafkaResult.value?.brokers ?? containerResult.value?.kafkaBrokers;
    if (databaseUrl !== undefined && kafkaBrokers !== undefined) return { databaseUrl, kafkaBrokers, stop };
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
  const [pgLocal, kafkaLocal] = await Promise.all([
    databaseUrl === undefined ? probePostgres(DEFAULT_DATABASE_URL) : undefined,
    kafkaBrokers.length === 0 ? kafkaAnswers([LOCAL_BROKER]) : undefined,
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
      localAnswers: kafkaLocal?.ok ?? true,
      maven: kafkaLocal === undefined || kafkaLocal.ok ? undefined : await mavenBrokerPossible(),
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
async function mavenBrokerPossible(): Promise<{ ok: boolean; reason?: string }> {
  try {
    const version = resolveKafkaVersion();
    // A broker of ours that is still booting needs no toolchain check: ensureKafka waits for it.
    if (findOwnBrokers().some((b) => b.alive)) return { ok: true };
    await checkJava();
    if (readText(path.join(kafkaHome(version), 'lib', '.complete')) === kafkaJarsStamp(version)) return { ok: true };
    await checkMaven();
    return { ok: true };
  } catch (err) {
    // checkJava/checkMaven phrase a whole error; the plan's message only needs what failed.
    const reason = errorText(err)
      .replace(/^Kafka is not running at \S+ and cannot be started: /, '')
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

function kafkaLine(version: string): KafkaLine {
  return version.startsWith('4.') ? 4 : 3;
}

function kafkaHome(version: string): string {
  return path.join(SERVICES_DIR, `kafka-${version}`);
}

// --- probing -----------------------------------------------------------------------------------

interface Probe {
  ok: boolean;
  error?: string;
}

function probeClient(brokers: string[]) {
  return new Kafka({
    clientId: 'outboxkit-services',
    brokers,
    logLevel: logLevel.NOTHING,
    connectionTimeout: 2_000,
    requestTimeout: 10_000,
    retry: { retries: 0 },
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

async function checkJava(): Promise<void> {
  const java = await run(javaBin(), ['-version'], { timeoutMs: 30_000 });
  if (java.code !== 0) {
    throw new Error(
      `Kafka is not running at ${LOCAL_BROKER} and cannot be started: \`java -version\` failed (${java.error ?? lastLines(java.stderr, 3)}). ${TOOLCHAIN_HINT}`,
    );
  }
  // `openjdk version "17.0.15" ...` or, before Java 9, `java version "1.8.0_412"`.
  const m = /version "(\d+)(?:\.(\d+))?/.exec(java.stderr);
  const major = m ? (m[1] === '1' ? Number(m[2]) : Number(m[1])) : NaN;
  if (!(major >= JAVA_MIN_MAJOR)) {
    throw new Error(
      `Kafka is not running at ${LOCAL_BROKER} and cannot be started: Java ${JAVA_MIN_MAJOR}+ is needed, found ${Number.isNaN(major) ? 'an unknown version' : `Java ${major}`} (${javaBin()}). ${TOOLCHAIN_HINT}`,
    );
  }
}

async function checkMaven(): Promise<void> {
  const mvn = await run('mvn', ['-v'], { timeoutMs: 60_000 });
  if (mvn.code !== 0) {
    throw new Error(
      `Kafka is not running at ${LOCAL_BROKER} and cannot be started: \`mvn -v\` failed (${mvn.error ?? lastLines(mvn.stderr || mvn.stdout, 3)}). ${TOOLCHAIN_HINT}`,
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
 * @throws when Maven is missing or cannot resolve the version.
 */
export async function resolveKafkaJars(version: string, log: Log = noop): Promise<void> {
  const lib = path.join(kafkaHome(version), 'lib');
  const marker = path.join(lib, '.complete');
  const stamp = kafkaJarsStamp(version);
  if (readText(marker) === stamp) return;
  await checkMaven();

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

function serverProperties(
  version: string,
  home: string,
  listen = LOCAL_BROKER,
  controller = CONTROLLER_ADDRESS,
): string {
  const lines = [
    '# Written by scripts/services.ts on every start; edit that file, not this one.',
    '# Single-node KRaft, broker and controller in one process, loopback only.',
    'process.roles=broker,controller',
    'node.id=1',
    `controller.quorum.voters=1@${controller}`,
    `listeners=PLAINTEXT://${listen},CONTROLLER://${controller}`,
    `advertised.listeners=PLAINTEXT://${listen}`,
    'inter.broker.listener.name=PLAINTEXT',
    'controller.listener.names=CONTROLLER',
    'listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT',
    '',
    '# Small machine (2 cores): few threads.',
    'num.network.threads=2',
    'num.io.threads=2',
    'background.threads=2',
    'num.replica.fetchers=1',
    'num.recovery.threads.per.data.dir=1',
    '',
    `log.dirs=${path.join(home, 'data')}`,
    'num.partitions=1',
    'default.replication.factor=1',
    'min.insync.replicas=1',
    '# Topics are created explicitly (tests use random names); a typo must fail, not create a topic.',
    'auto.create.topics.enable=false',
    'delete.topic.enable=true',
    '',
    '# Internal topics: one replica, few partitions so the first consumer group / transactional',
    '# producer does not wait for 50 partitions to be created.',
    'offsets.topic.replication.factor=1',
    'offsets.topic.num.partitions=3',
    'transaction.state.log.replication.factor=1',
    'transaction.state.log.min.isr=1',
    'transaction.state.log.num.partitions=3',
    '# No 3 s wait before the first rebalance of a group (faster tests).',
    'group.initial.rebalance.delay.ms=0',
    '',
    '# A dev/test broker: keep a day, at most 128 MiB per partition, small segments.',
    'log.retention.hours=24',
    'log.retention.bytes=134217728',
    'log.segment.bytes=16777216',
    'log.retention.check.interval.ms=300000',
  ];
  if (kafkaLine(version) === 4) {
    lines.push(
      '',
      '# Kafka 4.x share groups (KIP-932): one replica for their state topic too.',
      'share.coordinator.state.topic.replication.factor=1',
      'share.coordinator.state.topic.min.isr=1',
    );
  }
  return `${lines.join('\n')}\n`;
}

/** Formats KRaft storage once (cluster id kept across runs), then launches the broker detached. */
async function startBroker(
  version: string,
  log: Log,
  layout: { home: string; listen: string; controller: string } = {
    home: kafkaHome(version),
    listen: LOCAL_BROKER,
    controller: CONTROLLER_ADDRESS,
  },
): Promise<number> {
  const home = layout.home;
  const props = path.join(home, 'server.properties');
  const classpath = path.join(kafkaHome(version), 'lib', '*');
  fs.mkdirSync(path.join(home, 'logs'), { recursive: true });
  fs.writeFileSync(props, serverProperties(version, home, layout.listen, layout.controller));
  const logging = jvmLoggingArgs(version, home);

  if (!fs.existsSync(path.join(home, 'data', 'meta.properties'))) {
    const idFile = path.join(home, 'cluster-id');
    let clusterId = readText(idFile)?.trim();
    if (!clusterId) {
      const res = await run(javaBin(), [...logging, '-cp', classpath, 'kafka.tools.StorageTool', 'random-uuid'], {
        timeoutMs: 60_000,
      });
      clusterId = res.stdout.trim().split('\n').pop()?.trim();
      if (res.code !== 0 || !clusterId || !/^[\w-]{22}$/.test(clusterId)) {
        throw new Error(
          `kafka.tools.StorageTool random-uuid failed (exit ${res.code}): ${lastLines(res.stdout + res.stderr, 10)}`,
        );
      }
      fs.writeFileSync(idFile, `${clusterId}\n`);
    }
    log(`Formatting KRaft storage (cluster id ${clusterId})`);
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
        '-Xms512m',
        '-Xmx512m',
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
async function acquireLock(log: Log): Promise<() => void> {
  fs.mkdirSync(SERVICES_DIR, { recursive: true });
  const deadline = Date.now() + LOCK_WAIT_MS;
  let announced = false;
  for (;;) {
    try {
      const fd = fs.openSync(LOCK_FILE, 'wx');
      fs.writeSync(fd, JSON.stringify({ pid: process.pid, at: new Date().toISOString() }));
      fs.closeSync(fd);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        fs.rmSync(LOCK_FILE, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    if (isStaleLock()) {
      fs.rmSync(LOCK_FILE, { force: true });
      continue;
    }
    if (Date.now() > deadline) {
      throw new Error(
        `Timed out after ${LOCK_WAIT_MS / 1000} s waiting for ${path.relative(ROOT, LOCK_FILE)} (another process is starting Kafka); delete it if no such process exists.`,
      );
    }
    if (!announced) {
      log('Kafka is being started by another process (or caller); waiting for it');
      announced = true;
    }
    await sleep(250);
  }
}

function isStaleLock(): boolean {
  try {
    const stat = fs.statSync(LOCK_FILE);
    if (Date.now() - stat.mtimeMs > LOCK_STALE_MS) return true;
    const owner = JSON.parse(fs.readFileSync(LOCK_FILE, 'utf8')) as { pid?: unknown };
    return typeof owner.pid === 'number' && !isAlive(owner.pid);
  } catch (err) {
    // Gone already (ENOENT) → retry; half-written by its owner (bad JSON) → not stale yet.
    return (err as NodeJS.ErrnoException).code === 'ENOENT';
  }
}

// --- helpers -----------------------------------------------------------------------------------

interface RunResult {
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
  const brokers = fromEnv.length > 0 ? fromEnv : [LOCAL_BROKER];
  const kProbe = await kafkaAnswers(brokers);
  console.log(
    `kafka     ${kProbe.ok ? 'up  ' : 'down'}  ${brokers.join(',')}${fromEnv.length > 0 ? ' (KAFKA_BROKERS)' : ''}${kProbe.ok ? '' : `  (${kProbe.error})`}`,
  );
  for (const b of findOwnBrokers()) {
    console.log(
      `          ${b.alive ? 'running' : 'stale pid file'}: Kafka ${b.version}, pid ${b.pid}, started by this project (${path.relative(ROOT, kafkaHome(b.version))})`,
    );
  }
  return pgProbe.ok && kProbe.ok;
}

async function main(argv: string[]): Promise<number> {
  const log: Log = (msg) => console.error(`[services] ${msg}`);
  const command = argv[0];
  switch (command) {
    case 'up': {
      const started = Date.now();
      // A container would stop when this command exits: the plan points at docker compose instead.
      const { databaseUrl, kafkaBrokers } = await ensureServices(log, { ephemeralOk: false });
      log(`ready in ${seconds(Date.now() - started)}`);
      console.log(`DATABASE_URL=${databaseUrl}`);
      console.log(`KAFKA_BROKERS=${kafkaBrokers.join(',')}`);
      return 0;
    }
    case 'down':
      await stopKafka(log);
      return 0;
    case 'status':
      return (await status()) ? 0 : 1;
    default:
      console.error(
        'usage: tsx scripts/services.ts up|down|status\n' +
          '  up      start PostgreSQL and Kafka if needed; prints DATABASE_URL and KAFKA_BROKERS\n' +
          '  down    stop the Kafka broker this project started\n' +
          '  status  show what answers\n' +
          'env: DATABASE_URL, KAFKA_BROKERS (use these instead of local services),\n' +
          `     OUTBOXKIT_KAFKA_VERSION (3 = ${KAFKA_LINES[3]}, default; 4 = ${KAFKA_LINES[4]})`,
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
