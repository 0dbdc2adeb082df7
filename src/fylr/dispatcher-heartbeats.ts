/**
 * Claim liveness for one dispatcher, two timers on its Clock:
 *
 *   every heartbeatIntervalMs: UPDATE heartbeat_at = now() of every item this fylr carries
 *                              (nothing carried: no query). Ids the answer lacks were lost: a
 *                              sibling requeued them while our heartbeats stalled; the
 *                              dispatcher stops carrying them.
 *   every sweepIntervalMs:     requeue the claims of other heartbeating owners whose heartbeat
 *                              is older than staleAfterMs: their fylr is gone.
 *
 * Safety: an owner that is alive refreshes every claim at least every heartbeatIntervalMs, so
 * with staleAfterMs >= 2 * heartbeatIntervalMs (enforced) a live owner's claims never look
 * stale unless its heartbeat queries stall for longer than the threshold. Times are compared
 * on the database's clock only, so fylr clock skew does not matter.
 */
import type pg from 'pg';
import { type Clock, every } from '../clock.js';
import { heartbeat, type OrphanSweep, requeueOrphans } from '../db/file-queue-claims.js';
import { failedReceipt } from '../protocol/job.js';

export const DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000;
export const DEFAULT_STALE_AFTER_MS = 30_000;

export interface ClaimKeeperOptions {
  pool: Pick<pg.Pool, 'query'>;
  owner: string;
  clock: Clock;
  heartbeatIntervalMs?: number;
  staleAfterMs?: number;
  /** Default: heartbeatIntervalMs. */
  sweepIntervalMs?: number;
  /** An orphaned claim counts as a failure; at this many the item ends failed. */
  maxFailures: number;
  /** Ids of everything this fylr carries right now. */
  carried(): number[];
  onLost(ids: number[]): void;
  onSwept(sweep: OrphanSweep): void;
  onError(what: 'heartbeat' | 'sweep', err: unknown): void;
  /** Counts every query sent. */
  onQuery(kind: 'heartbeat' | 'sweep'): void;
}

export class ClaimKeeper {
  readonly heartbeatIntervalMs: number;
  readonly staleAfterMs: number;
  readonly sweepIntervalMs: number;
  readonly #o: ClaimKeeperOptions;
  #stops: (() => void)[] = [];
  #beating = false;
  #sweeping = false;

  constructor(opts: ClaimKeeperOptions) {
    this.#o = opts;
    this.heartbeatIntervalMs = opts.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_INTERVAL_MS;
    this.staleAfterMs = opts.staleAfterMs ?? DEFAULT_STALE_AFTER_MS;
    this.sweepIntervalMs = opts.sweepIntervalMs ?? this.heartbeatIntervalMs;
    for (const [k, v] of [['heartbeatIntervalMs', this.heartbeatIntervalMs], ['staleAfterMs', this.staleAfterMs], ['sweepIntervalMs', this.sweepIntervalMs]] as const) {
      if (!Number.isFinite(v) || v <= 0) throw new RangeError(`${k} must be a positive number of ms, got ${v}`);
    }
    if (this.staleAfterMs < 2 * this.heartbeatIntervalMs) {
      throw new RangeError(`staleAfterMs (${this.staleAfterMs}) must be at least twice heartbeatIntervalMs (${this.heartbeatIntervalMs})`);
    }
  }

  start(): void {
    if (this.#stops.length > 0) return;
    this.#stops.push(every(this.#o.clock, this.heartbeatIntervalMs, () => void this.beat()));
    this.#stops.push(every(this.#o.clock, this.sweepIntervalMs, () => void this.sweep()));
  }

  stop(): void {
    for (const s of this.#stops) s();
    this.#stops = [];
  }

  /** One heartbeat round now (also what the timer runs). A round still in flight is not doubled. */
  async beat(): Promise<void> {
    const o = this.#o;
    const ids = o.carried();
    if (ids.length === 0 || this.#beating) return;
    this.#beating = true;
    try {
      o.onQuery('heartbeat');
      const held = new Set(await heartbeat(o.pool, o.owner, ids));
      // Only ids carried both before and after the query can have been lost: an item that
      // finished meanwhile simply is not claimed any more.
      const still = new Set(o.carried());
      const lost = ids.filter((id) => !held.has(id) && still.has(id));
      if (lost.length > 0) o.onLost(lost);
    } catch (e) {
      o.onError('heartbeat', e);
    } finally {
      this.#beating = false;
    }
  }

  /** One orphan sweep now. */
  async sweep(): Promise<void> {
    const o = this.#o;
    if (this.#sweeping) return;
    this.#sweeping = true;
    try {
      o.onQuery('sweep');
      const sweep = await requeueOrphans(o.pool, this.staleAfterMs, o.owner, {
        maxFailures: o.maxFailures,
        receipt: failedReceipt('stopped', `the fylr carrying this item stopped heartbeating for over ${this.staleAfterMs} ms, ${o.maxFailures} times`),
      });
      if (sweep.requeued.length + sweep.failed.length > 0) o.onSwept(sweep);
    } catch (e) {
      o.onError('sweep', e);
    } finally {
      this.#sweeping = false;
    }
  }
}
