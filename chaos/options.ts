/**
 * Options of the chaos harness (`npm run chaos -- --help`), its profiles and their validation.
 */
import { InvalidArgumentError } from 'commander';

/** A named set of defaults; flags given on the command line override it. */
export interface Profile {
  /** Faults scheduled over the run (the load's own faults, client timeouts and duplicates, come on top). */
  faults: number;
  /** Length of the load and fault phase, in seconds. */
  seconds: number;
  /** New logical requests per second. */
  rate: number;
  relays: number;
  consumers: number;
}

/**
 * `tiny` keeps the harness from rotting (test/e2e/chaos.test.ts), `short` is the CI profile (a few
 * minutes, at least 50 faults), `long` is for a quiet machine before a release (docs/chaos.md).
 */
export const PROFILES: Readonly<Record<'tiny' | 'short' | 'long', Readonly<Profile>>> = Object.freeze({
  tiny: Object.freeze({ faults: 10, seconds: 25, rate: 10, relays: 2, consumers: 2 }),
  short: Object.freeze({ faults: 64, seconds: 150, rate: 15, relays: 3, consumers: 2 }),
  long: Object.freeze({ faults: 600, seconds: 1_800, rate: 25, relays: 3, consumers: 3 }),
});

export type ProfileName = keyof typeof PROFILES;

/** Everything a run needs, after the profile and the flags were merged. */
export interface ChaosOptions extends Profile {
  profile: ProfileName;
  /** Seed of the fault schedule and of the load's mix (printed, so that a run can be replayed). */
  seed: number;
  /** PostgreSQL server: the harness creates (and drops) a database `outboxkit_chaos_<pid>` on it. */
  databaseUrl: string | undefined;
  /** Kafka brokers to use instead of a scratch broker of the harness's own (the broker fault is then skipped). */
  brokers: string[] | undefined;
  /** Keep the database and the topics after the run. */
  keep: boolean;
  /** How long the pipeline may take to drain after the faults stop, in ms. */
  drainTimeoutMs: number;
  /** Print each fault as it is injected. */
  verbose: boolean;
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
    faults: pick('faults'),
    seconds: pick('seconds'),
    rate: pick('rate'),
    relays: pick('relays'),
    consumers: pick('consumers'),
    seed: flags.seed ?? Math.floor(Math.random() * 0xffff_ffff),
    databaseUrl: flags.databaseUrl,
    brokers: flags.brokers,
    keep: flags.keep ?? false,
    drainTimeoutMs: flags.drainTimeoutMs ?? 180_000,
    verbose: flags.verbose ?? false,
  };
  if (options.relays < 2 || options.relays > 3)
    throw new InvalidArgumentError('--relays must be 2 or 3 (several instances is what the faults test).');
  if (options.consumers > 8) throw new InvalidArgumentError('--consumers must be at most 8.');
  if (options.seconds < 10) throw new InvalidArgumentError('--seconds must be at least 10.');
  return options;
}
