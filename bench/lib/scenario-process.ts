/**
 * Runs a scenario in a fresh process, so that it measures its own workload and not what the
 * scenarios before it left in the process: after the gateway-requests scenario, the old client's
 * CPU per GB streamed was 1.5-2.4x what it is in a fresh process (same throughput; JIT and heap
 * state; measured in bench/README.md, "Processes").
 * Logging goes to the same stderr; the result comes back over IPC as a structured clone
 * (NaN stays NaN).
 */
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { ScenarioName } from '../scenarios/index.js';
import type { BenchOptions } from './options.js';

const CHILD = fileURLToPath(new URL('./scenario-child.ts', import.meta.url));

type ChildAnswer = { ok: true; value: unknown } | { ok: false; error: string };

/** `o`'s quick mode and repetitions reach the child through its environment (benchOptions()). */
export function runInFreshProcess<T>(name: ScenarioName, o: Pick<BenchOptions, 'quick' | 'reps'>): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const child = fork(CHILD, [name], {
      execArgv: ['--expose-gc', '--import', 'tsx'],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      serialization: 'advanced',
      env: { ...process.env, BENCH_QUICK: o.quick ? '1' : '0', BENCH_REPS: String(o.reps) },
    });
    let answer: ChildAnswer | null = null;
    child.on('message', (m) => {
      answer = m as ChildAnswer;
    });
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      const a = answer as ChildAnswer | null;
      if (a === null) reject(new Error(`scenario ${name}: its process exited (${signal ?? code}) without a result`));
      else if (a.ok) resolve(a.value as T);
      else reject(new Error(`scenario ${name} failed in its process:\n${a.error}`));
    });
  });
}
