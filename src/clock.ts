/**
 * Time is injected. Every piece of logic that waits (offer expiry, ping timeouts, pool growth,
 * heartbeats, token lifetimes) takes a `Clock`, so unit tests advance a `ManualClock` instead of
 * sleeping. Production code uses `systemClock`.
 */

export interface TimerHandle {
  /** Opaque; only ever passed back to the clock that made it. */
  readonly __timer: unique symbol;
}

export interface Clock {
  /** Milliseconds since an arbitrary epoch; monotonic for `systemClock`. */
  now(): number;
  setTimeout(fn: () => void, delayMs: number): TimerHandle;
  clearTimeout(handle: TimerHandle | undefined): void;
}

const startedAt = Date.now() - performance.now();
const monotonicNow = (): number => startedAt + performance.now();

/** A negative or NaN delay means "as soon as possible", on both clocks. */
function normalDelay(delayMs: number): number {
  return delayMs > 0 ? delayMs : 0;
}

/**
 * Node fires a timer whose delay exceeds 2^31-1 ms (~24.8 days) after 1 ms instead. Longer
 * waits (and Infinity: never) are chained in steps of at most this size.
 */
const MAX_NODE_DELAY_MS = 2 ** 31 - 1;

class LongTimer {
  current: NodeJS.Timeout | undefined;
}

function unrefTimeout(fn: () => void, delayMs: number): NodeJS.Timeout {
  const t = setTimeout(fn, delayMs);
  // A pending timer of ours must never keep a process alive on its own.
  t.unref();
  return t;
}

export const systemClock: Clock = {
  now: monotonicNow,
  setTimeout(fn, delayMs) {
    const delay = normalDelay(delayMs);
    if (delay <= MAX_NODE_DELAY_MS) return unrefTimeout(fn, delay) as unknown as TimerHandle;
    const long = new LongTimer();
    const dueAt = monotonicNow() + delay;
    const arm = (): void => {
      const left = dueAt - monotonicNow();
      long.current = left > MAX_NODE_DELAY_MS ? unrefTimeout(arm, MAX_NODE_DELAY_MS) : unrefTimeout(fn, Math.max(0, left));
    };
    arm();
    return long as unknown as TimerHandle;
  },
  clearTimeout(handle) {
    if (handle === undefined) return;
    if (handle instanceof LongTimer) clearTimeout(handle.current);
    else clearTimeout(handle as unknown as NodeJS.Timeout);
  },
};

/**
 * Calls `fn` every `intervalMs` until the returned function is called. The interval is at least
 * 1 ms (as Node's own timers): a zero interval would make `ManualClock.advance` loop forever.
 */
export function every(clock: Clock, intervalMs: number, fn: () => void): () => void {
  const interval = Math.max(1, normalDelay(intervalMs));
  let handle: TimerHandle | undefined;
  let stopped = false;
  const tick = (): void => {
    if (stopped) return;
    handle = clock.setTimeout(tick, interval);
    fn();
  };
  handle = clock.setTimeout(tick, interval);
  return () => {
    stopped = true;
    clock.clearTimeout(handle);
  };
}

interface ManualTimer {
  id: number;
  dueAt: number;
  fn: () => void;
}

/**
 * A clock that only moves when told to. `advance(ms)` fires every timer that falls due within
 * the step, in due order (ties in creation order), each seeing `now()` equal to its due time;
 * timers created while advancing fire in the same call if they fall due inside the step.
 */
export class ManualClock implements Clock {
  #now: number;
  #nextId = 1;
  #timers = new Map<number, ManualTimer>();

  constructor(startMs = 0) {
    this.#now = startMs;
  }

  now(): number {
    return this.#now;
  }

  setTimeout(fn: () => void, delayMs: number): TimerHandle {
    const id = this.#nextId++;
    this.#timers.set(id, { id, dueAt: this.#now + normalDelay(delayMs), fn });
    return id as unknown as TimerHandle;
  }

  clearTimeout(handle: TimerHandle | undefined): void {
    if (handle !== undefined) this.#timers.delete(handle as unknown as number);
  }

  /** Number of timers not yet fired or cleared. */
  get pending(): number {
    return this.#timers.size;
  }

  /** Moves time forward by `ms` (finite, >= 0): time never runs backwards. */
  advance(ms: number): void {
    if (!(ms >= 0) || !Number.isFinite(ms)) throw new RangeError(`ManualClock.advance: ${ms} is not a finite non-negative number of ms`);
    const target = this.#now + ms;
    for (;;) {
      let next: ManualTimer | undefined;
      for (const t of this.#timers.values()) {
        if (t.dueAt <= target && (next === undefined || t.dueAt < next.dueAt || (t.dueAt === next.dueAt && t.id < next.id))) {
          next = t;
        }
      }
      if (next === undefined) break;
      this.#timers.delete(next.id);
      this.#now = next.dueAt;
      next.fn();
    }
    this.#now = target;
  }
}
