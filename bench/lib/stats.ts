/**
 * Small statistics for benchmark samples: nearest-rank percentiles on a sorted copy, medians of
 * repetitions, ratios that stay finite (a zero denominator reports Infinity, printed as "∞").
 */

export interface Summary {
  n: number;
  mean: number;
  p50: number;
  p90: number;
  p99: number;
  min: number;
  max: number;
}

/** Nearest-rank percentile of an ascending array (q in 0..1). */
export function percentileSorted(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil(q * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))] as number;
}

export function summarize(samples: readonly number[]): Summary {
  const s = [...samples].sort((a, b) => a - b);
  const n = s.length;
  return {
    n,
    mean: n === 0 ? Number.NaN : s.reduce((a, b) => a + b, 0) / n,
    p50: percentileSorted(s, 0.5),
    p90: percentileSorted(s, 0.9),
    p99: percentileSorted(s, 0.99),
    min: n === 0 ? Number.NaN : (s[0] as number),
    max: n === 0 ? Number.NaN : (s[n - 1] as number),
  };
}

export function median(xs: readonly number[]): number {
  const s = [...xs].filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const m = s.length >> 1;
  return s.length % 2 === 1 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** The median of each field over repetitions of the same summary. */
export function medianSummary(reps: readonly Summary[]): Summary {
  const f = (k: keyof Summary): number => median(reps.map((r) => r[k]));
  return { n: reps.reduce((a, r) => a + r.n, 0), mean: f('mean'), p50: f('p50'), p90: f('p90'), p99: f('p99'), min: f('min'), max: f('max') };
}

/** old / new; Infinity when new is 0 and old is not, 1 when both are 0. */
export function ratio(oldValue: number, newValue: number): number {
  if (newValue === 0) return oldValue === 0 ? 1 : Number.POSITIVE_INFINITY;
  return oldValue / newValue;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Monotonic milliseconds (same origin for every caller in one process). */
export function nowMs(): number {
  return performance.now();
}
