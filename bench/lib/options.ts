/** What every scenario gets from run-all: quick mode (BENCH_QUICK=1), repetitions, a logger. */
export interface BenchOptions {
  quick: boolean;
  /** Repetitions of each measurement (medians are reported). */
  reps: number;
  log(line: string): void;
}

export function benchOptions(env: NodeJS.ProcessEnv = process.env): BenchOptions {
  const quick = env.BENCH_QUICK === '1' || env.BENCH_QUICK === 'true';
  const reps = Number(env.BENCH_REPS ?? (quick ? 1 : 3));
  return {
    quick,
    reps: Number.isInteger(reps) && reps > 0 ? reps : quick ? 1 : 3,
    log: (line) => process.stderr.write(`  · ${line}\n`),
  };
}

/** A duration that shrinks in quick mode. */
export function dur(o: BenchOptions, fullMs: number, quickMs: number): number {
  return o.quick ? quickMs : fullMs;
}
