/**
 * `npm run chaos`, tiny: keeps the harness from rotting. The whole pipeline under 8 faults for 15 s
 * (on the shared broker, so without the broker kill, which the CI's short profile covers), then
 * the report and a zero exit. That the checker can fail is test/unit/chaos-check.test.ts.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it, inject } from 'vitest';

const run = promisify(execFile);

describe('chaos harness', () => {
  it('injects faults, checks every invariant and passes', async () => {
    const { stdout } = await run(
      process.execPath,
      [
        '--import',
        'tsx',
        path.resolve('chaos/main.ts'),
        '--profile',
        'tiny',
        '--seconds',
        '15',
        '--faults',
        '8',
        '--seed',
        '11',
        '--database-url',
        inject('databaseUrl'),
        '--brokers',
        inject('kafkaBrokers').join(','),
      ],
      { timeout: 150_000 },
    );
    const lines = stdout.trim().split('\n');
    const summary = /^CHAOS PASS: (\d+) faults injected, (\d+) requests, 0 violations \(seed 11\)$/.exec(lines.at(-1)!);
    expect(summary, lines.slice(-30).join('\n')).not.toBeNull();
    expect(Number(summary![1])).toBeGreaterThanOrEqual(6);
    expect(Number(summary![2])).toBeGreaterThan(50);
    expect(stdout).toMatch(/^faults scheduled 8,/m);
    expect(stdout).toMatch(/^ok\s+0\s+every committed event published$/m);
    expect(stdout).toMatch(/^ok\s+0\s+no effect applied more than once$/m);
  }, 170_000);
});
