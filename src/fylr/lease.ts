/**
 * What `acquire` hands out: one reserved slot, on a broker connection (an OFFER) or a polling
 * address (a legacy token), to be used by exactly one `run(job)`.
 *
 * Timing: an OFFER is reserved for its `expires_ms` (the execserver's offer_timeout_ms, 5 s by
 * default), a legacy token for 10 s. Call `run()` at once after `acquire` resolves (in the same
 * turn if you can); a lease that lapsed resolves `run()` with a receipt whose `error.code` is
 * `no_slot` (nothing ran: requeue the item). A lease that will not be used must be `release()`d,
 * which frees the slot at once instead of when the reservation lapses.
 *
 * `run()` never rejects. Its receipt is the execserver's, with these additions:
 *   no_slot          nothing ran (lease lapsed, released, refused, or its connection closed before JOB)
 *   stopped          the connection closed while the job ran (the execserver stopped it: rule 6)
 *   pipe_out_failed  DONE said ok but the out-pipe's PUT was aborted or incomplete
 */
import type { Readable, Writable } from 'node:stream';
import { failedReceipt, type JobSpec, type Receipt } from '../protocol/job.js';

export interface AcquireRequest {
  jobId: string;
  service: string;
  /** Higher is served first. */
  priority: number;
  /** Default: connectTimeoutSec. */
  timeoutSec?: number;
}

export interface RunIo {
  /** Body-mode stdin: streamed to the execserver's GET of the in-pipe (or as the legacy PUT body). */
  stdin?: Readable;
  /** Body-mode stdout: written chunk by chunk, ended on success, destroy()ed (without an error) on a failure. */
  stdout?: Writable;
}

export interface SlotLease {
  readonly address: string;
  readonly transport: 'broker' | 'polling';
  readonly jobId: string;
  /** Broker: JOB (with pipe URLs for body-mode jobs), resolves with DONE joined with the out-pipe. Polling: the PUT. */
  run(job: JobSpec, io?: RunIo): Promise<Receipt>;
  /** Broker: CANCEL a running job (its receipt says stopped). Polling: abort the PUT. Before run(): release(). */
  cancel(): void;
  /** Frees an unused slot now (broker: DECLINE; polling: an empty job redeems the token). No effect after run(). */
  release(): void;
}

export type RequeueReason = 'timeout' | 'aborted' | 'closed';

export type AcquireResult =
  | { kind: 'slot'; lease: SlotLease }
  /** No slot within the timeout: UNWANT was sent everywhere. The dispatcher sets start_after +1 min. */
  | { kind: 'requeue'; reason: RequeueReason };

export function noSlotReceipt(message: string): Receipt {
  return failedReceipt('no_slot', message);
}

export function stoppedReceipt(message: string): Receipt {
  return { ...failedReceipt('stopped', message), stopped: true };
}
