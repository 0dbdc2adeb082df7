/**
 * The only difference between a native execserver and a gateway. The broker (want-book, offers,
 * connections) and the legacy API ask a SlotSource for slots and never learn where they come
 * from: local processes, or tokens held from legacy backends.
 *
 * Life of a slot: tryReserve() -> (release() | run()). `run` frees the slot when the job ends;
 * `release` gives back a reservation that was never used. Whenever a slot may have become
 * available the source calls the listener given to `onAvailable`, and the broker pumps.
 *
 * What the broker relies on:
 * - `onAvailable` is also called whenever `inUse` may have dropped or `processes` may have
 *   changed: the broker re-checks HELLO (processes) and drain completion (every `inUse` 0) there.
 * - `run` resolves with a receipt and does not reject (the broker turns a rejection into an
 *   `internal` receipt, so DONE is still sent once).
 * - While the broker drains, `demandChanged` shows no demand (peek undefined, parked 0) for every
 *   waitgroup: a source that holds reservations on its own (a gateway's spare tokens) should give
 *   them back, because the drain completes only once `inUse` is 0 everywhere.
 */
import type { JobSpec, Receipt } from '../protocol/job.js';
import type { StdinSource, StdoutSink } from './job-runner.js';

export interface Slot {
  readonly id: number;
  readonly waitgroup: string;
  /** The service a slot is bound to (a gateway's legacy token), or null when any service of the waitgroup may use it. */
  readonly service: string | null;
}

export interface JobIo {
  stdin?: StdinSource;
  stdout?: StdoutSink;
  /** Aborted on CANCEL, connection close or server shutdown. */
  signal: AbortSignal;
}

/** What the source may look at in the want-book, to know what to reserve for (the gateway). */
export interface DemandView {
  /** The want the grant rule picks next in the waitgroup. */
  peek(waitgroup: string): { service: string; priority: number } | undefined;
  parked(waitgroup: string): number;
}

export interface SlotSource {
  readonly kind: 'local' | 'gateway';
  processes(waitgroup: string): number;
  /** Slots reserved or running. */
  inUse(waitgroup: string): number;
  running(waitgroup: string): number;
  /** A free slot now, or null. Never waits. */
  tryReserve(waitgroup: string, service: string): Slot | null;
  /**
   * Services of the waitgroup for which the source holds a slot that only that service can use
   * (a gateway's tokens), so the broker can hand it to a want of that service.
   */
  spareServices(waitgroup: string): string[];
  release(slot: Slot): void;
  run(slot: Slot, job: JobSpec, io: JobIo): Promise<Receipt>;
  onAvailable(listener: (waitgroup: string) => void): void;
  /** The parked wants of the waitgroup changed. */
  demandChanged(waitgroup: string, view: DemandView): void;
  close(): Promise<void>;
}
