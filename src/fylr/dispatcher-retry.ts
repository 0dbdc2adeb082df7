/**
 * What a failed execution of a queue item leads to. Pure; the dispatcher applies the verdict.
 *
 *   failure #1 ──► retry after backoffMs            (default 10 s)
 *   failure #2 ──► retry after backoffMs * 2        (default 20 s)
 *   failure #3 ──► failed, for good                 (maxFailures, default 3)
 *
 * Counted are failed executions (`file_queue.failures`), not claims: "no slot within
 * connectTimeoutSec" requeues (+1 min) are not failures, so backpressure never fails an item.
 * A claim orphaned by a crashed fylr counts as a failure (file-queue-claims.ts), so an item that
 * kills its fylr every time also ends failed instead of looping.
 *
 * Failures that no retry can change end the item at once: a payload that is no job, a command
 * the execserver does not allow.
 */
import type { Receipt } from '../protocol/job.js';

export const DEFAULT_MAX_FAILURES = 3;
export const DEFAULT_RETRY_BACKOFF_MS = 10_000;
export const MAX_RETRY_BACKOFF_MS = 10 * 60_000;

/** Receipt error codes that say "this job can never succeed as it is". */
export const FINAL_ERROR_CODES: ReadonlySet<string> = new Set(['invalid_job', 'command_not_allowed']);

export interface RetryPolicyOptions {
  maxFailures?: number;
  backoffMs?: number;
}

export type FailureVerdict = { kind: 'retry'; afterMs: number } | { kind: 'fail'; reason: 'final_error' | 'max_failures' };

export class RetryPolicy {
  readonly maxFailures: number;
  readonly backoffMs: number;

  constructor(opts: RetryPolicyOptions = {}) {
    this.maxFailures = opts.maxFailures ?? DEFAULT_MAX_FAILURES;
    this.backoffMs = opts.backoffMs ?? DEFAULT_RETRY_BACKOFF_MS;
    if (!Number.isSafeInteger(this.maxFailures) || this.maxFailures < 1) throw new RangeError(`maxFailures must be a positive integer, got ${this.maxFailures}`);
    if (!Number.isFinite(this.backoffMs) || this.backoffMs < 0) throw new RangeError(`backoffMs must be a non-negative number, got ${this.backoffMs}`);
  }

  /** `failuresBefore`: failed executions before this one. */
  decide(failuresBefore: number, receipt: Receipt): FailureVerdict {
    if (receipt.error !== null && FINAL_ERROR_CODES.has(receipt.error.code)) return { kind: 'fail', reason: 'final_error' };
    const failures = failuresBefore + 1;
    if (failures >= this.maxFailures) return { kind: 'fail', reason: 'max_failures' };
    return { kind: 'retry', afterMs: Math.min(MAX_RETRY_BACKOFF_MS, this.backoffMs * 2 ** (failures - 1)) };
  }
}
