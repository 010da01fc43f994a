/**
 * `outboxkit relay --metrics-host`: the daemon's /metrics, /healthz and /readyz listen on
 * 127.0.0.1 unless the flag or OUTBOXKIT_METRICS_HOST names another IP address (0.0.0.0 in a
 * container), and a value that is not an IP address is a usage error before anything starts.
 */
import { connect } from 'node:net';
import { networkInterfaces } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTestDatabase, type TestDatabase } from '../helpers/db.js';
import { finished, spawnRelay, type Spawned } from '../helpers/processes.js';
import { waitFor } from '../helpers/wait-for.js';

let db: TestDatabase;
beforeAll(async () => {
  db = await createTestDatabase();
});
afterAll(async () => {
  await db?.drop();
});

/** Where the daemon says its endpoints listen (its info log line). */
async function listening(relay: Spawned): Promise<{ host: string; port: number }> {
  const line = await waitFor(
    () =>
      relay.stdout
        .join('')
        .split('\n')
        .find((l) => l.includes('metrics and health endpoints listening')),
    { message: () => `the relay's listen log line (${relay.output.join('').slice(-2000)})` },
  );
  return JSON.parse(line) as { host: string; port: number };
}

function nonLoopbackAddress(): string | undefined {
  return Object.values(networkInterfaces())
    .flat()
    .find((a) => a !== undefined && a.family === 'IPv4' && !a.internal)?.address;
}

function accepts(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port, timeout: 5_000 });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
    socket.once('timeout', () => {
      socket.destroy();
      resolve(false);
    });
  });
}

describe('relay --metrics-host', () => {
  it('listens on 127.0.0.1 by default; OUTBOXKIT_METRICS_HOST=0.0.0.0 opens every interface', async () => {
    const outside = nonLoopbackAddress();
    const local = spawnRelay(db.url, { OUTBOXKIT_METRICS_PORT: '0' }, ['--log-level', 'info']);
    const a = await listening(local);
    expect(a.host).toBe('127.0.0.1');
    expect(await (await fetch(`http://127.0.0.1:${a.port}/healthz`)).text()).toBe('ok\n');
    if (outside !== undefined) expect(await accepts(outside, a.port)).toBe(false);

    const open = spawnRelay(db.url, { OUTBOXKIT_METRICS_PORT: '0', OUTBOXKIT_METRICS_HOST: '0.0.0.0' }, [
      '--log-level',
      'info',
    ]);
    const b = await listening(open);
    expect(b.host).toBe('0.0.0.0');
    if (outside !== undefined) expect(await (await fetch(`http://${outside}:${b.port}/healthz`)).text()).toBe('ok\n');
  });

  it('a value that is not an IP address is a usage error, and --help lists the flag', async () => {
    const r = await finished(spawnRelay(db.url, {}, ['--metrics-host', 'metrics.example.com']));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("option '--metrics-host <address>' argument 'metrics.example.com' is invalid");
    const help = await finished(spawnRelay(db.url, {}, ['--help']));
    expect(help.stdout).toMatch(/--metrics-host <address>[\s\S]*env: OUTBOXKIT_METRICS_HOST/);
    expect(help.stdout).toContain('default: "127.0.0.1"');
  });
});
