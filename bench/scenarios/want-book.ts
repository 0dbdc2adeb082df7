/**
 * The want-book micro-benchmark (bench/want-book.bench.ts, reused as it is), repeated: medians
 * over the repetitions. There is no "old" side: the old transport had no line to keep.
 */
import { runWantBookBench, type WantBookBenchResult } from '../want-book.bench.js';
import type { BenchOptions } from '../lib/options.js';
import { median } from '../lib/stats.js';

export interface WantBookScenarioResult {
  reps: WantBookBenchResult[];
  median: WantBookBenchResult;
}

export function runWantBook(o: BenchOptions): WantBookScenarioResult {
  const reps: WantBookBenchResult[] = [];
  for (let r = 0; r < o.reps; r++) reps.push(runWantBookBench(o.quick ? { positionSamples: 2_000 } : {}));
  const first = reps[0] as WantBookBenchResult;
  const m = (k: keyof WantBookBenchResult): number => median(reps.map((x) => x[k] as number));
  const med: WantBookBenchResult = {
    ...first,
    parkPerSec: m('parkPerSec'),
    removePerSec: m('removePerSec'),
    grantsPerSec: m('grantsPerSec'),
    serviceGrantsPerSec: m('serviceGrantsPerSec'),
    positionMeanUs: m('positionMeanUs'),
    positionP99Us: m('positionP99Us'),
    bookBytesPerWant: m('bookBytesPerWant'),
    totalBytesPerWant: m('totalBytesPerWant'),
  };
  o.log(`want-book: ${Math.round(med.grantsPerSec).toLocaleString('en-US')} grants/s, position ${med.positionMeanUs.toFixed(2)} µs, ${med.totalBytesPerWant.toFixed(0)} B/want`);
  return { reps, median: med };
}
