/**
 * The process supervisor of the chaos harness: it runs the pipeline's services (the orders
 * service, the relays, the consumer group members), restarts the ones that die while they are
 * wanted, and restarts one with a crash point armed or under a skewed clock when a fault asks.
 */
import fs from 'node:fs';
import path from 'node:path';
import { SCRIPTS, hasExited, startChild, stopChild, type Child } from '../examples/orders/processes.js';
import type { Random } from './random.js';

export type Role = 'orders' | 'relay' | 'consumer';

/** A crash point to arm at the next start (src/crash-point.ts). */
export interface Arming {
  point: string;
  /** Crash at this arrival (`OUTBOXKIT_CRASH_AFTER`). */
  after: number;
}

/** One supervised service. */
export interface Service {
  name: string;
  role: Role;
  /** Whether the supervisor keeps it running (false after a graceful leave). */
  wanted: boolean;
  child: Child | undefined;
  /** How often it was started. */
  starts: number;
  /** Armed at its current start, if any. */
  arming: Arming | undefined;
  /** When the current process was started (Date.now() ms). */
  startedAt: number;
  /** When the current process said it was ready ({@link READY_LINES}), or undefined. */
  readyAt: number | undefined;
  /** faketime offset of its current start (`+30s`, `-90s`), if any. */
  skew: string | undefined;
  /** Set while the harness itself stops or kills it (so the exit is not counted as a crash point). */
  stopping: boolean;
}

/** What the supervisor tells the harness. */
export interface SupervisorEvents {
  /** An armed crash point fired: the process killed itself with SIGKILL. */
  crashPointFired(service: Service, arming: Arming): void;
  /** A process died without being asked to (anything but a fired crash point). */
  unexpectedExit(service: Service, code: number | null, signal: NodeJS.Signals | null, tail: string[]): void;
  log(message: string): void;
}

export interface SupervisorOptions {
  /** Environment shared by every service (DATABASE_URL, KAFKA_BROKERS, topic, group...). */
  env: Record<string, string>;
  relayArgs: string[];
  /** Environment of one service on top of `env` (per-member settings), if any. */
  envOf?: (s: Service) => Record<string, string>;
  random: Random;
  events: SupervisorEvents;
  /** libfaketime's preload library, or undefined when faketime is not installed. */
  faketimeLibrary: string | undefined;
  /**
   * How long a process with a crash point armed is kept from other faults, in ms from the moment
   * it said it was ready (from its start if it never did, plus {@link STARTUP_ALLOWANCE_MS}): long
   * enough for the point to be reached, short enough that a point that is never reached (a relay
   * without lanes) does not shield the process for the rest of the run. @defaultValue 20_000
   */
  armTimeoutMs?: number;
  /**
   * Directory for each service's output (`<service>.log`, appended at every start, each line
   * prefixed with its ISO time); undefined: output is only kept in memory (the last 100 lines).
   */
  logDir?: string;
}

