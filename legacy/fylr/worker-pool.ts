/**
 * The OLD file worker pool, flaws included: `parallel` + `parallelHigh` workers, each a loop
 *
 *   claimOne (one SELECT ... FOR UPDATE SKIP LOCKED transaction) ──nothing──► sleep 1 s, again
 *        │ item
 *        ▼
 *   carry it synchronously: acquireAndRun blocks the worker inside the slot wait
 *        ├─ receipt ───────► finish done / failed
 *        ├─ failed ────────► finish failed (receipt with the error)
 *        └─ no slot ───────► requeue, start_after +1 min
 *
 * The `parallelHigh` workers claim only items with priority >= HIGH_PRIORITY: the only thing
 * that keeps interactive work moving while every `parallel` worker is blocked in a slot wait.
 * Every idle worker polls the database once per second, even when the system is idle.
 *
 * Item action = service, payload = the job JSON. Local actions (sync, checksum, copy_move) have
 * no execserver work here: they succeed at once.
 *
 * stop(): no new claims; workers still waiting for a slot give their item back at once
 * (requeue with no delay: nothing ran); items already sent to an execserver are waited for and
 * finished normally.
 */
import type pg from 'pg';
import type { Clock, TimerHandle } from '../../src/clock.js';
import { claimOne, type FileQueueItem, finish, requeue } from '../../src/db/file-queue-store.js';
import { isLocalAction } from '../../src/db/file-queue-schema.js';
import { assertNever } from '../../src/protocol/messages.js';
import { failedReceipt, isFieldProblem, okReceipt, validateJob } from '../../src/protocol/job.js';
import type { LegacyCounters } from './counters.js';
import { acquireAndRun, type AcquireResult, POLL_INTERVAL_MS } from './polling-client.js';

export const REQUEUE_DELAY_MS = 60_000;

export interface Log {
  warn(obj: object, msg: string): void;
}

export interface WorkerPoolOptions {
  pool: pg.Pool;
  /** `claimed_by` of this fylr's claims. */
  owner: string;
  addresses: readonly string[];
  connectTimeoutSec: number;
  parallel: number;
  parallelHigh: number;
  clock: Clock;
  counters: LegacyCounters;
  /** Idle poll interval; default 1000 (the old pool). */
  pollIntervalMs?: number;
  /** Default 60 000 (the old client's +1 min). */
  requeueDelayMs?: number;
  log?: Log;
}

export type WorkerLane = 'normal' | 'high';
/** idle: polling the DB; waiting: holds an item, blocked in the slot wait; running: its PUT is out. */
export type WorkerState = 'idle' | 'waiting' | 'running' | 'stopped';

export interface WorkerStatus {
  index: number;
  lane: WorkerLane;
  state: WorkerState;
  item_id: number | null;
  action: string | null;
}

export interface WorkerPoolStatus {
  parallel: number;
  parallelHigh: number;
  busy: number;
  idle: number;
  waiting: number;
  running: number;
  /** Items claimed by this pool and not yet finished or requeued. */
  claimed: number[];
  /** Of those, the items whose PUT is out (executing at an execserver). */
  running_items: number[];
  workers: WorkerStatus[];
}

interface Worker extends WorkerStatus {
  done: Promise<void>;
  wake?: () => void;
}

export class LegacyWorkerPool {
  readonly #o: WorkerPoolOptions;
  readonly #workers: Worker[] = [];
  readonly #abort = new AbortController();
  #started = false;
  #stopping: Promise<void> | undefined;

  constructor(opts: WorkerPoolOptions) {
    this.#o = opts;
  }

