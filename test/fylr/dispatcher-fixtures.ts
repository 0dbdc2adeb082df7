/**
 * Shared by the dispatcher tests: waiting for database state, and — for the UNIT tests of the
 * claim/admission logic only — a scripted stand-in for the broker client. Integration tests use
 * the real ExecClient against real execservers.
 */
import type pg from 'pg';
import { type Clock, systemClock } from '../../src/clock.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { ServeConfig } from '../../src/config/types.js';
import type { Execserver } from '../../src/execserver/server.js';
import type { DispatchAcquireResult, DispatchClient, DispatchLease, Dispatcher } from '../../src/fylr/dispatcher.js';
import { failedReceipt, type JobSpec, okReceipt, type Receipt } from '../../src/protocol/job.js';
import { LocalSlotSource } from '../../src/slots/local-slot-source.js';
import type { DemandView, JobIo, Slot, SlotSource } from '../../src/slots/slot-source.js';
import { listenExec } from './fixtures.js';

export { clientConfig as execClientConfig } from './fixtures.js';

/** Polls `check` every `intervalMs` until it returns a value other than undefined/false. */
export async function waitFor<T>(what: string, check: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs = 20_000, intervalMs = 20): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined && v !== false) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (last error: ${(last as Error).message})` : ''}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/**
 * Resolves once the predicate holds — checked on the dispatcher's 'change' events and every 5 ms
 * (for state outside the dispatcher) — or rejects after timeoutMs.
 */
export async function until(d: Dispatcher, what: string, predicate: () => boolean, timeoutMs = 20_000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  let ticker: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      d.until(predicate),
      new Promise<void>((resolve) => {
        ticker = setInterval(() => predicate() && resolve(), 5);
      }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}: ${JSON.stringify(d.status().counters)}`)), timeoutMs);
      }),
    ]);
  } finally {
    clearTimeout(timer);
    clearInterval(ticker);
  }
}

export async function countStates(pool: pg.Pool): Promise<Record<string, number>> {
  const { rows } = await pool.query<{ state: string; n: string }>('SELECT state, count(*) AS n FROM file_queue GROUP BY state');
  const out: Record<string, number> = { queued: 0, claimed: 0, done: 0, failed: 0 };
  for (const r of rows) out[r.state] = Number(r.n);
  return out;
}

export async function claimedBy(pool: pg.Pool): Promise<Map<string, number>> {
  const { rows } = await pool.query<{ claimed_by: string; n: string }>(
    `SELECT claimed_by, count(*) AS n FROM file_queue WHERE state = 'claimed' GROUP BY claimed_by`,
  );
  return new Map(rows.map((r) => [r.claimed_by, Number(r.n)]));
}

export interface ScriptedRun {
  jobId: string;
  job: JobSpec;
  cancelled: boolean;
  /** Ends the run with this receipt. */
  finish(receipt?: Receipt): void;
}

/**
 * A broker-client stand-in with scripted answers. `acquire` answers per `mode`; a lease's run
 * stays open until the test finishes it (or answers at once with `autoFinish`).
 */
export class ScriptedClient implements DispatchClient {
  share = 3;
  connected = true;
  mode: 'slot' | 'requeue' = 'slot';
  /** A receipt for every run at once, or null: the test finishes each run. */
  autoFinish: ((run: ScriptedRun) => Receipt) | null = null;
  readonly acquired: string[] = [];
  readonly runs: ScriptedRun[] = [];
  readonly open = new Map<string, ScriptedRun>();
  readonly #listeners: (() => void)[] = [];

  admission(): number {
    return this.share;
  }

  hasExecserver(): boolean {
    return this.connected;
  }

  onChange(listener: () => void): void {
    this.#listeners.push(listener);
  }

  changed(): void {
    for (const l of this.#listeners) l();
  }

  async acquire(req: { jobId: string; service: string; priority: number }, signal?: AbortSignal): Promise<DispatchAcquireResult> {
    this.acquired.push(req.jobId);
    if (signal?.aborted) return { kind: 'requeue' };
    if (this.mode === 'requeue') return { kind: 'requeue' };
    const lease: DispatchLease = {
      address: 'scripted',
      transport: 'broker',
      run: (job) =>
        new Promise<Receipt>((resolve) => {
          const run: ScriptedRun = {
            jobId: req.jobId,
            job,
            cancelled: false,
            finish: (receipt = okReceipt()) => {
              this.open.delete(req.jobId);
              resolve(receipt);
            },
          };
          this.runs.push(run);
          this.open.set(req.jobId, run);
          if (this.autoFinish) run.finish(this.autoFinish(run));
        }),
      cancel: () => {
        const run = this.open.get(req.jobId);
        if (run) {
          run.cancelled = true;
          run.finish({ ...failedReceipt('stopped', 'cancelled'), stopped: true });
        }
      },
    };
    return { kind: 'slot', lease };
  }
}

// ---------------------------------------------------------------- a real execserver, observed

/** One job that reached the execserver's slots (SlotSource.run): the real execution point. */
export interface Execution {
  seq: number;
  /** The job's timeout_sec: the tests' per-item marker. */
  marker: number | null;
  service: string;
  receipt: Receipt | null;
  /** The execserver stopped it (connection closed, CANCEL): nobody received its DONE. */
  aborted: boolean;
}

/**
 * The native execserver's own LocalSlotSource, wrapped to record every execution (in start
 * order) and, when `hold` says so, to hold a job on its slot until the test releases it (or the
 * execserver stops it: connection close, CANCEL). Everything else is the real thing.
 */
export class RecordingSource implements SlotSource {
  readonly kind = 'local' as const;
  readonly inner: LocalSlotSource;
  readonly started: Execution[] = [];
  readonly finished: Execution[] = [];
  /** Hold a starting job on its slot? */
  hold: ((job: JobSpec) => boolean) | null = null;
  readonly #held = new Map<Execution, () => void>();

