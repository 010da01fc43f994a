/**
 * Options of the chaos harness (`npm run chaos -- --help`), its profiles and their validation.
 */
import { InvalidArgumentError } from 'commander';
import { OUTBOX_SOURCES, type OutboxSource } from '../src/outbox/enqueue.js';
import { FAULT_KINDS, type FaultKind } from './faults.js';

/** A named set of defaults; flags given on the command line override it. */
export interface Profile {
  /**
   * Faults that must be INJECTED (a floor, not a schedule): a fault whose target is down is
   * replaced by another until this many were injected, within the fault phase plus an overrun of
   * {@link OVERRUN_FRACTION} of `seconds`; short of it the run fails (exit 3). The load's own
   * faults (client timeouts, duplicates) come on top.
   */
  faults: number;
  /** Length of the load and fault phase, in seconds (planned; the overrun may extend it). */
  seconds: number;
  /** New logical requests per second. */
  rate: number;
  relays: number;
  consumers: number;
  /** How long the pipeline may take to drain after the faults stop, in ms (`--drain-timeout-ms`). */
  drainTimeoutMs: number;
}

/**
 * `tiny` keeps the harness from rotting (test/e2e/chaos.test.ts), `short` is the CI profile (under
 * 5 minutes, at least 50 faults injected: issue #7), `long` is for a quiet machine before a release
 * (at least 1,000 faults injected, one every 1.3 s on average, about 30 minutes in all). The long
 * profile's load (10/s) and drain (15 min) are those of the recorded 1,000-fault PASS on 2 cores
 * (docs/chaos.md): at 25/s, consumers killed every few seconds could not drain within 180 s there.
 */
export const PROFILES: Readonly<Record<'tiny' | 'short' | 'long', Readonly<Profile>>> = Object.freeze({
  tiny: Object.freeze({ faults: 10, seconds: 25, rate: 10, relays: 2, consumers: 2, drainTimeoutMs: 180_000 }),
  short: Object.freeze({ faults: 60, seconds: 150, rate: 15, relays: 3, consumers: 2, drainTimeoutMs: 180_000 }),
  long: Object.freeze({ faults: 1_000, seconds: 1_300, rate: 10, relays: 3, consumers: 3, drainTimeoutMs: 900_000 }),
});

/**
 * How far the fault phase may run past its plan to reach the floor of injected faults, as a
 * fraction of `seconds` (0.5: a 150 s run may inject faults up to 75 s later than planned).
 */
export const OVERRUN_FRACTION = 0.5;

/**
 * Default of `--drain-stall-ms`, in ms: longer than kafkajs's own recovery can legitimately stay
 * silent. After a broker outage kafkajs restarts a consumer after the failed attempt's retry time,
 * up to its `maxRetryTime` (30 s), and the group then rebalances (session timeout): 30 s of no
 * progress is a recovery in progress, not a lost event, on a loaded machine.
 */
export const DEFAULT_DRAIN_STALL_MS = 90_000;

/**
 * Test-only sabotage of the orders example, to prove that the harness catches a broken guarantee
 * (docs/chaos.md, test/e2e/chaos.test.ts). A sabotaged run must FAIL.
 */
export const SABOTAGE_KINDS = {
  'no-dedup':
    'the shipping consumer deletes its inbox row in its own transaction: redeliveries apply the effect again (G4)',
  'lose-events': 'the orders service marks one event in ten published in its own transaction: never sent to Kafka (G3)',
} as const;

export type SabotageKind = keyof typeof SABOTAGE_KINDS;

export type ProfileName = keyof typeof PROFILES;

/** Everything a run needs, after the profile and the flags were merged. */
export interface ChaosOptions extends Profile {
  profile: ProfileName;
  /**
   * The outbox's source (`--source`): `table`, the table relay (`outboxkit relay`) reading rows the
   * orders service writes with `createOutbox()`; `wal`, the WAL relay (`outboxkit relay --source
   * wal`, one slot of the run's own, one reader and standbys) reading what the orders service
   * writes with `createOutbox({ source: 'wal' })`, on the PostgreSQL at `wal_level=logical`
   * (docs/chaos.md, "WAL mode"). @defaultValue 'table'
   */
  source: OutboxSource;
  /** Seed of the fault schedule and of the load's mix (printed, so that a run can be replayed). */
  seed: number;
  /** PostgreSQL server: the harness creates (and drops) a database `outboxkit_chaos_<pid>` on it. */
  databaseUrl: string | undefined;
  /** Kafka brokers to use instead of a scratch broker of the harness's own (the broker fault is then skipped). */
  brokers: string[] | undefined;
  /**
   * Run on the local 3-node cluster (`OUTBOXKIT_KAFKA_NODES=3`, scripts/services.ts; started if it
   * is not running, left running): topics at replication factor 3, an audit topic at replication
   * factor 1, and the cluster faults instead of `kill-broker`. @defaultValue false
   */
  cluster: boolean;
  /** Keep the database and the topics after the run. */
  keep: boolean;
  /** How long the pipeline may take to drain after the faults stop, in ms. */
  drainTimeoutMs: number;
  /**
   * After the faults, how long the backlog may stay unchanged with every event marked published
   * before the harness stops waiting and checks, in ms (a pipeline that lost events never drains).
   */
  drainStallMs: number;
  /** Print each fault as it is injected. */
  verbose: boolean;
  /**
   * Directory where each service's output is written (`<service>.log`, every start appended, each
   * line prefixed with its time), kept after the run for diagnosis. @defaultValue `.chaos-logs/run-<pid>`,
   *   deleted after a run without violations or unexpected exits
   */
  logDir: string | undefined;
  /** Fault kinds to schedule (`--kinds`); undefined: every kind this run can inject. */
  kinds: FaultKind[] | undefined;
  /** Test-only: guarantees the example breaks on purpose (empty for a real run). */
  sabotage: SabotageKind[];
  /**
   * Which consumer members run with `recordProgress` (partition progress in PostgreSQL): every
   * one, none, or `mixed` (odd-numbered members), so that partitions also move between members of
   * both kinds. @defaultValue 'mixed' ('none' with the `no-dedup` sabotage, which progress would mask)
   */
  recordProgress: RecordProgressMode;
}

