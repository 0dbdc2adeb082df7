/**
 * A SlotSource wrapper that timestamps hand-offs at the execserver, in the execserver's process:
 *
 *   t_free  the inner source reports a slot available (LocalSlotSource: the job ended; this is
 *           before the broker pumps, so before the next OFFER and before the old job's DONE)
 *   t_job   the broker calls run() for the next accepted JOB (the JOB frame was decoded and its
 *           offer token checked)
 *
 *   hand-off = t_job - t_free, paired first-in first-out per waitgroup (exact with one slot).
 *
 * `holdMs` keeps each job's slot (reserved, not yet running) for that long before the no-op job
 * runs, so that hand-offs are separate events instead of one back-to-back stream (0: no hold).
 */
import type { JobSpec, Receipt } from '../../src/protocol/job.js';
import type { DemandView, JobIo, Slot, SlotSource } from '../../src/slots/slot-source.js';

export class TimingSource implements SlotSource {
  readonly kind: SlotSource['kind'];
  readonly #inner: SlotSource;
  readonly #freedAt = new Map<string, number[]>();
  readonly #demand = new Map<string, DemandView>();
  holdMs: number;
  recording = false;
  readonly samplesMs: number[] = [];
  jobsRun = 0;

  constructor(inner: SlotSource, holdMs = 0) {
    this.#inner = inner;
    this.kind = inner.kind;
    this.holdMs = holdMs;
  }

  /** Starts a new series: forgets pending frees and samples. */
  reset(recording: boolean): void {
    this.#freedAt.clear();
    this.samplesMs.length = 0;
    this.recording = recording;
  }

  processes(wg: string): number {
    return this.#inner.processes(wg);
  }
  inUse(wg: string): number {
    return this.#inner.inUse(wg);
  }
  running(wg: string): number {
    return this.#inner.running(wg);
  }
  tryReserve(wg: string, service: string): Slot | null {
    return this.#inner.tryReserve(wg, service);
  }
  spareServices(wg: string): string[] {
    return this.#inner.spareServices(wg);
  }
  release(slot: Slot): void {
    this.#inner.release(slot);
  }
  demandChanged(wg: string, view: DemandView): void {
    this.#demand.set(wg, view);
    this.#inner.demandChanged(wg, view);
  }
  close(): Promise<void> {
    return this.#inner.close();
  }

  onAvailable(listener: (waitgroup: string) => void): void {
    this.#inner.onAvailable((wg) => {
      // A slot that frees while nobody waits starts no hand-off (the next JOB waits for demand).
      if (this.recording && (this.#demand.get(wg)?.parked(wg) ?? 0) > 0) {
        const q = this.#freedAt.get(wg) ?? [];
        this.#freedAt.set(wg, q);
        // At most one pending free per slot (a source may report the same slot twice).
        if (q.length < Math.max(1, this.#inner.processes(wg))) q.push(performance.now());
      }
      listener(wg);
    });
  }

  async run(slot: Slot, job: JobSpec, io: JobIo): Promise<Receipt> {
    if (this.recording) {
      const freed = this.#freedAt.get(slot.waitgroup)?.shift();
      if (freed !== undefined) this.samplesMs.push(performance.now() - freed);
    }
    this.jobsRun++;
    if (this.holdMs > 0) await new Promise((resolve) => setTimeout(resolve, this.holdMs));
    return this.#inner.run(slot, job, io);
  }
}
