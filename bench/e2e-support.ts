/**
 * Shared machinery of the end-to-end benchmarks of issue #7 (bench/e2e.ts, bench/catchup.ts,
 * bench/long-transaction.ts): the orders pipeline of examples/orders run as real child processes
 *
 *   load (this process, HTTP)  →  orders service  →  relay daemon(s)  →  Kafka  →  shipping consumer
 *
 * on a throwaway database and topics, plus the measuring instruments:
 * - {@link LoadGenerator}: an open-loop, paced `POST /orders` load (fresh idempotency key each);
 * - {@link CpuMeter}: CPU-seconds (utime + stime from /proc/<pid>/stat) per stage process, of the
 *   bench database's PostgreSQL backends plus PostgreSQL's auxiliary processes, and of the broker;
 * - {@link Pipeline.probe}: counts taken from the database (events created, pending, consumed);
 * - {@link Pipeline.latency}: order commit → shipment latency percentiles, both ends read from the
 *   database clock.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Kafka, logLevel } from 'kafkajs';
import pg from 'pg';
import { ensureDemoSchema } from '../examples/orders/db.js';
import { benchDatabase, type BenchDatabase } from './support.js';
import { ensureTopics } from '../src/kafka/topics.js';

const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.resolve(here, '..');

/** A numeric knob from the environment (`name`), else `fallback`. */
export function knob(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === '') return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n) || n < 0)
    throw new Error(`${name} must be a non-negative number, got ${JSON.stringify(raw)}.`);
  return n;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Progress lines on stderr (stdout carries the Markdown). */
export function log(bench: string, msg: string): void {
  process.stderr.write(`[${bench} ${new Date().toISOString().slice(11, 19)}] ${msg}\n`);
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

/** Least-squares slope of y over x (units of y per unit of x); NaN with fewer than 2 points. */
export function slope(points: readonly { x: number; y: number }[]): number {
  const n = points.length;
  if (n < 2) return NaN;
  const mx = points.reduce((a, p) => a + p.x, 0) / n;
  const my = points.reduce((a, p) => a + p.y, 0) / n;
  let num = 0;
  let den = 0;
  for (const p of points) {
    num += (p.x - mx) * (p.y - my);
    den += (p.x - mx) ** 2;
  }
  return den === 0 ? NaN : num / den;
}

export const f0 = (x: number) => (Number.isFinite(x) ? x.toFixed(0) : 'n/a');
export const f1 = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : 'n/a');
export const f2 = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : 'n/a');
export const f3 = (x: number) => (Number.isFinite(x) ? x.toFixed(3) : 'n/a');

/** A Markdown table. */
export function table(header: string[], rows: (string | number)[][]): string {
  return [
    `| ${header.join(' | ')} |`,
    `| ${header.map(() => '---').join(' | ')} |`,
    ...rows.map((r) => `| ${r.join(' | ')} |`),
  ].join('\n');
}

/** 1-minute load average and the machine, for the record of a run. */
export function loadAverage(): string {
  try {
    return readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  } catch {
    return 'n/a';
  }
}

// ---------------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------------

export interface Child {
  name: string;
  /** The relay id given to a relay. */
  relayId?: string;
  proc: ChildProcess;
  pid: number;
  lines: string[];
}

