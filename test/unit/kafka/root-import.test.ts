/**
 * Importing the package root (`outboxkit`: the outbox writer, the idempotency layer) loads no
 * kafkajs: an application that only writes events or keys does not pay for a Kafka client. The
 * Kafka helpers moved to `outboxkit/kafka`; the root's deprecated `ensureTopics` loads kafkajs
 * only when called.
 *
 * Each check runs in a fresh Node.js process (a test worker may have kafkajs loaded already).
 * kafkajs is CommonJS: every one of its files that is loaded, through `import` or `require`,
 * lands in the CommonJS module cache, which the child reads.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);

/** Runs `body` (an ES module) in a child process under tsx and returns what it printed as JSON. */
async function inChild(body: string): Promise<Record<string, unknown>> {
  const script = `
    import { createRequire } from 'node:module';
    const require = createRequire(import.meta.url);
    const kafkajsFiles = () => Object.keys(require.cache).filter((f) => /[\\\\/]node_modules[\\\\/]kafkajs[\\\\/]/.test(f)).length;
    const out = {};
    ${body}
    console.log(JSON.stringify(out));
  `;
  const { stdout } = await run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    cwd: process.cwd(),
  });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as Record<string, unknown>;
}

describe('the package root loads no kafkajs', () => {
  it('importing outboxkit (writer, idempotency keys) loads none of kafkajs; outboxkit/kafka does', async () => {
    const out = await inChild(`
      const root = await import('./src/index.ts');
      out.writer = typeof root.enqueue === 'function' && typeof root.createOutbox === 'function';
      out.idempotency = typeof root.executeIdempotent === 'function';
      out.config = typeof root.resolveKafkaConfig === 'function';
      out.afterRoot = kafkajsFiles();
      await import('./src/kafka/index.ts');
      out.afterKafka = kafkajsFiles();
    `);
    expect(out.writer).toBe(true);
    expect(out.idempotency).toBe(true);
    expect(out.config).toBe(true);
    expect(out.afterRoot).toBe(0);
    // The check sees kafkajs when it is there.
    expect(out.afterKafka).toBeGreaterThan(0);
  }, 30_000);

  it('the deprecated root ensureTopics loads kafkajs when called, and still refuses bad input first', async () => {
    const out = await inChild(`
      const root = await import('./src/index.ts');
      out.beforeCall = kafkajsFiles();
      const err = await root.ensureTopics({}, [{ topic: '..' }]).catch((e) => e);
      out.code = err?.code;
      out.afterCall = kafkajsFiles();
    `);
    expect(out.beforeCall).toBe(0);
    expect(out.code).toBe('OUTBOXKIT_INVALID_OPTIONS');
    expect(out.afterCall).toBeGreaterThan(0);
  }, 30_000);
});
