/**
 * Shared by the dispatcher tests: waiting for database state, and — for the UNIT tests of the
 * claim/admission logic only — a scripted stand-in for the broker client. Integration tests use
 * the real ExecClient against real execservers.
 */
import type pg from 'pg';
import type { DispatchAcquireResult, DispatchClient, DispatchLease, Dispatcher } from '../../src/fylr/dispatcher.js';
import { failedReceipt, type JobSpec, okReceipt, type Receipt } from '../../src/protocol/job.js';

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
