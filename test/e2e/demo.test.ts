/** `npm run demo`, small: the whole pipeline under a faulty load ends with PASS. */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it, inject } from 'vitest';

const run = promisify(execFile);

describe('demo', () => {
  it('passes its invariants with 200 orders', async () => {
    const { stdout } = await run(
      process.execPath,
      ['--import', 'tsx', path.resolve('examples/orders/demo.ts'), '--orders', '200', '--concurrency', '16'],
      {
        env: { ...process.env, DATABASE_URL: inject('databaseUrl'), KAFKA_BROKERS: inject('kafkaBrokers').join(',') },
        timeout: 180_000,
      },
    );
    const lines = stdout.trim().split('\n');
    expect(lines.at(-1)).toBe('PASS');
    expect(stdout).toMatch(/accepted keys\s+200\n/);
    expect(stdout).toMatch(/shipments\s+200\n/);
  }, 200_000);
});
