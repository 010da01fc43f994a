/**
 * outboxkit's runtime loads no drizzle-orm until it is handed a drizzle handle: on Node.js 24 loading
 * `drizzle-orm` and `drizzle-orm/pg-core` takes about 1.2 s (0.19 s on Node.js 20), which every
 * CLI process, relay and application paid at start-up when a module imported drizzle at its top
 * level (src/drizzle-entity.ts). Type-only imports of drizzle-orm are fine: they vanish at run time.
 *
 * Each check runs in a fresh Node.js process (a test worker may have drizzle-orm loaded already),
 * with a module resolve hook that reports every URL resolved to a file of drizzle-orm.
 */
import { execFile } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);

const ROOT = new URL('../../', import.meta.url);

/**
 * Reports each import of a drizzle-orm module from outside drizzle-orm (the URL and the module that
 * asked for it) on the port it is given, and answers the sentinel specifier so that the main thread knows every earlier report
 * has arrived (the messages of one port keep their order).
 */
const HOOK = `
let port;
export function initialize(data) { port = data.port; }
export async function resolve(specifier, context, next) {
  if (specifier === 'outboxkit-lazy-drizzle:sentinel') {
    port.postMessage({ sentinel: true });
    return { url: 'data:text/javascript,', shortCircuit: true };
  }
  const resolved = await next(specifier, context);
  // Only the imports from outside drizzle-orm: drizzle's own files follow from them.
  const drizzle = /[\\\\/]node_modules[\\\\/]drizzle-orm[\\\\/]/;
  if (drizzle.test(resolved.url) && !drizzle.test(context.parentURL ?? '')) {
    port.postMessage({ url: resolved.url, parent: context.parentURL });
  }
  return resolved;
}`;

/** The runtime modules of the package's "exports" (dist/x/y.js → x/y.ts), but `except`. */
function exportedModules(except: string[]): string[] {
  const pkg = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as {
    exports: Record<string, string | { import?: string }>;
  };
  return Object.entries(pkg.exports)
    .filter(([subpath]) => !except.includes(subpath))
    .map(([, target]) => (typeof target === 'string' ? target : target.import))
    .filter((file): file is string => file !== undefined && file.endsWith('.js'))
    .map((file) => file.replace(/^\.\/dist\//, './').replace(/\.js$/, '.ts'));
}

/** The CLI's entry and the command modules it loads on demand. */
function cliModules(): string[] {
  const commands = readdirSync(new URL('cli/commands/', ROOT)).filter((f) => f.endsWith('.ts'));
  return ['./cli/main.ts', ...commands.map((f) => `./cli/commands/${f}`)];
}

interface Loaded {
  /** Each drizzle-orm module imported from outside drizzle-orm, with the module that imported it. */
  drizzle: { url: string; parent: string }[];
  /** What `body` put in `out`. */
  out: Record<string, unknown>;
}

/** Imports `modules` in a child process under tsx, runs `body` (ES module code), and reports. */
async function inChild(modules: string[], body = ''): Promise<Loaded> {
  const script = `
    import { register } from 'node:module';
    import { MessageChannel } from 'node:worker_threads';
    const { port1, port2 } = new MessageChannel();
    const drizzle = [];
    let sentinel;
    const done = new Promise((resolve) => { sentinel = resolve; });
    port1.on('message', (m) => (m.sentinel ? sentinel() : drizzle.push(m)));
    register('data:text/javascript,' + encodeURIComponent(${JSON.stringify(HOOK)}), {
      data: { port: port2 },
      transferList: [port2],
    });
    const out = {};
    for (const m of ${JSON.stringify(modules)}) await import(m);
    ${body}
    await import('outboxkit-lazy-drizzle:sentinel');
    await done;
    port1.close();
    console.log(JSON.stringify({ drizzle, out }));
  `;
  const { stdout } = await run(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    cwd: ROOT,
  });
  return JSON.parse(stdout.trim().split('\n').at(-1)!) as Loaded;
}

describe('outboxkit loads drizzle-orm only when handed a drizzle handle', () => {
  it('the CLI (every command), the package root and every runtime subpath load no drizzle-orm', async () => {
    const modules = [...cliModules(), ...exportedModules(['./schema', './package.json'])];
    // The list is what it should be: the entry points of the runtime are all in it.
    expect(modules).toEqual(
      expect.arrayContaining([
        './cli/main.ts',
        './cli/commands/relay.ts',
        './src/index.ts',
        './relay/index.ts',
        './consumer/index.ts',
      ]),
    );
    const { drizzle } = await inChild(modules);
    expect(drizzle).toEqual([]);
  }, 60_000);

  it('a pg client still joins, and a drizzle-looking transaction is recognised, without drizzle-orm', async () => {
    const { drizzle, out } = await inChild(
      ['./src/index.ts'],
      `
      const { joinTransaction } = await import('./src/index.ts');
      const q = joinTransaction({ query: async () => ({ rows: [{ a: 1 }], rowCount: 1 }), getTransactionStatus: () => 'T' }, 'test');
      out.pg = (await q.query('SELECT 1')).rows;
      // drizzle's protocol only (its entityKind symbol): a top-level database is refused.
      class PgDatabase { static [Symbol.for('drizzle:entityKind')] = 'PgDatabase'; dialect = {}; session = {}; transaction() {} }
      try { joinTransaction(new PgDatabase(), 'test'); } catch (err) { out.database = err.code; }
      // A transaction is joined (drizzle's \`sql\` is loaded at its first statement, not here).
      class PgTransaction extends PgDatabase { static [Symbol.for('drizzle:entityKind')] = 'PgTransaction'; }
      class NodePgTransaction extends PgTransaction { static [Symbol.for('drizzle:entityKind')] = 'NodePgTransaction'; }
      out.transaction = typeof joinTransaction(new NodePgTransaction(), 'test').query;
      `,
    );
    expect(out).toEqual({ pg: [{ a: 1 }], database: 'OUTBOXKIT_NOT_IN_TRANSACTION', transaction: 'function' });
    expect(drizzle).toEqual([]);
  }, 60_000);

  it('the check sees drizzle-orm when it is loaded: outboxkit/schema (drizzle tables) loads it', async () => {
    const { drizzle } = await inChild(['./src/schema.ts']);
    expect(drizzle.map((d) => d.url)).toEqual(
      expect.arrayContaining([expect.stringMatching(/\/drizzle-orm\/index\.js$/)]),
    );
  }, 60_000);
});
