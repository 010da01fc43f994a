/**
 * A JavaScript copy of the sources for the CLI processes the tests start (test/helpers/processes.ts
 * spawnCli): each `node --import tsx cli/main.ts` paid about 1 s of tsx's start-up before the CLI's
 * own (0.9 s against 1.9 s here, quiet; 2-4 s on a loaded CI machine), and the suite starts about
 * 200 of them. esbuild turns the sources into JavaScript file by file, as tsx does at run time (no
 * bundling, no type check: `npm run typecheck` does that), in about a second, at the start of each
 * run: the processes always run the sources of the run, never an older `npm run build`.
 *
 * The copy is written to `.test-build-<pid>/` at the repository's root, two levels above its
 * files as dist/ is, so that the code's paths to the migrations and package.json hold, and its
 * packages resolve from the repository's node_modules.
 */
import { readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { build } from 'esbuild';

/** The folders the CLI's code comes from (tsconfig.build.json's `include`). */
const SOURCES = ['src', 'relay', 'consumer', 'cli'];

function typescriptFiles(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))
    .map((f) => path.join(dir, f));
}

export interface CliBuild {
  /** The built cli/main.js, to run as `node <entry> <args>`. */
  entry: string;
  /** Removes the copy. */
  remove(): void;
}

/** Writes the copy under `root` (the repository) and returns its entry. */
export async function buildCli(root: string): Promise<CliBuild> {
  const outdir = path.join(root, `.test-build-${process.pid}`);
  rmSync(outdir, { recursive: true, force: true });
  await build({
    entryPoints: SOURCES.flatMap((dir) => typescriptFiles(path.join(root, dir))),
    outdir,
    outbase: root,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    logLevel: 'warning',
  });
  return {
    entry: path.join(outdir, 'cli', 'main.js'),
    remove: () => rmSync(outdir, { recursive: true, force: true }),
  };
}
