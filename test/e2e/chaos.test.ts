/**
 * `npm run chaos`, tiny, three times at once: a clean run must pass, the same in WAL mode
 * (`--source wal`: the WAL relays on one slot, the walsender terminated), and a sabotaged run must fail (a
 * harness that cannot fail is a defect). The clean run: the whole pipeline under 6 faults for 20 s
 * (on the shared broker, so without the broker kill, which the CI's short profile covers), then the
 * report and a zero exit. The sabotaged run (test-only `--sabotage no-dedup,lose-events`): the
 * shipping consumer forgets its inbox rows and the orders service marks one event in ten published
 * without sending it, under consumer faults and crash points; the harness must exit 1 and report
 * both broken guarantees under their own invariants. That the checker reports each broken case with
 * its ids is test/unit/chaos-check.test.ts.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it, inject } from 'vitest';
import { requireWalDatabaseUrl } from '../helpers/wal.js';

const run = promisify(execFile);

/**
 * Runs the harness on the shared services (the WAL server with `--source wal`); resolves with its
 * exit code and output.
 */
async function chaos(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const argv = [
    '--import',
    'tsx',
    path.resolve('chaos/main.ts'),
    ...args,
    '--database-url',
    args.includes('wal') ? await requireWalDatabaseUrl() : inject('databaseUrl'),
    '--brokers',
    inject('kafkaBrokers').join(','),
  ];
  try {
    const { stdout, stderr } = await run(process.execPath, argv, { timeout: 170_000, maxBuffer: 16 * 1024 * 1024 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: unknown; stdout?: string; stderr?: string };
    if (typeof e.code !== 'number') throw err;
    return { code: e.code, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}

/** The number of violations the report gives for an invariant (its title). */
function violations(stdout: string, title: string): number {
  const m = new RegExp(`^(?:ok  |FAIL)\\s+(\\d+)\\s+${title}$`, 'm').exec(stdout);
  if (!m) throw new Error(`no line for "${title}" in the report:\n${stdout.slice(-3_000)}`);
  return Number(m[1]);
}

describe.concurrent('chaos harness', () => {
  it('injects faults, checks every invariant and passes', async () => {
    // A floor of 6 faults in 20 s leaves room on a loaded CI machine (a fault whose target is down is
    // replaced, within the overrun); the CI's short profile holds the 50-fault floor.
    const { code, stdout, stderr } = await chaos([
      '--profile',
      'tiny',
      '--seconds',
      '20',
      '--faults',
      '6',
      '--seed',
      '11',
    ]);
    const lines = stdout.trim().split('\n');
    const summary = /^CHAOS PASS: (\d+) faults injected, (\d+) requests, 0 violations \(seed 11\)$/.exec(lines.at(-1)!);
    expect(summary, `${lines.slice(-40).join('\n')}\nstderr:\n${stderr.slice(-3_000)}`).not.toBeNull();
    expect(code).toBe(0);
    // The floor: every one of the 6 faults was injected (skipped ones replaced).
    expect(Number(summary![1])).toBeGreaterThanOrEqual(6);
    expect(stdout).toMatch(/^faults injected \d+ \(floor 6, reached\)/m);
    expect(Number(summary![2])).toBeGreaterThan(50);
    expect(violations(stdout, 'every committed event published')).toBe(0);
    expect(violations(stdout, 'no effect applied more than once')).toBe(0);
  }, 175_000);

  it('--source wal: drives the WAL relays on one slot, terminates the walsender, and passes', async () => {
    const { code, stdout, stderr } = await chaos([
      '--profile',
      'tiny',
      '--source',
      'wal',
      '--seconds',
      '20',
      '--faults',
      '6',
      '--kinds',
      'kill-relay,pg-terminate-walsender,crash-point,kill-consumer,pg-terminate-relay,kill-orders',
      '--seed',
      '13',
    ]);
    const lines = stdout.trim().split('\n');
    const tail = `${lines.slice(-45).join('\n')}\nstderr:\n${stderr.slice(-3_000)}`;
    expect(lines.at(-1), tail).toMatch(/^CHAOS PASS: \d+ faults injected, \d+ requests, 0 violations \(seed 13\)$/);
    expect(code).toBe(0);
    expect(stdout).toMatch(/^profile tiny, source wal \(WAL relays on one replication slot\)/m);
    // The walsender fault instead of the LISTEN one, the WAL relay's crash points instead of the table relay's.
    expect(stdout).toMatch(/^ {2}pg-terminate-walsender +\d/m);
    expect(stdout).not.toMatch(/pg-terminate-listener|^ {2}relay:/m);
    expect(stdout).toMatch(/^ {2}wal-relay:after-send +\d+ \/ \d+$/m);
    expect(violations(stdout, 'every committed event published')).toBe(0);
    expect(violations(stdout, 'no outbox row left pending after the drain')).toBe(0);
  }, 175_000);

  it('catches broken guarantees: a sabotaged run (no-dedup, lose-events) fails under their invariants', async () => {
    const { code, stdout } = await chaos([
      '--profile',
      'tiny',
      '--seconds',
      '12',
      '--faults',
      '4',
      // Faults that make Kafka redeliver (the sabotaged dedup shows only on a redelivery): the
      // consumer's after-commit crash point is armed twice first, then the relay's after-send.
      '--kinds',
      'crash-point,kill-consumer',
      '--seed',
      '12',
      '--sabotage',
      'no-dedup,lose-events',
      // Lost events are never shipped: stop waiting for them soon.
      '--drain-stall-ms',
      '8000',
      '--verbose',
    ]);
    // The report, and the harness's timeline (each fault, each crash) when an assertion fails.
    const lines = stdout.split('\n');
    const tail = [...lines.filter((l) => l.startsWith('[chaos')).slice(-40), ...lines.slice(-60)].join('\n');
    expect(code, tail).toBe(1);
    expect(stdout).toMatch(/^SABOTAGED RUN \(test-only: no-dedup, lose-events\)/m);
    // lose-events: committed events that never reached Kafka, so never applied either.
    expect(violations(stdout, 'every committed event published'), tail).toBeGreaterThan(0);
    expect(violations(stdout, 'every committed event applied or dead-lettered'), tail).toBeGreaterThan(0);
    // no-dedup: a redelivered event applied a second time.
    expect(violations(stdout, 'no effect applied more than once'), tail).toBeGreaterThan(0);
    expect(stdout.trim().split('\n').at(-1)).toMatch(
      /^CHAOS FAIL: .*committed-unpublished \d+,.*effect-duplicated \d+[^\d].*\(seed 12\)$/,
    );
  }, 175_000);
});