/** See {@link ChaosOptions.recordProgress}. */
export const RECORD_PROGRESS_MODES = ['mixed', 'all', 'none'] as const;
export type RecordProgressMode = (typeof RECORD_PROGRESS_MODES)[number];

export function recordProgressMode(value: string): RecordProgressMode {
  if (!(RECORD_PROGRESS_MODES as readonly string[]).includes(value))
    throw new InvalidArgumentError(`Expected one of ${RECORD_PROGRESS_MODES.join(', ')}.`);
  return value as RecordProgressMode;
}

/** Whether consumer member `n` (from 1) runs with `recordProgress` in mode `mode`. */
export function recordsProgress(mode: RecordProgressMode, n: number): boolean {
  return mode === 'all' || (mode === 'mixed' && n % 2 === 1);
}

export function positiveInt(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError('Expected a positive integer.');
  return n;
}

export function seedValue(value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n > 0xffff_ffff) throw new InvalidArgumentError('Expected 0 to 4294967295.');
  return n;
}

/** A comma-separated list of {@link SABOTAGE_KINDS}. */
export function sabotageList(value: string): SabotageKind[] {
  const kinds = value
    .split(',')
    .map((k) => k.trim())
    .filter(Boolean);
  const bad = kinds.find((k) => !(k in SABOTAGE_KINDS));
  if (bad !== undefined || kinds.length === 0)
    throw new InvalidArgumentError(`Expected a comma-separated list of ${Object.keys(SABOTAGE_KINDS).join(', ')}.`);
  return [...new Set(kinds)] as SabotageKind[];
}

/** A comma-separated list of {@link FAULT_KINDS}. */
export function kindList(value: string): FaultKind[] {
  const kinds = value
    .split(',')
    .map((k) => k.trim())
    .filter(Boolean);
  if (kinds.length === 0 || kinds.some((k) => !(k in FAULT_KINDS)))
    throw new InvalidArgumentError(`Expected a comma-separated list of ${Object.keys(FAULT_KINDS).join(', ')}.`);
  return [...new Set(kinds)] as FaultKind[];
}

export function sourceName(value: string): OutboxSource {
  if (!(OUTBOX_SOURCES as readonly string[]).includes(value))
    throw new InvalidArgumentError(`Expected one of ${OUTBOX_SOURCES.join(', ')}.`);
  return value as OutboxSource;
}

export function profileName(value: string): ProfileName {
  if (!(value in PROFILES)) throw new InvalidArgumentError(`Expected one of ${Object.keys(PROFILES).join(', ')}.`);
  return value as ProfileName;
}

/** Merges the profile's defaults with the flags that were given, and checks the combination. */
export function resolveChaosOptions(flags: Partial<ChaosOptions> & { profile?: ProfileName }): ChaosOptions {
  const profile = flags.profile ?? 'short';
  const base = PROFILES[profile];
  const pick = <K extends keyof Profile>(k: K): Profile[K] => flags[k] ?? base[k];
  const options: ChaosOptions = {
    profile,
    source: flags.source ?? 'table',
    faults: pick('faults'),
    seconds: pick('seconds'),
    rate: pick('rate'),
    relays: pick('relays'),
    consumers: pick('consumers'),
    seed: flags.seed ?? Math.floor(Math.random() * 0xffff_ffff),
    databaseUrl: flags.databaseUrl,
    brokers: flags.brokers,
    cluster: flags.cluster ?? false,
    keep: flags.keep ?? false,
    drainTimeoutMs: pick('drainTimeoutMs'),
    drainStallMs: flags.drainStallMs ?? DEFAULT_DRAIN_STALL_MS,
    verbose: flags.verbose ?? false,
    logDir: flags.logDir,
    sabotage: flags.sabotage ?? [],
    kinds: flags.kinds,
    // A member that records partition progress skips a redelivery by its offset, before the inbox:
    // with progress, the no-dedup sabotage shows only when the redelivered event lands on a member
    // without it (the sabotaged self-test failed so about one run in six). Off unless asked for.
    recordProgress: flags.recordProgress ?? (flags.sabotage?.includes('no-dedup') ? 'none' : 'mixed'),
  };
  if (options.relays < 2 || options.relays > 3)
    throw new InvalidArgumentError('--relays must be 2 or 3 (several instances is what the faults test).');
  if (options.consumers > 8) throw new InvalidArgumentError('--consumers must be at most 8.');
  if (options.seconds < 10) throw new InvalidArgumentError('--seconds must be at least 10.');
  if (options.cluster && options.brokers)
    throw new InvalidArgumentError(
      '--cluster and --brokers exclude each other (--cluster uses the local 3-node cluster).',
    );
  if (options.source === 'wal' && options.cluster)
    throw new InvalidArgumentError(
      '--source wal and --cluster exclude each other for now (the cluster audit stream is checked from table rows).',
    );
  if (options.source === 'wal' && options.sabotage.includes('lose-events'))
    throw new InvalidArgumentError(
      '--sabotage lose-events does not apply to --source wal: it marks events published, and the WAL relay ' +
        'publishes what the replication stream brings, whatever the row says afterwards (use no-dedup).',
    );
  return options;
}
