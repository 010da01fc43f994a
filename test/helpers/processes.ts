/**
 * Child processes for crash tests: real processes killed with SIGKILL, not functions. Every
 * process a test starts is killed by afterEach here.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { afterEach, expect, inject } from 'vitest';

const children = new Set<ChildProcess>();

afterEach(async () => {
  const left = [...children];
  children.clear();
  await Promise.all(left.map((c) => kill(c, 'SIGKILL')));
});

export interface Spawned {
  proc: ChildProcess;
  /** stdout and stderr, interleaved (for error messages). */
  output: string[];
  /** stdout alone (for output a test parses: runtime warnings go to stderr). */
  stdout: string[];
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * Runs `outboxkit <args>` with extra environment: the JavaScript copy of this run's sources that
 * test/global-setup.ts built (test/helpers/cli-build.ts), or the sources through tsx in a project
 * without that setup (the cluster's).
 */
export function spawnCli(args: string[], env: Record<string, string> = {}): Spawned {
  const built = inject('cliEntry');
  const entry = built ? [built] : ['--import', 'tsx', path.resolve('cli/main.ts')];
  const proc = spawn(process.execPath, [...entry, ...args], {
    env: { ...process.env, KAFKA_BROKERS: inject('kafkaBrokers').join(','), OUTBOXKIT_METRICS_PORT: '-1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(proc);
  const output: string[] = [];
  const stdout: string[] = [];
  proc.stdout!.on('data', (d: Buffer) => {
    output.push(d.toString());
    stdout.push(d.toString());
  });
  proc.stderr!.on('data', (d: Buffer) => output.push(d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.once('exit', (code, signal) => {
      children.delete(proc);
      resolve({ code, signal });
    }),
  );
  return { proc, output, stdout, exited };
}

/**
 * Starts a relay daemon process on `url` with fast test timings: a 2 s lease and a 1.5 s broker
 * timeout (below the lease, as the relay requires), as `startRelay()` (test/helpers/relay.ts).
 */
export function spawnRelay(url: string, env: Record<string, string> = {}, extraArgs: string[] = []): Spawned {
  return spawnCli(
    [
      'relay',
      '--database-url',
      url,
      '--lease-ms',
      '2000',
      '--broker-timeout-ms',
      '1500',
      '--poll-interval-ms',
      '100',
      '--log-level',
      'warn',
      ...extraArgs,
    ],
    env,
  );
}

export async function kill(proc: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const done = new Promise((r) => proc.once('exit', r));
  proc.kill(signal);
  await done;
}

/** A finished CLI run: exit code, stdout, and stderr apart. */
export interface Finished {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Waits for `s` to exit and splits its output into stdout and stderr. */
export async function finished(s: Spawned): Promise<Finished> {
  const { code } = await s.exited;
  const stdout = s.stdout.join('');
  // output interleaves stdout and stderr; stderr is what is not stdout.
  return { code, stdout, stderr: s.output.join('').replace(stdout, '') };
}

/** The one JSON error line of a `--json` run (asserted to be the only line on stderr). */
export function jsonError(r: Finished): { code: string; message: string } {
  const lines = r.stderr.split('\n').filter((l) => l !== '');
  expect(lines, r.stderr).toHaveLength(1);
  return (JSON.parse(lines[0]!) as { error: { code: string; message: string } }).error;
}
