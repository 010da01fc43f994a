/**
 * The chaos harness's report: what was injected, what the load did, the invariants with the ids of
 * their violations, the dead letters, and a last one-line summary (`CHAOS PASS ...` / `CHAOS FAIL ...`).
 */
import type { CheckResult } from './check.js';
import type { FaultPhaseResult } from './fault-phase.js';
import { FAULT_KINDS, type FaultKind } from './faults.js';
import type { LoadStats } from './load.js';
import type { ChaosOptions } from './options.js';

/** Most ids printed per invariant and dead letters listed (the counts are always complete). */
export const LIST_CAP = 10;

export interface RunFacts {
  options: ChaosOptions;
  /** Scheduled faults by kind: injected, and skipped with their reasons. */
  injected: Map<FaultKind, number>;
  skipped: Map<FaultKind, string[]>;
  /** Crash points: armed, and fired (the process killed itself there). */
  crashPoints: Map<string, { armed: number; fired: number }>;
  /** Exits nobody asked for (not a violation by itself: the supervisor restarted them). */
  unexpectedExits: string[];
  load: LoadStats;
  attempts: number;
  retriedAtEnd: number;
  messages: number;
  faketime: string | undefined;
  elapsedMs: number;
  /** The fault phase: injected against the floor (`options.faults`), replacements, end. */
  phase: FaultPhaseResult;
  /** How long the load actually ran, in s (`seconds`, or more after an overrun). */
  loadSeconds: number;
  /** The kinds this run scheduled (the table lists these); every kind when absent. */
  kinds?: readonly FaultKind[];
  /** `--cluster`: one line per cluster fault (chaos/cluster.ts): downtime, flow before and during. */
  clusterFaults?: readonly string[];
}

function table(rows: [string, string | number][]): string[] {
  const width = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `${k.padEnd(width)}  ${v}`);
}

/** The report as lines; the last one is the summary. */
export function formatReport(facts: RunFacts, result: CheckResult): string[] {
  const o = facts.options;
  const out: string[] = [];
  const injected = [...facts.injected.values()].reduce((a, b) => a + b, 0);
  const skipped = [...facts.skipped.values()].reduce((a, b) => a + b.length, 0);
  const floorMissed = !facts.phase.floorReached;
  out.push('', '── outboxkit chaos report ─────────────────────────────');
  if (o.sabotage.length > 0)
    out.push(`SABOTAGED RUN (test-only: ${o.sabotage.join(', ')}): violations are expected; a PASS would be a defect`);
  out.push(
    `profile ${o.profile}, source ${o.source === 'wal' ? 'wal (WAL relays on one replication slot)' : 'table'}, seed ${o.seed}, ${facts.loadSeconds.toFixed(0)} s of load (planned ${o.seconds}) at ${o.rate}/s, ${o.relays} relays, ${o.consumers} consumers; ${(facts.elapsedMs / 1000).toFixed(0)} s in all`,
  );
  out.push(
    '',
    `faults injected ${injected} (floor ${o.faults}${floorMissed ? ', NOT REACHED' : ', reached'}), tried ${injected + skipped}, skipped ${skipped} (replaced ${facts.phase.replacements}); last fault ended at ${(facts.phase.endedAtMs / 1000).toFixed(0)} s`,
  );
  out.push(
    ...table(
      (facts.kinds ?? (Object.keys(FAULT_KINDS) as FaultKind[])).map((k) => {
        const why = facts.skipped.get(k) ?? [];
        return [
          `  ${k}`,
          `${facts.injected.get(k) ?? 0}${why.length ? `  (skipped ${why.length}: ${[...new Set(why)].join('; ')})` : ''}`,
        ];
      }),
    ),
  );
  if (facts.faketime === undefined)
    out.push('  faketime NOT INSTALLED: clock-skew faults skipped (apt-get install faketime)');
  if (facts.clusterFaults && facts.clusterFaults.length > 0) {
    out.push('cluster faults (orders events marked published per second)');
    for (const line of facts.clusterFaults) out.push(`  ${line}`);
  }
  out.push('crash points (armed / fired)');
  out.push(...table([...facts.crashPoints].map(([p, c]) => [`  ${p}`, `${c.armed} / ${c.fired}`])));
  out.push('client faults (on top of the scheduled ones)');
  out.push(
    ...table([
      ['  first attempt abandoned, retried with the key', facts.load.abandonedFirstAttempts],
      ['  concurrent duplicates (2-3 sends)', facts.load.concurrentDuplicates],
      ['  retry after the answer (must replay)', facts.load.replayChecks],
      ['  key reused with another body (must be 422)', facts.load.reusedKeys],
    ]),
  );
  out.push('');
  out.push(
    ...table([
      [
        'logical requests',
        `${facts.load.operations} (declined ${facts.load.declined}, undeliverable ${facts.load.undeliverable})`,
      ],
      ['HTTP attempts', facts.attempts],
      ['unanswered after the load, retried at the end', facts.retriedAtEnd],
      ['messages in the topic', facts.messages],
      ['dead-lettered events', result.deadLetters.length],
      ['process exits not caused by the harness', facts.unexpectedExits.length],
    ]),
  );
  for (const e of facts.unexpectedExits.slice(0, LIST_CAP)) out.push(`  ${e}`);

  out.push('', 'invariants (violations)');
  for (const inv of result.invariants) {
    out.push(
      `${inv.violations.length === 0 ? 'ok  ' : 'FAIL'}  ${String(inv.violations.length).padStart(4)}  ${inv.title}`,
    );
    for (const line of inv.violations.slice(0, LIST_CAP)) out.push(`              ${line}`);
    if (inv.violations.length > LIST_CAP) out.push(`              … and ${inv.violations.length - LIST_CAP} more`);
  }
  if (result.deadLetters.length > 0) {
    out.push('', 'dead-lettered events (accounted for)');
    for (const d of result.deadLetters.slice(0, LIST_CAP))
      out.push(`  event ${d.eventId} (order ${d.orderId ?? '?'}): ${d.reason}`);
    if (result.deadLetters.length > LIST_CAP) out.push(`  … and ${result.deadLetters.length - LIST_CAP} more`);
  }
  const failed = result.invariants.filter((i) => i.violations.length > 0);
  const floor = floorMissed
    ? `; only ${injected} of the ${o.faults} faults required were injected (the fault floor)`
    : '';
  out.push(
    '',
    result.violations === 0 && !floorMissed
      ? `CHAOS PASS: ${injected} faults injected, ${facts.load.operations} requests, 0 violations (seed ${o.seed})`
      : `CHAOS FAIL: ${injected} faults injected, ${facts.load.operations} requests, ${result.violations} violations${result.violations > 0 ? `: ${failed.map((i) => `${i.id} ${i.violations.length}`).join(', ')}` : ''}${floor} (seed ${o.seed})`,
  );
  return out;
}
