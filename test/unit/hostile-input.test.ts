/**
 * Hostile input: every parser that outboxkit applies to input from outside (the HTTP layer's key
 * and body, the fingerprint, the idempotent client's view of a response, the dedup consumer's view
 * of a Kafka message, the CLI's output) runs in time linear in the input's size. A regular
 * expression or a loop that backtracks over a long run of one character (a run of zeros in a
 * number, of spaces in a key) would let one request of a few hundred KiB block the event loop for
 * seconds (docs/security.md).
 *
 * Each parser gets adversarial inputs (runs of one character, alternations, nesting; listed in
 * test/helpers/hostile-inputs.ts) at sizes from 1 KiB up to the HTTP layer's body limit. Each
 * size's time must stay within 15× the time of the size a tenth of it (quadratic growth gives
 * 100×) and under 250 ms of CPU time, measured as `measure()` says so that a loaded machine slows
 * the test down without making it fail.
 */
import { describe, expect, it } from 'vitest';
import {
  describeMeasurement,
  HOSTILE_SUITES,
  MAX_GROWTH,
  MAX_MS_AT_LIMIT,
  measure,
  SIZES,
} from '../helpers/hostile-inputs.js';

/** Rounds of each measurement. */
const ROUNDS = 9;
/** Wall-clock bound of one case, in ms: generous, since the measure is CPU time and a loaded machine stretches the rest. */
const CASE_TIMEOUT_MS = 60_000;

describe('hostile input: every parser of outside input runs in linear time', () => {
  for (const suite of HOSTILE_SUITES) {
    describe(suite.parser, () => {
      it.each(suite.cases.map((c) => ({ name: c.attack.name, c })))(
        '$name',
        ({ c }) => {
          const m = measure(c, ROUNDS);
          const shown = `${c.attack.name}: ${describeMeasurement(m)}`;
          expect(m.stoppedAt, `grows faster than linearly (${shown})`).toBeUndefined();
          for (let i = 0; i < SIZES.length; i++) {
            expect(m.best[i], shown).toBeLessThan(MAX_MS_AT_LIMIT);
            if (i > 0) expect(m.growth[i], `grows faster than linearly (${shown})`).toBeLessThanOrEqual(MAX_GROWTH);
          }
        },
        CASE_TIMEOUT_MS,
      );
    });
  }
});
