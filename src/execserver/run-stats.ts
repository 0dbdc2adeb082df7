/**
 * Rolling mean of recent run times per service, for POSITION's `eta_ms`. Always an estimate, never
 * a promise (the seed): the position is the hard number, the time a hint.
 *
 * Only successful runs are recorded (Broker#recordRun): a failing command usually ends early and
 * would make every estimate of its service too short.
 */
export class RunStats {
  readonly #window: number;
  readonly #samples = new Map<string, number[]>();

  /** `window`: how many recent runs of a service the mean covers. */
  constructor(window = 20) {
    this.#window = window;
  }

  record(service: string, durationMs: number): void {
    if (!Number.isFinite(durationMs) || durationMs < 0) return;
    let s = this.#samples.get(service);
    if (!s) this.#samples.set(service, (s = []));
    s.push(durationMs);
    if (s.length > this.#window) s.shift();
  }

  /** Mean run time of the last `window` runs, or null before the first. */
  meanMs(service: string): number | null {
    const s = this.#samples.get(service);
    if (!s || s.length === 0) return null;
    return s.reduce((a, b) => a + b, 0) / s.length;
  }

  /**
   * Time until a parked want is likely done: it waits for a slot, then runs once.
   *
   * `ahead` wants go first. `free` slots are free now (they serve the first `free` of the line at
   * once); after that, with every slot busy, a slot frees on average every mean/capacity. So the
   * want's slot is the (ahead + 1 - free)-th to free: wait = max(0, ahead + 1 - free) x mean /
   * capacity, and eta = wait + mean. Null until the service has a run time, or without slots.
   */
  etaMs(service: string, ahead: number, capacity: number, free = 0): number | null {
    const mean = this.meanMs(service);
    if (mean === null || capacity <= 0) return null;
    const slotsToWaitFor = Math.max(0, ahead + 1 - Math.max(0, free));
    return Math.round((slotsToWaitFor * mean) / capacity + mean);
  }

  /** Time a running job likely still needs: the mean minus what it ran already, at least 0. */
  remainingMs(service: string, elapsedMs: number): number | null {
    const mean = this.meanMs(service);
    if (mean === null) return null;
    return Math.max(0, Math.round(mean - elapsedMs));
  }
}
