/**
 * outboxkit's event path without `@opentelemetry/api`: a real child process in which resolving
 * the package fails (as when it is not installed or not resolvable from outboxkit) prepares events
 * and runs a handler exactly as without tracing. The in-process loader test (loader.test.ts) injects the failing resolver instead.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

// Preloaded CommonJS: every require/resolve of @opentelemetry/api fails with MODULE_NOT_FOUND
// (createRequire goes through Module._resolveFilename), and an ESM resolve hook makes a static or
// dynamic import of it fail with ERR_MODULE_NOT_FOUND.
const ESM_HOOK = `export async function resolve(specifier, context, next) {
  if (specifier === '@opentelemetry/api' || specifier.startsWith('@opentelemetry/api/')) {
    throw Object.assign(new Error('Cannot find package ' + specifier), { code: 'ERR_MODULE_NOT_FOUND' });
  }
  return next(specifier, context);
}`;
const HIDE_OTEL = `
const Module = require('node:module');
Module.register('data:text/javascript,' + encodeURIComponent(${JSON.stringify(ESM_HOOK)}));
const resolve = Module._resolveFilename;
Module._resolveFilename = function (request, ...rest) {
  if (request === '@opentelemetry/api' || request.startsWith('@opentelemetry/api/')) {
    throw Object.assign(new Error("Cannot find module '" + request + "'"), { code: 'MODULE_NOT_FOUND' });
  }
  return resolve.call(this, request, ...rest);
};`;

// The modules of the event path only. outboxkit's entry points cannot be loaded here: they load
// prom-client, whose 15.x releases require @opentelemetry/api themselves (a hard dependency, so an
// npm install always has it; a strict pnpm layout may not let outboxkit resolve it).
const SCRIPT = `
import { loadOpenTelemetry, activeContextHeaders } from './src/tracing.ts';
import { prepareEvent } from './src/outbox/event.ts';
import { toConsumedEvent } from './consumer/consumed-event.ts';
import { runHandler } from './consumer/tracing.ts';
import { createRequire } from 'node:module';
let hidden = false;
try { createRequire(import.meta.url)('@opentelemetry/api'); } catch { hidden = await import('@opentelemetry/api').then(() => false, () => true); }
const event = toConsumedEvent('t', 0, { key: null, value: Buffer.from('{"a":1}'), timestamp: '0', attributes: 0, offset: '0', headers: {} },
  '0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b', { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' });
let decoded;
await runHandler(async ({ event }) => { decoded = await event.decoded(); }, { tx: {}, event, signal: new AbortController().signal, attempt: 1 },
  { groupId: 'g', decode: undefined, tracing: true });
const prepared = prepareEvent({ topic: 't', key: 'k', type: 'x', payload: { a: 1 } }, 100);
console.log(JSON.stringify({ hidden, otel: loadOpenTelemetry() === undefined ? 'absent' : 'loaded', headers: activeContextHeaders() ?? null, decoded, stored: prepared.headers }));
`;

describe('without @opentelemetry/api', () => {
  it('prepares events and runs handlers; the loader reports it absent', () => {
    const dir = mkdtempSync(join(tmpdir(), 'outboxkit-no-otel-'));
    const preload = join(dir, 'hide-otel.cjs');
    writeFileSync(preload, HIDE_OTEL);
    let child;
    try {
      child = spawnSync(
        process.execPath,
        ['--require', preload, '--import', 'tsx', '--input-type=module', '-e', SCRIPT],
        { cwd: ROOT, encoding: 'utf8', timeout: 30_000 },
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
    expect(child.stderr).toBe('');
    expect(JSON.parse(child.stdout.trim())).toEqual({
      hidden: true,
      otel: 'absent',
      headers: null,
      decoded: { a: 1 },
      stored: {},
    });
  });
});
