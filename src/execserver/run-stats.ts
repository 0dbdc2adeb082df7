/**
 * Rolling mean of recent run times per service, for POSITION's `eta_ms`. Always an estimate, never
 * a promise (the seed): the position is the hard number, the time a hint.
 */
export class RunStats {
  readonly #window: number;
  readonly #samples = new Map<string, number[]>();

  constructor(window = 20) {
    this.#window = window;
  }

  record(service: string, durationMs: number): void {
    let s = this.#samples.get(service);
    if (!s) this.#samples.set(service, (s = []));
    s.push(durationMs);
    if (s.length > this.#window) s.shift();
  }

  meanMs(service: string): number | null {
    const s = this.#samples.get(service);
    if (!s || s.length === 0) return null;
    return s.reduce((a, b) => a + b, 0) / s.length;
  }

  /**
   * Time until a parked want with `ahead` wants before it is likely done: its predecessors drain
   * through `capacity` slots at one run time each, then it runs once itself.
   */
  etaMs(service: string, ahead: number, capacity: number): number | null {
    const mean = this.meanMs(service);
    if (mean === null || capacity <= 0) return null;
    return Math.round(Math.ceil((ahead + 1) / capacity) * mean);
  }
}