  constructor(config: ServeConfig, clock: Clock = systemClock) {
    this.inner = new LocalSlotSource(config, clock);
  }

  processes(wg: string): number {
    return this.inner.processes(wg);
  }
  inUse(wg: string): number {
    return this.inner.inUse(wg);
  }
  running(wg: string): number {
    return this.inner.running(wg);
  }
  tryReserve(wg: string): Slot | null {
    return this.inner.tryReserve(wg);
  }
  spareServices(): string[] {
    return this.inner.spareServices();
  }
  release(slot: Slot): void {
    this.inner.release(slot);
  }
  onAvailable(listener: (wg: string) => void): void {
    this.inner.onAvailable(listener);
  }
  demandChanged(_wg: string, _view: DemandView): void {
    this.inner.demandChanged();
  }
  close(): Promise<void> {
    this.releaseAll();
    return this.inner.close();
  }

  async run(slot: Slot, job: JobSpec, io: JobIo): Promise<Receipt> {
    const e: Execution = { seq: this.started.length + 1, marker: job.timeout_sec ?? null, service: job.service, receipt: null, aborted: false };
    this.started.push(e);
    if (this.hold?.(job)) {
      await new Promise<void>((resolve) => {
        const done = (): void => {
          this.#held.delete(e);
          io.signal.removeEventListener('abort', done);
          resolve();
        };
        this.#held.set(e, done);
        io.signal.addEventListener('abort', done, { once: true });
      });
    }
    const receipt = await this.inner.run(slot, job, io);
    e.receipt = receipt;
    e.aborted = io.signal.aborted;
    this.finished.push(e);
    return receipt;
  }

  /** Executions held on their slot now. */
  heldNow(): Execution[] {
    return [...this.#held.keys()];
  }

  /** Lets the held executions that match go on; resolves with how many. */
  releaseWhere(pred: (e: Execution) => boolean): number {
    let n = 0;
    for (const [e, done] of [...this.#held]) {
      if (!pred(e)) continue;
      done();
      n++;
    }
    return n;
  }

  releaseAll(): number {
    this.hold = null;
    return this.releaseWhere(() => true);
  }

  /** Completed executions (ok, and not stopped by the execserver: their DONE went out) per marker. */
  okByMarker(): Map<number, number> {
    const m = new Map<number, number>();
    for (const e of this.finished) if (e.receipt?.ok && !e.aborted && e.marker !== null) m.set(e.marker, (m.get(e.marker) ?? 0) + 1);
    return m;
  }
}

export interface ObservedExec {
  exec: Execserver;
  source: RecordingSource;
  url: string;
  port: number;
  /** Sum of the execserver's `slotgate_jobs_total` counter. */
  jobsTotal(): Promise<number>;
  close(): Promise<void>;
}

/** Services `noop` (jobs without commands) and `sleep`, all in waitgroup `w` of `slots` processes. */
export async function startObservedExec(t: { teardown(fn: () => unknown): void }, opts: { name?: string; slots: number; listen?: string }): Promise<ObservedExec> {
  const config = parseServeConfig({
    listen: opts.listen ?? '127.0.0.1:0',
    name: opts.name ?? 'exec',
    waitgroups: { w: opts.slots },
    commands: { sleep: { prog: 'sleep' } },
    services: { noop: { waitgroup: 'w', commands: [] }, sleep: { waitgroup: 'w', commands: ['sleep'] } },
  });
  const source = new RecordingSource(config);
  const { exec, url, port, close } = await listenExec(t, config, source);
  return {
    exec,
    source,
    url,
    port,
    async jobsTotal() {
      const metric = exec.metrics.registry.getSingleMetric('slotgate_jobs_total');
      if (metric === undefined) return 0;
      const { values } = await metric.get();
      return values.reduce((n, v) => n + v.value, 0);
    },
    close,
  };
}

/**
 * Inserts `n` queued items in one statement; item g (1..n) carries job timeout_sec markerBase+g,
 * so an execution at the execserver names its item. Resolves with marker -> item id.
 */
export async function insertItems(pool: pg.Pool, n: number, opts: { action?: string; priority?: number; markerBase?: number; commands?: unknown[] } = {}): Promise<Map<number, number>> {
  const action = opts.action ?? 'noop';
  const { rows } = await pool.query<{ id: string; marker: number }>(
    `INSERT INTO file_queue (action, priority, payload)
     SELECT $1, $2, jsonb_build_object('service', $1::text, 'commands', $4::jsonb, 'timeout_sec', $3::integer + g)
       FROM generate_series(1, $5::integer) g
     RETURNING id, (payload->>'timeout_sec')::integer AS marker`,
    [action, opts.priority ?? 0, opts.markerBase ?? 1000, JSON.stringify(opts.commands ?? []), n],
  );
  return new Map(rows.map((r) => [r.marker, Number(r.id)]));
}