  start(): void {
    if (this.#started) return;
    this.#started = true;
    const lanes: WorkerLane[] = [...Array<WorkerLane>(this.#o.parallel).fill('normal'), ...Array<WorkerLane>(this.#o.parallelHigh).fill('high')];
    lanes.forEach((lane, index) => {
      const w: Worker = { index, lane, state: 'idle', item_id: null, action: null, done: Promise.resolve() };
      this.#workers.push(w);
      w.done = this.#loop(w);
    });
  }

  /** Idempotent. Resolves once every worker has stopped (see the module comment). */
  stop(): Promise<void> {
    this.#stopping ??= (async () => {
      this.#abort.abort();
      for (const w of this.#workers) w.wake?.();
      await Promise.all(this.#workers.map((w) => w.done));
    })();
    return this.#stopping;
  }

  get stopped(): boolean {
    return this.#abort.signal.aborted;
  }

  status(): WorkerPoolStatus {
    const workers = this.#workers.map(({ index, lane, state, item_id, action }) => ({ index, lane, state, item_id, action }));
    const count = (s: WorkerState): number => workers.filter((w) => w.state === s).length;
    const held = workers.filter((w) => w.item_id !== null);
    return {
      parallel: this.#o.parallel,
      parallelHigh: this.#o.parallelHigh,
      busy: count('waiting') + count('running'),
      idle: count('idle'),
      waiting: count('waiting'),
      running: count('running'),
      claimed: held.map((w) => w.item_id!),
      running_items: held.filter((w) => w.state === 'running').map((w) => w.item_id!),
      workers,
    };
  }

  #sleep(w: Worker, ms: number): Promise<void> {
    const { clock } = this.#o;
    return new Promise((resolve) => {
      let handle: TimerHandle | undefined;
      const wake = (): void => {
        clock.clearTimeout(handle);
        w.wake = undefined;
        resolve();
      };
      w.wake = wake;
      if (this.stopped) return wake();
      handle = clock.setTimeout(wake, ms);
    });
  }

  async #loop(w: Worker): Promise<void> {
    const o = this.#o;
    const interval = o.pollIntervalMs ?? POLL_INTERVAL_MS;
    while (!this.stopped) {
      let item: FileQueueItem | null;
      try {
        item = await claimOne(o.pool, o.owner, { highOnly: w.lane === 'high' });
        o.counters.claimQuery(item !== null);
      } catch (e) {
        o.log?.warn({ err: e, worker: w.index }, 'claim failed');
        await this.#sleep(w, interval);
        continue;
      }
      if (item === null) {
        await this.#sleep(w, interval);
        continue;
      }
      w.state = 'waiting';
      w.item_id = item.id;
      w.action = item.action;
      try {
        await this.#carry(w, item);
      } catch (e) {
        // A DB error while storing the outcome: the claim stays; nothing else to do here.
        o.log?.warn({ err: e, worker: w.index, item: item.id }, 'storing the outcome failed');
      }
      w.state = 'idle';
      w.item_id = null;
      w.action = null;
    }
    w.state = 'stopped';
  }

  /** Runs one item to its outcome and stores it; counts the result once it is stored. */
  async #carry(w: Worker, item: FileQueueItem): Promise<void> {
    const o = this.#o;
    if (isLocalAction(item.action)) {
      await finish(o.pool, item.id, o.owner, okReceipt(), true);
      o.counters.result('done');
      return;
    }
    const job = validateJob(item.payload, 'payload');
    if (isFieldProblem(job)) {
      await finish(o.pool, item.id, o.owner, failedReceipt('invalid_job', job.message), false);
      o.counters.result('failed');
      return;
    }
    job.service = item.action;
    const result: AcquireResult = await acquireAndRun(job, {
      addresses: o.addresses,
      connectTimeoutSec: o.connectTimeoutSec,
      clock: o.clock,
      counters: o.counters,
      signal: this.#abort.signal,
      pollIntervalMs: o.pollIntervalMs ?? POLL_INTERVAL_MS,
      onRunning: () => {
        w.state = 'running';
      },
    });
    switch (result.kind) {
      case 'done':
        await finish(o.pool, item.id, o.owner, result.receipt, result.receipt.ok);
        o.counters.result(result.receipt.ok ? 'done' : 'failed');
        return;
      case 'failed':
        await finish(o.pool, item.id, o.owner, failedReceipt(result.error.code, result.error.message), false);
        o.counters.result('failed');
        return;
      case 'requeue':
        await requeue(o.pool, item.id, o.owner, result.reason === 'aborted' ? 0 : (o.requeueDelayMs ?? REQUEUE_DELAY_MS));
        o.counters.result('requeue');
        return;
      default:
        assertNever(result);
    }
  }
}
