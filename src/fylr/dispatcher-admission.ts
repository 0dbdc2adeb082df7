/**
 * How much the dispatcher may claim in one poll: the only arithmetic between "what the fleet can
 * take" and "what this fylr carries".
 *
 *   exec-bound:  admission() (the broker client's claim share: ceil(processes / clients) plus a
 *                little pipelining headroom, summed over the execserver instances it reaches)
 *                minus the exec-bound items this fylr already carries; 0 with no execserver.
 *
 *   local-bound: a semaphore of `size` slots (default: the CPU count, at least 2):
 *
 *       ┌──────────── size ─────────────┐
 *       [ any priority ...  | high only ]
 *                            └ reserve ┘   reserve = max(1, floor(size / 4))
 *
 *     low-priority items may hold at most `size - reserve` slots; high-priority items
 *     (priority >= HIGH_PRIORITY) may hold any slot, so a backlog of background checksums can
 *     never keep an interactive one waiting for more than one local task.
 */
import { availableParallelism } from 'node:os';
import type { ClaimBudget } from '../db/file-queue-claims.js';

export interface ExecAdmissionSource {
  /** The claim share the broker client computes from the HELLOs it holds. */
  admission(): number;
  /** Is any execserver connected (broker or polling)? */
  hasExecserver(): boolean;
}

/** Exec-bound items this fylr may still claim. */
export function execBudget(client: ExecAdmissionSource, carriedExec: number): number {
  if (!client.hasExecserver()) return 0;
  const share = client.admission();
  if (!Number.isFinite(share) || share <= 0) return 0;
  return Math.max(0, Math.floor(share) - carriedExec);
}

export interface LocalSlotsStatus {
  size: number;
  reserved_high: number;
  in_use: number;
  in_use_low: number;
}

/** The local-bound semaphore. Slots are taken when an item is claimed and given back when it ends. */
export class LocalSlots {
  readonly size: number;
  readonly reserve: number;
  #inUse = 0;
  #inUseLow = 0;

  /** `size`: default max(2, availableParallelism()); `reserve`: default max(1, floor(size / 4)). */
  constructor(opts: { size?: number; reserve?: number } = {}) {
    const size = opts.size ?? Math.max(2, availableParallelism());
    if (!Number.isSafeInteger(size) || size < 1) throw new RangeError(`local slots must be a positive integer, got ${size}`);
    const reserve = opts.reserve ?? Math.max(1, Math.floor(size / 4));
    if (!Number.isSafeInteger(reserve) || reserve < 0 || reserve >= size) {
      throw new RangeError(`the high-priority reserve must be an integer in [0, ${size - 1}], got ${reserve}`);
    }
    this.size = size;
    this.reserve = reserve;
  }

  /** Free slots for any item, and of those, how many a low-priority item may take. */
  budget(): Pick<ClaimBudget, 'localBound' | 'localLow'> {
    const free = this.size - this.#inUse;
    const lowFree = this.size - this.reserve - this.#inUseLow;
    return { localBound: Math.max(0, free), localLow: Math.max(0, Math.min(free, lowFree)) };
  }

  take(high: boolean): void {
    const b = this.budget();
    if (b.localBound <= 0 || (!high && (b.localLow ?? 0) <= 0)) {
      throw new Error(`local slot over-claimed (high=${high}, in use ${this.#inUse}/${this.size}, low ${this.#inUseLow})`);
    }
    this.#inUse++;
    if (!high) this.#inUseLow++;
  }

  give(high: boolean): void {
    this.#inUse--;
    if (!high) this.#inUseLow--;
  }

  status(): LocalSlotsStatus {
    return { size: this.size, reserved_high: this.reserve, in_use: this.#inUse, in_use_low: this.#inUseLow };
  }
}
