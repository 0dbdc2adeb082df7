/**
 * Reconnect delays of a broker address: exponential with "equal jitter", so that many fylrs that
 * lost the same execserver at the same moment do not come back in lockstep.
 *
 *   attempt n (0-based):  ceiling = min(maxMs, initialMs * 2^n)
 *                         delay   = ceiling/2 + random() * ceiling/2
 */

export interface BackoffOptions {
  /** Ceiling of the first retry. */
  initialMs: number;
  /** Ceiling of every later retry. */
  maxMs: number;
}

export const DEFAULT_BACKOFF: BackoffOptions = { initialMs: 250, maxMs: 10_000 };

export function backoffDelayMs(attempt: number, opts: BackoffOptions = DEFAULT_BACKOFF, random: () => number = Math.random): number {
  const exp = Math.min(30, Math.max(0, Math.floor(attempt)));
  const ceiling = Math.min(opts.maxMs, opts.initialMs * 2 ** exp);
  const r = Math.min(1, Math.max(0, random()));
  return Math.round(ceiling / 2 + r * (ceiling / 2));
}
