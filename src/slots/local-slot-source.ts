/**
 * Slots of a native execserver: `processes` per waitgroup, counted here, jobs run as local child
 * processes by the job runner. A slot is either reserved (an offer or a legacy token waiting to
 * be redeemed) or running; both count against `processes`, so a slot is never handed out twice.
 */
import type { Clock } from '../clock.js';
import type { CommandConfig, ServeConfig } from '../config/types.js';
import { failedReceipt, type JobSpec, type Receipt } from '../protocol/job.js';
import { runJob } from './job-runner.js';
import type { JobIo, Slot, SlotSource } from './slot-source.js';

interface WaitgroupSlots {
  processes: number;
  reserved: Set<number>;
  running: Set<number>;
}

export class LocalSlotSource implements SlotSource {
  readonly kind = 'local' as const;
  readonly #config: ServeConfig;
  readonly #clock: Clock;
  readonly #groups = new Map<string, WaitgroupSlots>();
  #nextId = 1;
  #listener: (waitgroup: string) => void = () => undefined;
  /** Highest concurrent running count per waitgroup since start (for tests and /status). */
  readonly maxRunning = new Map<string, number>();
  /** Highest count of slots reserved or running at once per waitgroup since start (for tests). */
  readonly maxInUse = new Map<string, number>();
  /** Jobs running now, so close() can wait for them to end. */
  readonly #runs = new Set<Promise<unknown>>();

  constructor(config: ServeConfig, clock: Clock) {
    this.#config = config;
    this.#clock = clock;
    for (const [wg, processes] of Object.entries(config.waitgroups)) {
      this.#groups.set(wg, { processes, reserved: new Set(), running: new Set() });
    }
  }

  #group(waitgroup: string): WaitgroupSlots {
    const g = this.#groups.get(waitgroup);
    if (!g) throw new Error(`unknown waitgroup ${waitgroup}`);
    return g;
  }

  processes(waitgroup: string): number {
    return this.#groups.get(waitgroup)?.processes ?? 0;
  }

  inUse(waitgroup: string): number {
    const g = this.#groups.get(waitgroup);
    return g ? g.reserved.size + g.running.size : 0;
  }

  running(waitgroup: string): number {
    return this.#groups.get(waitgroup)?.running.size ?? 0;
  }

  tryReserve(waitgroup: string): Slot | null {
    const g = this.#group(waitgroup);
    if (g.reserved.size + g.running.size >= g.processes) return null;
    const slot: Slot = { id: this.#nextId++, waitgroup, service: null };
    g.reserved.add(slot.id);
    this.maxInUse.set(waitgroup, Math.max(this.maxInUse.get(waitgroup) ?? 0, g.reserved.size + g.running.size));
    return slot;
  }

  spareServices(): string[] {
    return [];
  }

  release(slot: Slot): void {
    const g = this.#group(slot.waitgroup);
    if (g.reserved.delete(slot.id)) this.#listener(slot.waitgroup);
  }

  run(slot: Slot, job: JobSpec, io: JobIo): Promise<Receipt> {
    const p = this.#run(slot, job, io);
    this.#runs.add(p);
    void p.finally(() => this.#runs.delete(p));
    return p;
  }

  async #run(slot: Slot, job: JobSpec, io: JobIo): Promise<Receipt> {
    const g = this.#groups.get(slot.waitgroup);
    if (!g) return failedReceipt('internal', `unknown waitgroup ${slot.waitgroup}`);
    if (!g.reserved.delete(slot.id)) return failedReceipt('internal', 'slot was not reserved');
    g.running.add(slot.id);
    this.maxRunning.set(slot.waitgroup, Math.max(this.maxRunning.get(slot.waitgroup) ?? 0, g.running.size));
    try {
      const service = this.#config.services[job.service];
      const commands: Record<string, CommandConfig> = {};
      for (const name of service?.commands ?? []) {
        const c = this.#config.commands[name];
        if (c) commands[name] = c;
      }
      const opts: Parameters<typeof runJob>[1] = {
        commands,
        clock: this.#clock,
        signal: io.signal,
        defaultTimeoutSec: this.#config.default_timeout_sec,
      };
      if (io.stdin) opts.stdin = io.stdin;
      if (io.stdout) opts.stdout = io.stdout;
      return await runJob(job, opts);
    } finally {
      g.running.delete(slot.id);
      this.#listener(slot.waitgroup);
    }
  }

  onAvailable(listener: (waitgroup: string) => void): void {
    this.#listener = listener;
  }

  demandChanged(): void {
    // Local slots exist whether or not anyone wants them.
  }

  /** Waits for the jobs still running (their callers stop them: CANCEL, connection close). */
  async close(): Promise<void> {
    await Promise.allSettled([...this.#runs]);
  }
}