/** Spawns `node --import tsx <script> ...args` from the repository root, keeping its last output lines. */
export function startChild(name: string, script: string, args: string[], env: Record<string, string>): Child {
  const proc = spawn(process.execPath, ['--import', 'tsx', script, ...args], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  if (proc.pid === undefined) throw new Error(`could not spawn ${name}`);
  const child: Child = { name, proc, pid: proc.pid, lines: [] };
  for (const stream of [proc.stdout, proc.stderr]) {
    createInterface({ input: stream! }).on('line', (line) => {
      child.lines.push(line);
      if (child.lines.length > 200) child.lines.shift();
    });
  }
  live.add(child);
  proc.once('exit', () => live.delete(child));
  return child;
}

const live = new Set<Child>();
// A bench that throws must not leave daemons behind.
process.once('exit', () => {
  for (const c of live) c.proc.kill('SIGKILL');
});

export function exited(child: Child): boolean {
  return child.proc.exitCode !== null || child.proc.signalCode !== null;
}

/** Sends `signal` and waits for the exit (SIGKILL after `timeoutMs`). */
export async function stopChild(child: Child, signal: NodeJS.Signals = 'SIGTERM', timeoutMs = 30_000): Promise<void> {
  if (exited(child)) return;
  const done = new Promise<void>((r) => child.proc.once('exit', () => r()));
  child.proc.kill(signal);
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), timeoutMs);
  await done;
  clearTimeout(timer);
}

/** Polls `check` every `everyMs` until true; throws after `timeoutMs` or when a watched child exits. */
export async function waitFor(
  what: string,
  check: () => Promise<boolean> | boolean,
  options: { timeoutMs: number; everyMs?: number; children?: readonly Child[] },
): Promise<void> {
  const deadline = performance.now() + options.timeoutMs;
  for (;;) {
    for (const c of options.children ?? []) {
      if (exited(c))
        throw new Error(
          `${c.name} exited (${c.proc.exitCode}) while waiting for ${what}:\n${c.lines.slice(-20).join('\n')}`,
        );
    }
    if (await check()) return;
    if (performance.now() > deadline) throw new Error(`timed out after ${options.timeoutMs} ms waiting for ${what}`);
    await sleep(options.everyMs ?? 200);
  }
}

// ---------------------------------------------------------------------------------------------
// CPU accounting
// ---------------------------------------------------------------------------------------------

/** application_name prefix of the bench's own PostgreSQL connections (not counted as pipeline CPU). */
export const BENCH_APPLICATION = 'outboxkit-bench';

const CLK_TCK = (() => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** utime + stime of a live process, in seconds; undefined when it is gone. */
export function processCpuSeconds(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may contain spaces) start at field 3 (state).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
  } catch {
    return undefined;
  }
}

/** The Kafka broker's JVM (main class kafka.Kafka), if it runs on this host. */
export function findBrokerPid(): number | undefined {
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmd = readFileSync(`/proc/${entry}/cmdline`, 'utf8').split('\0');
      if (cmd.includes('kafka.Kafka') || cmd.some((a) => a.endsWith('KafkaRaftServer'))) return Number(entry);
    } catch {
      // The process ended while we looked.
    }
  }
  return undefined;
}

/** Cumulative CPU-seconds per group at one instant. */
export type CpuSample = Record<string, number>;

/**
 * CPU-seconds of named groups of processes. Each pid contributes its utime + stime as last read,
 * so a process that started during a phase counts whole and one that ended counts up to its last
 * reading (readings every `everyMs`, and at each {@link sample}). Group `postgres` is found by
 * itself: the backends of the bench database (minus the bench's own connections, whose
 * application_name starts with {@link BENCH_APPLICATION}) and the server's auxiliary processes (checkpointer, background writer, walwriter,
 * launchers), which also serve other databases. Group `broker` is the local broker's JVM.
 */
export class CpuMeter {
  private readonly groups = new Map<number, string>();
  private readonly last = new Map<number, number>();
  private timer: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> = Promise.resolve();
  readonly brokerPid: number | undefined;
  postgresVisible = true;

  constructor(
    private readonly monitor: pg.Pool,
    private readonly dbName: string,
  ) {
    this.brokerPid = findBrokerPid();
    if (this.brokerPid !== undefined) this.track('broker', this.brokerPid);
  }

  track(group: string, pid: number): void {
    this.groups.set(pid, group);
    this.read(pid);
  }

  private read(pid: number): void {
    const s = processCpuSeconds(pid);
    if (s !== undefined) this.last.set(pid, s);
  }

