/**
 * Child processes for crash tests: real processes killed with SIGKILL, not functions. Every
 * process a test starts is killed by afterEach here.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { afterEach, inject } from 'vitest';

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

/** Runs `outboxkit <args>` from the sources (tsx) with extra environment. */
export function spawnCli(args: string[], env: Record<string, string> = {}): Spawned {
  const proc = spawn(process.execPath, ['--import', 'tsx', path.resolve('cli/main.ts'), ...args], {
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

/** Starts a relay daemon process on `url` with fast test timings. */
export function spawnRelay(url: string, env: Record<string, string> = {}, extraArgs: string[] = []): Spawned {
  return spawnCli(
    [
      'relay',
      '--database-url',
      url,
      '--lease-ms',
      '2000',
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