/** Where Debian's `faketime` package puts its preload library. */
export function findFaketimeLibrary(): string | undefined {
  const onPath = (process.env.PATH ?? '')
    .split(path.delimiter)
    .some((dir) => dir !== '' && fs.existsSync(path.join(dir, 'faketime')));
  if (!onPath) return undefined;
  const candidates = ['/usr/lib/faketime/libfaketime.so.1'];
  try {
    for (const dir of fs.readdirSync('/usr/lib')) candidates.push(`/usr/lib/${dir}/faketime/libfaketime.so.1`);
  } catch {
    // no /usr/lib: not Debian-like
  }
  return candidates.find((file) => fs.existsSync(file));
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The lines each role prints once it serves (the relay's at log level info): a table relay's
 * `relay started`; a WAL relay's `WAL relay started` when it reads the slot, or `standing by`
 * when another relay does (a standby serves its role: it takes over when the reader is gone).
 */
export const READY_LINES: Readonly<Record<Role, readonly string[]>> = Object.freeze({
  orders: ['ORDERS_LISTENING'],
  consumer: ['SHIPPING_READY'],
  relay: ['relay started', 'standing by'],
});

/** How long a process may take to say it is ready before its arming's timeout counts anyway, in ms. */
export const STARTUP_ALLOWANCE_MS = 60_000;

export class Supervisor {
  readonly services = new Map<string, Service>();
  private closed = false;
  private readonly logs = new Map<string, fs.WriteStream>();

  constructor(private readonly o: SupervisorOptions) {}

  /** Whether clock skew is possible (libfaketime found). */
  get faketime(): boolean {
    return this.o.faketimeLibrary !== undefined;
  }

  /** Declares a service (not started). */
  add(name: string, role: Role, wanted = true): Service {
    const s: Service = {
      name,
      role,
      wanted,
      child: undefined,
      starts: 0,
      arming: undefined,
      startedAt: 0,
      readyAt: undefined,
      skew: undefined,
      stopping: false,
    };
    this.services.set(name, s);
    return s;
  }

  byRole(role: Role): Service[] {
    return [...this.services.values()].filter((s) => s.role === role);
  }

  /** Whether the service's process is running. */
  isUp(s: Service): boolean {
    return s.child !== undefined && !hasExited(s.child);
  }

  /**
   * Whether the service has a crash point armed that has not fired yet, and has been ready for
   * less than `armTimeoutMs`: the faults leave such a process alone, so that the point gets its
   * chance (a restart takes seconds, more on a loaded machine: the time counts from readiness).
   */
  isProtected(s: Service): boolean {
    if (s.arming === undefined) return false;
    const since = s.readyAt ?? s.startedAt + STARTUP_ALLOWANCE_MS;
    return Date.now() - since < (this.o.armTimeoutMs ?? 20_000);
  }

  /** Starts the service's process (with its arming and skew, if set). */
  start(s: Service): void {
    if (this.closed || this.isUp(s)) return;
    s.starts++;
    const env: Record<string, string> = {
      ...this.o.env,
      ...this.o.envOf?.(s),
      // The harness finds each process's backends by application_name (pg_terminate_backend).
      PGAPPNAME: `chaos-${s.name}`,
    };
    if (s.arming) {
      env.OUTBOXKIT_CRASH_POINT = s.arming.point;
      env.OUTBOXKIT_CRASH_AFTER = String(s.arming.after);
    }
    if (s.skew !== undefined && this.o.faketimeLibrary !== undefined) {
      // What the faketime command does, without its fork: the pid stays the service's own.
      env.LD_PRELOAD = this.o.faketimeLibrary;
      env.FAKETIME = s.skew;
    }
    const script = s.role === 'orders' ? SCRIPTS.orders : s.role === 'consumer' ? SCRIPTS.shipping : SCRIPTS.cli;
    const args = s.role === 'relay' ? [...this.o.relayArgs, '--relay-id', `${s.name}-${s.starts}`] : [];
    s.startedAt = Date.now();
    s.readyAt = undefined;
    const ready = READY_LINES[s.role];
    const logFile = this.logFile(s);
    logFile?.write(
      `${new Date().toISOString()} === start #${s.starts}${s.arming ? ` armed ${s.arming.point}@${s.arming.after}` : ''}${s.skew ? ` skew ${s.skew}` : ''}\n`,
    );
    const child = startChild(s.name, script, args, env, 100, (line) => {
      logFile?.write(`${new Date().toISOString()} ${line}\n`);
      if (s.readyAt === undefined && s.child === child && ready.some((r) => line.includes(r))) s.readyAt = Date.now();
    });
    s.child = child;
    child.proc.once('exit', (code, signal) => void this.onExit(s, child, code, signal));
  }

  private logFile(s: Service): fs.WriteStream | undefined {
    if (this.o.logDir === undefined) return undefined;
    let file = this.logs.get(s.name);
    if (!file) {
      fs.mkdirSync(this.o.logDir, { recursive: true });
      file = fs.createWriteStream(path.join(this.o.logDir, `${s.name}.log`), { flags: 'a' });
      file.on('error', () => undefined);
      this.logs.set(s.name, file);
    }
    return file;
  }

  private async onExit(s: Service, child: Child, code: number | null, signal: NodeJS.Signals | null): Promise<void> {
    this.logs.get(s.name)?.write(`${new Date().toISOString()} === exit code ${code} signal ${signal}\n`);
    if (s.child !== child) return;
    const arming = s.arming;
    if (!s.stopping) {
      if (arming && signal === 'SIGKILL') this.o.events.crashPointFired(s, arming);
      else this.o.events.unexpectedExit(s, code, signal, child.lines.slice(-15));
    }
    s.arming = undefined;
    s.stopping = false;
    if (!s.wanted || this.closed) return;
    // A restart after a short, random pause, as an orchestrator would do.
    await sleep(this.o.random.int(200, 1_500));
    if (s.child === child && s.wanted && !this.closed) this.start(s);
  }

  /** SIGKILL (a crash); the supervisor restarts it. */
  kill(s: Service): boolean {
    if (!this.isUp(s)) return false;
    s.stopping = true;
    s.child!.proc.kill('SIGKILL');
    return true;
  }

  /**
   * Stops the service gracefully (SIGTERM, SIGKILL after `timeoutMs`) and, unless `leave`, starts
   * it again at once with `next` (arming, skew). Resolves when it is started again (or stopped).
   */
  async restart(s: Service, next: { arming?: Arming; skew?: string | undefined }, leave = false): Promise<void> {
    const child = s.child;
    if (leave) s.wanted = false;
    if (child && !hasExited(child)) {
      s.stopping = true;
      await stopChild(child, 5_000);
    }
    if (leave) return;
    s.arming = next.arming;
    if ('skew' in next) s.skew = next.skew;
    s.wanted = true;
    s.child = undefined;
    this.start(s);
  }

  /** Disarms every crash point for the next starts (the end of the fault phase). */
  disarm(): void {
    for (const s of this.services.values()) if (!this.isUp(s)) s.arming = undefined;
  }

  /** Stops everything (SIGTERM, SIGKILL after `timeoutMs`) and restarts nothing. */
  async close(timeoutMs = 10_000): Promise<void> {
    this.closed = true;
    await Promise.all(
      [...this.services.values()].map(async (s) => {
        const child = s.child;
        if (!child || hasExited(child)) return;
        s.stopping = true;
        await stopChild(child, timeoutMs);
      }),
    );
    await Promise.all([...this.logs.values()].map((f) => new Promise((r) => f.end(r))));
    this.logs.clear();
  }
}
