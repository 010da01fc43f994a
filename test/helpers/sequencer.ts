/**
 * The order in which `npm test` starts its files (vitest.config.ts, `sequence.sequencer`): vitest's
 * own, except that the files listed in {@link LONG_FILES} start first within their group.
 *
 * vitest queues every file of the `integration` project before any of the `unit` project (it sorts
 * projects by name), and without cached durations (a fresh clone, as in CI) by file size within a
 * project. test/unit/hostile-input.test.ts is a small file that runs for about two minutes of one
 * core's CPU time, so in CI it started near the very end of the queue, and the other worker, with
 * nothing left to take, sat idle beside it for most of that time, in each of the two passes. Started
 * first, it runs beside the integration files instead. The order changes nothing a test checks: each
 * file still runs in a process of its own, two files at a time.
 */
/* eslint import-x/no-cycle: "off" -- following vitest/node's own imports, the rule loads node_modules/vitest/node.js as a resolver and throws; nothing here imports the repository's modules */
import path from 'node:path';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * Files (relative to the repository's root) that take far longer than the others: started first,
 * longest first. A file missing here only runs where vitest's order puts it.
 */
export const LONG_FILES: readonly string[] = ['test/unit/hostile-input.test.ts'];

export class LongFilesFirstSequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const root = this.ctx.config.root;
    const rank = (spec: TestSpecification): number => {
      const i = LONG_FILES.indexOf(path.relative(root, spec.moduleId).split(path.sep).join('/'));
      return i === -1 ? LONG_FILES.length : i;
    };
    // Array.prototype.sort is stable: everything else keeps vitest's order, and no file leaves its
    // group (sequence.groupOrder: the `alone` and `cluster` projects still run after the others).
    return sorted.sort(
      (a, b) => a.project.config.sequence.groupOrder - b.project.config.sequence.groupOrder || rank(a) - rank(b),
    );
  }
}