  private async refresh(): Promise<void> {
    const { rows } = await this.monitor.query<{ pid: number }>(
      `SELECT pid FROM pg_stat_activity
        WHERE (datname = $1 AND coalesce(application_name, '') NOT LIKE $2)
           OR (datname IS NULL AND backend_type <> 'client backend')`,
      [this.dbName, `${BENCH_APPLICATION}%`],
    );
    let seen = 0;
    for (const { pid } of rows) {
      if (!this.groups.has(pid)) this.groups.set(pid, 'postgres');
      if (processCpuSeconds(pid) !== undefined) seen++;
    }
    // PostgreSQL in a container: its pids are not ours to read.
    this.postgresVisible = seen > 0;
    for (const pid of this.groups.keys()) this.read(pid);
  }

  /** Starts the background readings. */
  start(everyMs = 500): void {
    this.timer = setInterval(() => {
      this.refreshing = this.refreshing.then(() => this.refresh()).catch(() => undefined);
    }, everyMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** Cumulative CPU-seconds per group now (plus `bench`: this process, load generator included). */
  async sample(): Promise<CpuSample> {
    await this.refreshing;
    await this.refresh();
    const out: CpuSample = {};
    for (const [pid, group] of this.groups) out[group] = (out[group] ?? 0) + (this.last.get(pid) ?? 0);
    const own = process.cpuUsage();
    out.bench = (own.user + own.system) / 1e6;
    return out;
  }
}

/** CPU-seconds spent by `groups` between two samples. */
export function cpuDelta(a: CpuSample, b: CpuSample, groups: readonly string[]): number {
  return groups.reduce((sum, g) => sum + ((b[g] ?? 0) - (a[g] ?? 0)), 0);
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

/** Counters of a {@link LoadGenerator}. */
export interface LoadCounters {
  /** Requests sent. */
  sent: number;
  /** 201 answers. */
  ok: number;
  /** Any other answer or a transport error. */
  errors: number;
  /** Requests the generator could not send on time (more than 1 s behind its schedule) and dropped. */
  shed: number;
}

/**
 * An open-loop load: `POST /orders` at `rate` per second, each with a fresh `Idempotency-Key`
 * (so every request creates an order), at most `maxInFlight` at once over keep-alive sockets.
 * Runs in the bench process; its CPU is not part of any stage's figure.
 */
export class LoadGenerator {
  readonly counters: LoadCounters = { sent: 0, ok: 0, errors: 0, shed: 0 };
  readonly statuses = new Map<string, number>();
  private readonly agent: http.Agent;
  private readonly url: URL;
  private inFlight = 0;
  private rate = 0;
  private t0 = 0;
  private base = 0;
  private timer: NodeJS.Timeout | undefined;
  private idle: (() => void) | undefined;
  private n = 0;

  constructor(
    baseUrl: string,
    private readonly maxInFlight = 64,
    private readonly tenants = ['tenant-a', 'tenant-b', 'tenant-c'],
  ) {
    this.url = new URL(baseUrl);
    this.agent = new http.Agent({ keepAlive: true, maxSockets: maxInFlight });
  }

  get currentRate(): number {
    return this.rate;
  }

  /** Sets the offered rate (per second; 0 stops sending) from now on. */
  setRate(rate: number): void {
    this.rate = rate;
    this.t0 = performance.now();
    this.base = this.counters.sent + this.counters.shed;
    if (rate > 0 && this.timer === undefined) this.timer = setInterval(() => this.tick(), 4);
    if (rate === 0) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }

  /** Stops sending and waits for the answers in flight. */
  async stop(): Promise<void> {
    this.setRate(0);
    if (this.inFlight > 0) await new Promise<void>((r) => (this.idle = r));
  }

  close(): void {
    this.agent.destroy();
  }

  private tick(): void {
    const due =
      Math.floor(((performance.now() - this.t0) * this.rate) / 1000) -
      (this.counters.sent + this.counters.shed - this.base);
    let todo = due;
    // More than a second behind schedule: what cannot be sent on time is dropped and counted.
    if (todo > this.rate) {
      this.counters.shed += todo - this.rate;
      todo = this.rate;
    }
    while (todo > 0 && this.inFlight < this.maxInFlight) {
      todo--;
      this.send();
    }
  }

  private send(): void {
    const i = this.n++;
    const body = JSON.stringify({ cartId: `cart-${i}`, currency: 'EUR', amount: 100 + (i % 900) });
    this.counters.sent++;
    this.inFlight++;
    const done = (status: string) => {
      this.statuses.set(status, (this.statuses.get(status) ?? 0) + 1);
      if (status === '201') this.counters.ok++;
      else this.counters.errors++;
      this.inFlight--;
      if (this.inFlight === 0 && this.idle) {
        const r = this.idle;
        this.idle = undefined;
        r();
      }
    };
    const req = http.request(
      {
        agent: this.agent,
        host: this.url.hostname,
        port: this.url.port,
        path: '/orders',
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(body),
          'idempotency-key': randomUUID(),
          'x-tenant-id': this.tenants[i % this.tenants.length]!,
        },
      },
      (res) => {
        res.resume();
        res.once('end', () => done(String(res.statusCode)));
        res.once('error', () => done('response error'));
      },
    );
    req.setTimeout(30_000, () => req.destroy(new Error('timeout')));
    req.once('error', (err) => done((err as NodeJS.ErrnoException).code ?? err.message));
    req.end(body);
  }
}

/**
 * Calls `send()` at a fixed rate (per second) from this process, open loop, at most `maxInFlight`
 * at once; what falls more than a second behind is dropped and counted. The feed of a stage
 * measured alone (bench/e2e.ts): its own CPU is this process's, never a stage's.
 */
export class PacedFeeder {
  readonly counters = { sent: 0, ok: 0, errors: 0, shed: 0 };
  private inFlight = 0;
  private t0 = 0;
  private rate = 0;
  private timer: NodeJS.Timeout | undefined;
  private idle: (() => void) | undefined;

  constructor(
    private readonly send: (i: number) => Promise<void>,
    private readonly maxInFlight = 16,
  ) {}

  /** Starts sending at `rate` per second (counts restart). */
  start(rate: number): void {
    this.rate = rate;
    this.t0 = performance.now();
    this.counters.sent = this.counters.ok = this.counters.errors = this.counters.shed = 0;
    this.timer ??= setInterval(() => this.tick(), 4);
  }

  /** Stops sending and waits for the sends in flight. */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    if (this.inFlight > 0) await new Promise<void>((r) => (this.idle = r));
  }

  private tick(): void {
    let todo =
      Math.floor(((performance.now() - this.t0) * this.rate) / 1000) - (this.counters.sent + this.counters.shed);
    if (todo > this.rate) {
      this.counters.shed += todo - this.rate;
      todo = this.rate;
    }
    while (todo-- > 0 && this.inFlight < this.maxInFlight) {
      const i = this.counters.sent++;
      this.inFlight++;
      this.send(i)
        .then(
          () => this.counters.ok++,
          () => this.counters.errors++,
        )
        .finally(() => {
          this.inFlight--;
          if (this.inFlight === 0 && this.idle) {
            const r = this.idle;
            this.idle = undefined;
            r();
          }
        });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The pipeline
// ---------------------------------------------------------------------------------------------

/** Counts at one instant, read from the database. */
export interface Probe {
  /** Monotonic ms (this process) when the probe returned. */
  at: number;
  /** The database clock, ISO text, at the probe. */
  dbNow: string;
  /** Outbox events of every topic created so far (the sequence's last value). */
  createdAll: number;
  /** Committed events of every topic not yet published (the relay's backlog). */
  pending: number;
  /** createdAll − pending: events published, every topic. */
  published: number;
  /** Events of the orders topic created so far (createdAll minus {@link Pipeline.otherEvents}). */
  created: number;
  /** Events of the orders topic not yet published. */
  pendingOrders: number;
  /** Events applied by the consumer (inbox rows of its group). */
  applied: number;
}

export interface PipelineOptions {
  /** Partitions of the orders topic. */
  partitions: number;
  /** Extra topics to create (with the same partition count), e.g. for a sequence writer. */
  extraTopics?: string[];
  bench: string;
}

/** Latency percentiles of the orders created within a window, in ms. */
export interface LatencyFigures {
  /** Orders created within the window. */
  orders: number;
  /** Of which applied by the consumer (the percentiles cover these). */
  applied: number;
  p50: number;
  p99: number;
  max: number;
  /** order insert → outbox row marked published (the relay's part), same orders. */
  relayP50: number;
  relayP99: number;
}

/**
 * One pipeline run: a fresh database with outboxkit's and the example's tables, an orders topic
 * and its dead-letter topic, and the processes of examples/orders started on demand.
 */
export class Pipeline {
  readonly runId = randomBytes(4).toString('hex');
  readonly topic: string;
  readonly group: string;
  readonly kafka: Kafka;
  readonly monitor: pg.Pool;
  readonly cpu: CpuMeter;
  orders: Child | undefined;
  relays: Child[] = [];
  consumer: Child | undefined;
  baseUrl = '';
  /** Events committed to other topics than the orders topic so far (set by a bench that writes some). */
  otherEvents: () => number = () => 0;
  private anchor = { at: '', base: 0 };
  private relayCount = 0;

  private constructor(
    readonly db: BenchDatabase,
    readonly dbName: string,
    private readonly options: PipelineOptions,
  ) {
    this.topic = `bench.${options.bench}.${this.runId}`;
    this.group = `shipping-${this.runId}`;
    this.kafka = new Kafka({ clientId: `bench-${options.bench}`, brokers: db.brokers, logLevel: logLevel.NOTHING });
    // The bench's own connections (probes, latency queries, the long transaction) carry an
    // application_name starting with BENCH_APPLICATION and are left out of the PostgreSQL figure.
    this.monitor = new pg.Pool({
      connectionString: db.url,
      max: 2,
      idleTimeoutMillis: 0,
      application_name: `${BENCH_APPLICATION}-monitor`,
    });
    this.monitor.on('error', () => undefined);
    this.cpu = new CpuMeter(this.monitor, dbName);
  }

  /** Creates the database, schema and topics. */
  static async create(options: PipelineOptions): Promise<Pipeline> {
    const db = await benchDatabase();
    const p = new Pipeline(db, new URL(db.url).pathname.slice(1), options);
    const setup = new pg.Pool({ connectionString: db.url, max: 1 });
    await ensureDemoSchema(setup);
    await setup.end();
    await ensureTopics(
      p.kafka,
      [p.topic, `${p.topic}.dlq`, ...(options.extraTopics ?? [])].map((topic) => ({
        topic,
        numPartitions: options.partitions,
        replicationFactor: 1,
      })),
    );
    p.cpu.start();
    return p;
  }

  private env(): Record<string, string> {
    return {
      DATABASE_URL: this.db.url,
      KAFKA_BROKERS: this.db.brokers.join(','),
      ORDERS_TOPIC: this.topic,
      SHIPPING_GROUP: this.group,
      OUTBOXKIT_LOG_LEVEL: 'warn',
      OUTBOXKIT_METRICS_PORT: '-1',
      PORT: '0',
    };
  }

  private children(): Child[] {
    return [this.orders, this.consumer, ...this.relays].filter((c): c is Child => c !== undefined);
  }

  /** Starts the orders service (examples/orders/server.ts) and waits for its port. */
  async startOrders(): Promise<void> {
    this.orders = startChild('orders', path.join(root, 'examples/orders/server.ts'), [], this.env());
    this.cpu.track('orders', this.orders.pid);
    await waitFor(
      'the orders service',
      () => {
        const line = this.orders!.lines.find((l) => l.includes('ORDERS_LISTENING '));
        if (line) this.baseUrl = line.split('ORDERS_LISTENING ')[1]!.trim();
        return this.baseUrl !== '';
      },
      { timeoutMs: 60_000, children: [this.orders] },
    );
  }

  /** Starts one relay daemon (`cli/main.ts relay`) and waits for it to register. */
  async startRelay(): Promise<Child> {
    const relayId = `bench-relay-${this.runId}-${++this.relayCount}`;
    const relay = startChild('relay', path.join(root, 'cli/main.ts'), ['relay', '--relay-id', relayId], this.env());
    relay.relayId = relayId;
    this.relays.push(relay);
    this.cpu.track('relay', relay.pid);
    await waitFor(
      'the relay to register',
      async () =>
        (
          await this.monitor
            .query('SELECT 1 FROM outboxkit.relay_instances WHERE relay_id = $1', [relayId])
            .catch(() => ({ rowCount: 0 }))
        ).rowCount === 1,
      { timeoutMs: 60_000, children: [relay] },
    );
    return relay;
  }

  /** Stops every relay (`signal`: SIGTERM drains and releases lanes; SIGKILL leaves them leased). */
  async stopRelays(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    await Promise.all(this.relays.map((r) => stopChild(r, signal)));
    this.relays = [];
  }

  /** Starts the shipping consumer (examples/orders/shipping.ts) and waits for it to be started. */
  async startConsumer(): Promise<void> {
    this.consumer = startChild('consumer', path.join(root, 'examples/orders/shipping.ts'), [], this.env());
    this.cpu.track('consumer', this.consumer.pid);
    await waitFor('the shipping consumer', () => this.consumer!.lines.some((l) => l.includes('SHIPPING_READY')), {
      timeoutMs: 60_000,
      children: [this.consumer],
    });
  }

  async stopConsumer(): Promise<void> {
    if (this.consumer) await stopChild(this.consumer);
    this.consumer = undefined;
  }

  /** Throws if a started process died. */
  checkAlive(): void {
    for (const c of this.children())
      if (exited(c)) throw new Error(`${c.name} exited (${c.proc.exitCode}):\n${c.lines.slice(-20).join('\n')}`);
  }

  /**
   * Moves the consumed-count anchor to a few seconds ago: later probes count inbox rows from
   * there through the index on `processed_at` (a full count per probe would grow with the table).
   * Every consumer transaction that started before the anchor has committed by then.
   */
  async rebase(): Promise<void> {
    const { rows } = await this.monitor.query<{ at: string; n: number }>(
      `WITH a AS (SELECT now() - interval '5 seconds' AS at)
       SELECT (SELECT at FROM a)::text AS at,
              (SELECT count(*) FROM outboxkit.inbox WHERE consumer_group = $1 AND processed_at < (SELECT at FROM a))::int AS n`,
      [this.group],
    );
    this.anchor = { at: rows[0]!.at, base: rows[0]!.n };
  }

  /** Counts now (cheap enough to run every few hundred ms). */
  async probe(): Promise<Probe> {
    if (this.anchor.at === '') await this.rebase();
    const { rows } = await this.monitor.query<{
      now: string;
      created: string;
      pending: number;
      pending_orders: number;
      applied: number;
    }>(
      `SELECT clock_timestamp()::text AS now,
              (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outboxkit.outbox_events_seq_seq)::text AS created,
              (SELECT count(*) FROM outboxkit.outbox_events WHERE published_at IS NULL)::int AS pending,
              (SELECT count(*) FROM outboxkit.outbox_events WHERE published_at IS NULL AND topic = $3)::int AS pending_orders,
              (SELECT count(*) FROM outboxkit.inbox WHERE consumer_group = $1 AND processed_at >= $2::timestamptz)::int AS applied`,
      [this.group, this.anchor.at, this.topic],
    );
    const r = rows[0]!;
    const createdAll = Number(r.created);
    return {
      at: performance.now(),
      dbNow: r.now,
      createdAll,
      pending: r.pending,
      published: createdAll - r.pending,
      created: createdAll - this.otherEvents(),
      pendingOrders: r.pending_orders,
      applied: this.anchor.base + r.applied,
    };
  }

  /** Waits until every created event is published and applied (exact counts). */
  async waitDrained(timeoutMs: number, includeConsumer = true): Promise<void> {
    await waitFor(
      includeConsumer ? 'the pipeline to drain' : 'the outbox to drain',
      async () => {
        const { rows } = await this.monitor.query<{ pending: number; orders: number; shipments: number }>(
          `SELECT (SELECT count(*) FROM outboxkit.outbox_events WHERE published_at IS NULL)::int AS pending,
                  (SELECT count(*) FROM orders_demo.orders)::int AS orders,
                  (SELECT count(*) FROM orders_demo.shipments)::int AS shipments`,
        );
        const r = rows[0]!;
        return r.pending === 0 && (!includeConsumer || r.orders === r.shipments);
      },
      { timeoutMs, everyMs: 500, children: this.children() },
    );
  }

  /** The database clock now, as text. */
  async dbNow(): Promise<string> {
    return (await this.monitor.query<{ now: string }>('SELECT clock_timestamp()::text AS now')).rows[0]!.now;
  }

  /**
   * Latency of the orders inserted in [from, to) (database times): the order row's insert time
   * (`clock_timestamp()` in the service's transaction, a few statements before its COMMIT) to the
   * shipment row's insert time (`clock_timestamp()` in the consumer's transaction). One clock.
   */
  async latency(from: string, to: string): Promise<LatencyFigures> {
    const { rows } = await this.monitor.query<{
      orders: number;
      applied: number;
      p50: number | null;
      p99: number | null;
      max: number | null;
      rp50: number | null;
      rp99: number | null;
    }>(
      `WITH o AS (
         SELECT o.id, o.created_at,
                extract(epoch FROM s.created_at - o.created_at) * 1000 AS ms,
                extract(epoch FROM e.published_at - o.created_at) * 1000 AS relay_ms
           FROM orders_demo.orders o
           LEFT JOIN orders_demo.shipments s ON s.order_id = o.id
           LEFT JOIN outboxkit.outbox_events e ON e.aggregate_id = o.id::text
          WHERE o.created_at >= $1::timestamptz AND o.created_at < $2::timestamptz)
       SELECT count(*)::int AS orders, count(ms)::int AS applied,
              percentile_disc(0.5) WITHIN GROUP (ORDER BY ms) AS p50,
              percentile_disc(0.99) WITHIN GROUP (ORDER BY ms) AS p99,
              max(ms) AS max,
              percentile_disc(0.5) WITHIN GROUP (ORDER BY relay_ms) AS rp50,
              percentile_disc(0.99) WITHIN GROUP (ORDER BY relay_ms) AS rp99
         FROM o`,
      [from, to],
    );
    const r = rows[0]!;
    const n = (x: number | null) => (x === null ? NaN : Number(x));
    return {
      orders: r.orders,
      applied: r.applied,
      p50: n(r.p50),
      p99: n(r.p99),
      max: n(r.max),
      relayP50: n(r.rp50),
      relayP99: n(r.rp99),
    };
  }

  /** Stops every process, deletes the topics and drops the database. */
  async close(): Promise<void> {
    this.cpu.stop();
    await Promise.all(this.children().map((c) => stopChild(c, 'SIGTERM', 15_000)));
    await this.monitor.end().catch(() => undefined);
    const admin = this.kafka.admin();
    await admin.connect().catch(() => undefined);
    await admin
      .deleteTopics({ topics: [this.topic, `${this.topic}.dlq`, ...(this.options.extraTopics ?? [])] })
      .catch(() => undefined);
    await admin.disconnect().catch(() => undefined);
    await this.db.drop().catch(() => undefined);
  }
}

/** One window of steady load: what was offered, achieved, and whether the pipeline kept up. */
export interface Window {
  rate: number;
  seconds: number;
  /** 201 answers per second within the window. */
  achieved: number;
  errors: number;
  shed: number;
  /** Least-squares growth, per second, of the outbox backlog (pending rows). */
  backlogSlope: number;
  /** ... of the consumer lag (orders events published − applied). */
  lagSlope: number;
  /** ... of everything in flight (created − applied). */
  inFlightSlope: number;
  backlogMax: number;
  inFlightMax: number;
  sustainable: boolean;
  /** Why not, in words. */
  verdict: string;
  from: string;
  to: string;
  probes: Probe[];
  cpuFrom: CpuSample;
  cpuTo: CpuSample;
  okDuring: number;
}

/**
 * Runs the load at `rate` for `warmMs` (not measured) then `seconds`, probing every `probeMs`,
 * and decides whether the pipeline kept up: at least 95 % of the offered rate answered 201, no
 * error, nothing shed, and neither the backlog nor the consumer lag growing (least-squares slope
 * of what is in flight at most max(2 % of the rate, 5) events/s). Leaves the load running.
 */
export async function measureWindow(
  p: Pipeline,
  load: LoadGenerator,
  rate: number,
  seconds: number,
  options: { warmMs?: number; probeMs?: number } = {},
): Promise<Window> {
  if (load.currentRate !== rate) load.setRate(rate);
  await sleep(options.warmMs ?? 3_000);
  p.checkAlive();
  await p.rebase();
  const c0 = { ...load.counters };
  const cpuFrom = await p.cpu.sample();
  const first = await p.probe();
  const probes = [first];
  const end = performance.now() + seconds * 1000;
  while (performance.now() < end) {
    await sleep(Math.min(options.probeMs ?? 1_000, Math.max(0, end - performance.now())));
    probes.push(await p.probe());
    p.checkAlive();
  }
  const cpuTo = await p.cpu.sample();
  const last = probes[probes.length - 1]!;
  const c1 = { ...load.counters };
  const dt = (last.at - first.at) / 1000;
  const xs = (f: (q: Probe) => number) => probes.map((q) => ({ x: (q.at - first.at) / 1000, y: f(q) }));
  const backlogSlope = slope(xs((q) => q.pending));
  const lagSlope = slope(xs((q) => q.created - q.pendingOrders - q.applied));
  const inFlightSlope = slope(xs((q) => q.created - q.applied));
  const achieved = (c1.ok - c0.ok) / dt;
  const errors = c1.errors - c0.errors;
  const shed = c1.shed - c0.shed;
  const limit = Math.max(0.02 * rate, 5);
  const reasons: string[] = [];
  if (achieved < 0.95 * rate) reasons.push(`achieved ${f0(achieved)}/s < 95 % of ${rate}/s`);
  if (errors > 0) reasons.push(`${errors} errors`);
  if (shed > 0) reasons.push(`${shed} requests shed`);
  if (!(inFlightSlope <= limit)) reasons.push(`in flight grows ${f1(inFlightSlope)}/s > ${f1(limit)}/s`);
  return {
    rate,
    seconds: dt,
    achieved,
    errors,
    shed,
    backlogSlope,
    lagSlope,
    inFlightSlope,
    backlogMax: Math.max(...probes.map((q) => q.pending)),
    inFlightMax: Math.max(...probes.map((q) => q.created - q.applied)),
    sustainable: reasons.length === 0,
    verdict: reasons.length === 0 ? 'sustained' : reasons.join('; '),
    from: first.dbNow,
    to: last.dbNow,
    probes,
    cpuFrom,
    cpuTo,
    okDuring: c1.ok - c0.ok,
  };
}
