/**
 * Hostile input: for each parser that outboxkit applies to outside input, its worst case at the
 * body limit (1 MiB) over the adversarial inputs of test/helpers/hostile-inputs.ts, and its
 * largest growth from a tenth of the limit to the limit. Times are user CPU time of this process, the
 * fastest of the rounds (see `measure()`); needs no services. The test of the same inputs,
 * test/unit/hostile-input.test.ts, asserts the bounds (growth ≤ 15×, under 250 ms).
 */
import { describeMeasurement, HOSTILE_SUITES, LIMIT, measure, SIZES } from '../test/helpers/hostile-inputs.js';

const ROUNDS = 9;

export async function run(): Promise<string> {
  const last = SIZES.length - 1;
  const lines = [
    `Worst case of each parser at ${LIMIT} bytes (ms of user CPU, fastest of ${ROUNDS} rounds), and the largest growth from ${SIZES[last - 1]} bytes (×, lowest paired ratio of the rounds; a time under 1 ms counts as 1 ms).`,
    '',
    '| parser | inputs | worst at the limit | its input | largest growth | its input |',
    '| --- | ---: | ---: | --- | ---: | --- |',
  ];
  const details: string[] = [];
  for (const suite of HOSTILE_SUITES) {
    let worst = { ms: -1, name: '' };
    let steepest = { growth: -1, name: '' };
    for (const c of suite.cases) {
      const m = measure(c, ROUNDS);
      details.push(`- ${c.attack.name}: ${describeMeasurement(m)}`);
      const ms = m.best[m.stoppedAt === undefined ? last : m.stoppedAt - 1]!;
      if (ms > worst.ms) worst = { ms, name: c.attack.name };
      if (m.growth[last]! > steepest.growth) steepest = { growth: m.growth[last]!, name: c.attack.name };
    }
    lines.push(
      `| ${suite.parser} | ${suite.cases.length} | ${worst.ms.toFixed(1)} ms | ${worst.name} | ×${steepest.growth.toFixed(1)} | ${steepest.name} |`,
    );
  }
  return [...lines, '', '<details><summary>every input</summary>', '', ...details, '', '</details>'].join('\n');
}
