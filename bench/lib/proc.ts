/** CPU time of processes from /proc (Linux), for "CPU seconds per unit of work" figures. */
import { readFileSync } from 'node:fs';

const TICKS_PER_SEC = 100; // USER_HZ on Linux

/** utime + stime (+ cutime + cstime: children waited for, such as a finished `cat`), seconds. */
export function cpuSeconds(pid: number, withChildren = true): number {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
    const own = Number(f[11]) + Number(f[12]);
    const kids = withChildren ? Number(f[13]) + Number(f[14]) : 0;
    return (own + kids) / TICKS_PER_SEC;
  } catch {
    return Number.NaN;
  }
}

export function cpuOf(pids: readonly number[]): number {
  return pids.reduce((a, p) => a + cpuSeconds(p), 0);
}

/**
 * /proc/<pid>/schedstat of the process's main thread (the JS thread): time on the CPU and time
 * spent runnable but waiting for a CPU (run-queue delay), in ms. The second is what a busy
 * machine adds to every latency: the thread was ready and nobody ran it.
 */
export function schedstat(pid: number): { run_ms: number; wait_ms: number } {
  try {
    const [run, wait] = readFileSync(`/proc/${pid}/schedstat`, 'utf8').trim().split(/\s+/).map(Number) as [number, number];
    return { run_ms: run / 1e6, wait_ms: wait / 1e6 };
  } catch {
    return { run_ms: Number.NaN, wait_ms: Number.NaN };
  }
}
