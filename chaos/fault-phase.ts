/**
 * The fault phase of a chaos run: the seeded plan injected on time, and the floor rule — a fault
 * that could not be injected (its target was down) is replaced by another one drawn from the
 * seed among the kinds that would find a target, until `floor` faults were injected or the
 * phase's deadline (`capMs`) has passed.
 */
import { drawKind, type FaultKind, type PlannedFault } from './faults.js';
import type { Random } from './random.js';

export interface FaultPhaseOptions {
  /** The planned faults, `atMs` in ms from the start of the phase (planFaults()). */
  plan: readonly PlannedFault[];
  /** Faults that must be injected (not only scheduled): the run's `faults`. */
  floor: number;
  /** No fault starts later than this, in ms from the start: the planned window plus the overrun. */
  capMs: number;
  /** Gap before a replacement fault, in ms (the plan's mean spacing). */
  spacingMs: number;
  /** Draws the kinds of the replacements (seeded, apart from the plan's generator). */
  random: Random;
  kinds: readonly FaultKind[];
  /**
   * Whether a fault of this kind would find a target now: replacements are drawn among those
   * kinds (all of `kinds` when none would). @defaultValue every kind
   */
  feasible?: (kind: FaultKind) => boolean;
  /** Injects one fault now (with its own retries); resolves true when it was injected. */
  inject(kind: FaultKind): Promise<boolean>;
  /** Poll period of the scheduler, in ms. @defaultValue 100 */
  tickMs?: number;
}

export interface FaultPhaseResult {
  injected: number;
  /** Faults tried and not injected (each was replaced while the deadline allowed). */
  skipped: number;
  /** Faults drawn beyond the plan to replace skipped ones. */
  replacements: number;
  /** When the last fault ended, in ms from the start. */
  endedAtMs: number;
  /** Whether `floor` faults were injected. */
  floorReached: boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Runs the faults of `plan` on time, whatever the previous ones still do (a graceful restart
 * takes seconds), and tops the schedule up with one replacement per skipped fault, `spacingMs`
 * after the skip, while `injected + running + queued < floor` and the deadline allows. Resolves
 * when every started fault has ended and either the floor is reached or `capMs` has passed.
 */
export async function runFaultPhase(o: FaultPhaseOptions): Promise<FaultPhaseResult> {
  const start = Date.now();
  const elapsed = () => Date.now() - start;
  const queue = [...o.plan].sort((a, b) => a.atMs - b.atMs);
  const running = new Set<Promise<void>>();
  let injected = 0;
  let skipped = 0;
  let replacements = 0;
  let endedAtMs = 0;
  for (;;) {
    const t = elapsed();
    while (queue.length > 0 && queue[0]!.atMs <= t && t < o.capMs) {
      const f = queue.shift()!;
      const p = o
        .inject(f.kind)
        .catch(() => false)
        .then((ok) => {
          if (ok) injected++;
          else skipped++;
          endedAtMs = elapsed();
        })
        .finally(() => running.delete(p));
      running.add(p);
    }
    if (t < o.capMs && injected + running.size + queue.length < o.floor) {
      const feasible = o.feasible === undefined ? o.kinds : o.kinds.filter(o.feasible);
      queue.push({ atMs: t + o.spacingMs, kind: drawKind(o.random, feasible.length > 0 ? feasible : o.kinds) });
      queue.sort((a, b) => a.atMs - b.atMs);
      replacements++;
      continue;
    }
    if (running.size === 0 && (queue.length === 0 || t >= o.capMs)) break;
    await sleep(o.tickMs ?? 100);
  }
  return { injected, skipped, replacements, endedAtMs, floorReached: injected >= o.floor };
}
