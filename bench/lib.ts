/**
 * Benchmark helpers. These machines are noisy (2 cores shared with PostgreSQL and the broker), so
 * every figure is a ratio against a baseline measured in the same process, interleaved in rounds
 * (A B A B ...) so that drift hits both sides alike; the median ratio of the rounds is reported.
 */

/** Throughput of `op` run by `concurrency` workers for `durationMs`, in operations per second. */
export async function throughput(
  op: (worker: number) => Promise<unknown>,
  durationMs: number,
  concurrency = 1,
): Promise<number> {
  let count = 0;
  const end = performance.now() + durationMs;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async (_, w) => {
      while (performance.now() < end) {
        await op(w);
        count++;
      }
    }),
  );
  return count / ((performance.now() - started) / 1000);
}

export interface Comparison {
  name: string;
  baseline: string;
  /** Median of the per-round ratios candidate / baseline. */
  ratio: number;
  /** Per-round ratios, for the spread. */
  ratios: number[];
  candidateOpsPerSec: number;
  baselineOpsPerSec: number;
}

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** A progress clock of one run of `total` messages: times of the first and the last `tick()`. */
export interface Clock {
  count: number;
  first: number;
  last: number;
  /** Resolves at the `total`-th tick. */
  done: Promise<void>;
  tick(): void;
}

export function clock(total: number): Clock {
  let resolve!: () => void;
  const c: Clock = {
    count: 0,
    first: 0,
    last: 0,
    done: new Promise<void>((r) => (resolve = r)),
    tick() {
      const now = performance.now();
      if (c.count === 0) c.first = now;
      c.count += 1;
      c.last = now;
      if (c.count === total) resolve();
    },
  };
  return c;
}

/** Ticks per second from the first tick to the last (start-up before the first tick excluded). */
export function clockRate(c: Clock): number {
  return (c.count - 1) / ((c.last - c.first) / 1_000);
}

/** `p`, or a rejection naming `what` after `ms`. */
export async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Compares `candidate` with `baseline`: a warm-up of each, then `rounds` interleaved measurements.
 */
export async function compare(
  name: string,
  candidate: (worker: number) => Promise<unknown>,
  baselineName: string,
  baseline: (worker: number) => Promise<unknown>,
  options: { rounds?: number; roundMs?: number; concurrency?: number } = {},
): Promise<Comparison> {
  const rounds = options.rounds ?? 5;
  const roundMs = options.roundMs ?? 2_000;
  const c = options.concurrency ?? 1;
  await throughput(candidate, 500, c);
  await throughput(baseline, 500, c);
  const ratios: number[] = [];
  const cand: number[] = [];
  const base: number[] = [];
  for (let r = 0; r < rounds; r++) {
    // Alternate which side goes first, so neither always runs on a warmer (or more tired) machine.
    const first = r % 2 === 0;
    const a = first ? await throughput(candidate, roundMs, c) : 0;
    const b = await throughput(baseline, roundMs, c);
    const a2 = first ? a : await throughput(candidate, roundMs, c);
    cand.push(a2);
    base.push(b);
    ratios.push(a2 / b);
  }
  return {
    name,
    baseline: baselineName,
    ratio: median(ratios),
    ratios,
    candidateOpsPerSec: median(cand),
    baselineOpsPerSec: median(base),
  };
}

/** One Markdown table row per comparison. */
export function formatComparisons(rows: Comparison[]): string {
  const lines = [
    '| measure | baseline | ratio (median) | rounds | candidate ops/s | baseline ops/s |',
    '| --- | --- | --- | --- | --- | --- |',
  ];
  for (const r of rows) {
    lines.push(
      `| ${r.name} | ${r.baseline} | **${r.ratio.toFixed(3)}** | ${r.ratios.map((x) => x.toFixed(2)).join(' ')} | ${r.candidateOpsPerSec.toFixed(0)} | ${r.baselineOpsPerSec.toFixed(0)} |`,
    );
  }
  return lines.join('\n');
}
