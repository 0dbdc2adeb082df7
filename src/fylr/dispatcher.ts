/**
 * The file dispatcher: ONE loop per fylr server in place of the old `parallel` + `parallelHigh`
 * worker pool (seed: "Companion fix: the file dispatcher").
 *
 *   wake-ups: every pollIntervalMs (1 s) │ an item ended while claims were full │ client.onChange
 *        │
 *        ▼
 *   poll ─► budget (dispatcher-admission.ts) ─► nothing to ask? no query
 *        │     exec  = admission() − exec items carried  (0 with no execserver)
 *        │     local = free local slots, low priority only outside the high reserve
 *        ▼
 *   claimBatch: ONE statement, FOR UPDATE SKIP LOCKED, priority order
 *        │
 *        └─► one task per item, never awaited by the loop:
 *              local:  runLocalTask on its local slot ─────────────────────────┐
 *              exec:   acquire(jobId = "<id>:<attempts>") ─ requeue ─► +1 min  │
 *                        │ slot                                                │
 *                        ▼                                                     ▼
 *                      lease.run(job) ─► receipt ─► ok: done │ else RetryPolicy: retry / failed
 *
 * The loop never waits for a slot: a parked item is a task awaiting `acquire`, an entry in the
 * execserver's want-book and a claimed row. ClaimKeeper (dispatcher-heartbeats.ts) heartbeats
 * everything carried and requeues crashed siblings' claims.
 *
 * stop(): no more claims; items still waiting for a slot are given back at once (requeue with no
 * delay: nothing ran); running items finish and are recorded; heartbeats go on until the last
 * one ends.
 */
import { EventEmitter } from 'node:events';
import type pg from 'pg';
import { type Clock, every, systemClock } from '../clock.js';
import { claimBatch, type ClaimedItem, newOwnerId, recordFailure } from '../db/file-queue-claims.js';
import { HIGH_PRIORITY, isLocalAction } from '../db/file-queue-schema.js';
import { finish, requeue } from '../db/file-queue-store.js';
import { failedReceipt, isFieldProblem, type JobSpec, type Receipt, validateJob } from '../protocol/job.js';
import { untilChange } from '../until-change.js';
import { type ExecAdmissionSource, execBudget, LocalSlots, type LocalSlotsStatus } from './dispatcher-admission.js';
import { ClaimKeeper } from './dispatcher-heartbeats.js';
import { runLocalTask } from './dispatcher-local-tasks.js';
import { RetryPolicy, type RetryPolicyOptions } from './dispatcher-retry.js';

export const DEFAULT_POLL_INTERVAL_MS = 1000;
/** "No slot within connectTimeoutSec": claimable again one minute later (as the old client). */
export const NO_SLOT_REQUEUE_DELAY_MS = 60_000;

/** The slice of the broker client (src/fylr/exec-client.ts) the dispatcher uses. */
export interface DispatchLease {
  readonly address: string;
  readonly transport: string;
  run(job: JobSpec): Promise<Receipt>;
  cancel(): void;
  release?(): void;
}

/** `requeue`: no slot within connectTimeoutSec ('timeout'), or the wait was aborted / the client closed. */
export type DispatchAcquireResult = { kind: 'slot'; lease: DispatchLease } | { kind: 'requeue'; reason?: 'timeout' | 'aborted' | 'closed' };

export interface DispatchClient extends ExecAdmissionSource {
  acquire(req: { jobId: string; service: string; priority: number; timeoutSec?: number }, signal?: AbortSignal): Promise<DispatchAcquireResult>;
  onChange(listener: () => void): void;
  offChange?(listener: () => void): void;
}

export interface DispatcherLog {
  warn(obj: object, msg: string): void;
}

export interface DispatcherOptions {
  pool: pg.Pool;
  client: DispatchClient;
  /** `claimed_by`; default newOwnerId(name): unique per dispatcher, i.e. per process start. */
  owner?: string;
  name?: string;
  clock?: Clock;
  pollIntervalMs?: number;
  /** Default 5000. */
  heartbeatIntervalMs?: number;
  /** Default 30 000; at least twice heartbeatIntervalMs. */
  staleAfterMs?: number;
  /** Default: heartbeatIntervalMs. */
  sweepIntervalMs?: number;
  /** Default 60 000. */
  noSlotRequeueDelayMs?: number;
  retry?: RetryPolicyOptions;
  /** Local semaphore size; default max(2, availableParallelism()). */
  localSlots?: number;
  /** Local slots only high-priority items may use; default max(1, floor(localSlots / 4)). */
  localHighReserve?: number;
  log?: DispatcherLog;
}

/** waiting: parked for a slot; running: at an execserver or on a local slot; recording: writing the outcome. */
export type CarriedPhase = 'waiting' | 'running' | 'recording';

interface Carried {
  item: ClaimedItem;
  kind: 'exec' | 'local';
  high: boolean;
  phase: CarriedPhase;
  abort: AbortController;
  lease: DispatchLease | null;
  /** A sibling requeued it (our heartbeats stalled): drop it without recording anything. */
  lost: boolean;
}

export interface DispatcherCounters {
  polls: number;
  /** Claim statements sent to the database (at most one per poll). */
  claim_queries: number;
  claimed: number;
  heartbeat_queries: number;
  sweep_queries: number;
  orphans_requeued: number;
  orphans_failed: number;
  lost: number;
  done: number;
  failed: number;
  retried: number;
  requeued_no_slot: number;
  given_back: number;
  errors: number;
}

export interface DispatcherStatus {
  owner: string;
  stopped: boolean;
  admission: {
    /** The broker client's claim share now. */
    exec_share: number;
    has_execserver: boolean;
    exec_carried: number;
    local: LocalSlotsStatus;
  };
  items: {
    claimed: number[];
    waiting: number[];
    running: number[];
  };
  timings: { poll_interval_ms: number; heartbeat_interval_ms: number; stale_after_ms: number; sweep_interval_ms: number };
  counters: DispatcherCounters;
}

function newCounters(): DispatcherCounters {
  return {
    polls: 0, claim_queries: 0, claimed: 0, heartbeat_queries: 0, sweep_queries: 0, orphans_requeued: 0, orphans_failed: 0,
    lost: 0, done: 0, failed: 0, retried: 0, requeued_no_slot: 0, given_back: 0, errors: 0,
  };
}

/** Emits 'change' after every counter or item transition (tests wait on it instead of sleeping). */
export class Dispatcher extends EventEmitter {
  readonly owner: string;
  readonly counters: DispatcherCounters = newCounters();
  readonly local: LocalSlots;
  readonly retry: RetryPolicy;
  readonly #o: DispatcherOptions;
  readonly #clock: Clock;
  readonly #pollIntervalMs: number;
  readonly #noSlotDelayMs: number;
  readonly #keeper: ClaimKeeper;
  readonly #carried = new Map<number, Carried>();
  readonly #tasks = new Set<Promise<void>>();
  #stopPoll: (() => void) | undefined;
  #started = false;
  #stopped = false;
  #stopping: Promise<void> | undefined;
  #polling = false;
  #pollDone: Promise<void> = Promise.resolve();
  #repoll = false;
  /** Per kind: did the last claim use up its budget? Then an ending item makes room for more. */
  #hungry = { exec: false, local: false };

  constructor(opts: DispatcherOptions) {
    super();
    this.#o = opts;
    this.#clock = opts.clock ?? systemClock;
    this.owner = opts.owner ?? newOwnerId(opts.name ?? 'fylr');
    this.#pollIntervalMs = opts.pollIntervalMs ?? DEFAULT_POLL_INTERVAL_MS;
    this.#noSlotDelayMs = opts.noSlotRequeueDelayMs ?? NO_SLOT_REQUEUE_DELAY_MS;
    if (!Number.isFinite(this.#pollIntervalMs) || this.#pollIntervalMs <= 0) throw new RangeError(`pollIntervalMs must be positive, got ${this.#pollIntervalMs}`);
    this.local = new LocalSlots({
      ...(opts.localSlots !== undefined ? { size: opts.localSlots } : {}),
      ...(opts.localHighReserve !== undefined ? { reserve: opts.localHighReserve } : {}),
    });
    this.retry = new RetryPolicy(opts.retry);
    this.#keeper = new ClaimKeeper({
      pool: opts.pool,
      owner: this.owner,
      clock: this.#clock,
      ...(opts.heartbeatIntervalMs !== undefined ? { heartbeatIntervalMs: opts.heartbeatIntervalMs } : {}),
      ...(opts.staleAfterMs !== undefined ? { staleAfterMs: opts.staleAfterMs } : {}),
      ...(opts.sweepIntervalMs !== undefined ? { sweepIntervalMs: opts.sweepIntervalMs } : {}),
      maxFailures: this.retry.maxFailures,
      carried: () => [...this.#carried.keys()],
      onLost: (ids) => this.#lose(ids),
      onSwept: (sweep) => {
        this.counters.orphans_requeued += sweep.requeued.length;
        this.counters.orphans_failed += sweep.failed.length;
        this.#changed();
        if (sweep.requeued.length > 0) this.wake();
      },
      onError: (what, err) => this.#warn(err, `${what} failed`),
      onQuery: (kind) => {
        if (kind === 'heartbeat') this.counters.heartbeat_queries++;
        else this.counters.sweep_queries++;
        this.#changed();
      },
    });
  }

  /** Starts the poll and the heartbeat timers, and polls once at once. Idempotent. */
  start(): void {
    if (this.#started) return;
    this.#started = true;
    this.#o.client.onChange(this.#onClientChange);
    this.#keeper.start();
    this.#stopPoll = every(this.#clock, this.#pollIntervalMs, () => this.#poll());
    this.#poll();
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  /** Admission may have changed (HELLO, a connection came or went): claim what it allows now. */
  readonly #onClientChange = (): void => {
    if (!this.#stopped) this.wake();
  };

  /** Polls now (coalesced with a poll in flight). */
  wake(): void {
    this.#poll();
  }

  /** Idempotent; see the module comment. */
  stop(): Promise<void> {
    this.#stopping ??= (async () => {
      this.#stopped = true;
      this.#stopPoll?.();
      this.#o.client.offChange?.(this.#onClientChange);
      for (const c of this.#carried.values()) if (c.phase === 'waiting') c.abort.abort();
      await this.#pollDone;
      while (this.#tasks.size > 0) await Promise.all([...this.#tasks]);
      this.#keeper.stop();
      this.#changed();
    })();
    return this.#stopping;
  }

  status(): DispatcherStatus {
    const items = [...this.#carried.values()];
    const ids = (f: (c: Carried) => boolean): number[] => items.filter(f).map((c) => c.item.id).sort((a, b) => a - b);
    const client = this.#o.client;
    return {
      owner: this.owner,
      stopped: this.#stopped,
      admission: {
        exec_share: client.admission(),
        has_execserver: client.hasExecserver(),
        exec_carried: this.#execCarried(),
        local: this.local.status(),
      },
      items: { claimed: ids(() => true), waiting: ids((c) => c.phase === 'waiting'), running: ids((c) => c.phase === 'running') },
      timings: {
        poll_interval_ms: this.#pollIntervalMs,
        heartbeat_interval_ms: this.#keeper.heartbeatIntervalMs,
        stale_after_ms: this.#keeper.staleAfterMs,
        sweep_interval_ms: this.#keeper.sweepIntervalMs,
      },
      counters: { ...this.counters },
    };
  }

  /** Ids of the items this dispatcher carries now. */
  carried(kind?: 'exec' | 'local'): number[] {
    return [...this.#carried.values()].filter((c) => kind === undefined || c.kind === kind).map((c) => c.item.id);
  }

  /** Resolves once `predicate()` holds (checked now and after every 'change'). */
  until(predicate: () => boolean): Promise<void> {
    return untilChange(this, predicate);
  }

  // ------------------------------------------------------------------ the loop

  #execCarried(): number {
    let n = 0;
    for (const c of this.#carried.values()) if (c.kind === 'exec') n++;
    return n;
  }

  #poll(): void {
    if (this.#stopped || !this.#started) return;
    if (this.#polling) {
      this.#repoll = true;
      return;
    }
    this.#polling = true;
    this.#pollDone = this.#claimRounds();
  }

  /**
   * Claim rounds until no wake-up came in meanwhile. `#polling` drops in the same synchronous
   * step that reads `#repoll` for the last time, so no wake-up can fall between the two.
   */
  async #claimRounds(): Promise<void> {
    try {
      do {
        this.#repoll = false;
        if (this.#stopped) return;
        await this.#claimRound();
      } while (this.#repoll);
    } finally {
      this.#polling = false;
    }
  }

  async #claimRound(): Promise<void> {
    this.counters.polls++;
    const exec = execBudget(this.#o.client, this.#execCarried());
    const local = this.local.budget();
    const budget = { execBound: exec, ...local };
    if (budget.execBound === 0 && budget.localBound === 0) {
      // Full: nothing to ask. An ending item wakes us.
      this.#hungry = { exec: true, local: true };
      this.#changed();
      return;
    }
    let items: ClaimedItem[];
    try {
      this.counters.claim_queries++;
      items = await claimBatch(this.#o.pool, this.owner, budget);
    } catch (e) {
      this.#warn(e, 'claim failed');
      this.#changed();
      return;
    }
    // A kind whose budget was used up (or was nil) may have more waiting: an ending item of that
    // kind makes room, so it re-polls at once. A kind that claimed less than it could drained
    // the queue; the next timer poll is soon enough for new work.
    const execClaimed = items.filter((i) => !isLocalAction(i.action)).length;
    const localClaimed = items.length - execClaimed;
    const lowClaimed = items.filter((i) => isLocalAction(i.action) && i.priority < HIGH_PRIORITY).length;
    this.#hungry = {
      exec: execClaimed >= exec,
      local: localClaimed >= local.localBound || lowClaimed >= (local.localLow ?? local.localBound),
    };
    this.counters.claimed += items.length;
    for (const item of items) this.#carry(item);
    this.#changed();
    // A stop during the claim: what we just claimed goes back at once.
    if (this.#stopped) for (const c of this.#carried.values()) if (c.phase === 'waiting') c.abort.abort();
  }

  #carry(item: ClaimedItem): void {
    const local = isLocalAction(item.action);
    const high = item.priority >= HIGH_PRIORITY;
    const c: Carried = { item, kind: local ? 'local' : 'exec', high, phase: 'waiting', abort: new AbortController(), lease: null, lost: false };
    if (local) this.local.take(high);
    this.#carried.set(item.id, c);
    const task = (local ? this.#runLocal(c) : this.#runExec(c))
      .catch((e: unknown) => this.#warn(e, 'storing an outcome failed', item.id))
      .finally(() => {
        if (local) this.local.give(high);
        this.#carried.delete(item.id);
        this.#tasks.delete(task);
        this.#changed();
        if (this.#hungry[local ? 'local' : 'exec']) this.wake();
      });
    this.#tasks.add(task);
  }

  async #runLocal(c: Carried): Promise<void> {
    c.phase = 'running';
    this.#changed();
    const receipt = await runLocalTask(c.item.action, c.item.payload, this.#clock, c.abort.signal);
    await this.#record(c, receipt);
  }

  async #runExec(c: Carried): Promise<void> {
    const { item } = c;
    const job = validateJob(item.payload, 'payload');
    if (isFieldProblem(job)) return this.#record(c, failedReceipt('invalid_job', job.message));
    job.service = item.action;
    delete job.token;
    delete job.pipes;

    let acquired: DispatchAcquireResult;
    try {
      acquired = await this.#o.client.acquire({ jobId: `${item.id}:${item.attempts}`, service: item.action, priority: item.priority }, c.abort.signal);
    } catch (e) {
      if (c.abort.signal.aborted) return this.#giveBack(c);
      return this.#record(c, failedReceipt('internal', `acquiring a slot failed: ${(e as Error).message}`));
    }
    if (acquired.kind === 'requeue') {
      if (c.abort.signal.aborted || acquired.reason === 'aborted' || acquired.reason === 'closed') return this.#giveBack(c);
      if (c.lost) return;
      c.phase = 'recording';
      this.counters.requeued_no_slot++;
      await requeue(this.#o.pool, item.id, this.owner, this.#noSlotDelayMs);
      return;
    }
    const lease = acquired.lease;
    if (c.abort.signal.aborted) {
      // Stopping (or lost) between the offer and the run: free the slot, nothing ran.
      if (lease.release) lease.release();
      else lease.cancel();
      return this.#giveBack(c);
    }
    c.lease = lease;
    c.phase = 'running';
    this.#changed();
    let receipt: Receipt;
    try {
      receipt = await lease.run(job);
    } catch (e) {
      receipt = failedReceipt('internal', `running the job failed: ${(e as Error).message}`);
    }
    // The lease lapsed or its connection closed before JOB: nothing ran, so it is no failure.
    if (receipt.error?.code === 'no_slot') return this.#giveBack(c);
    await this.#record(c, receipt);
  }

  /** Stop or loss before anything ran: back to the queue, claimable at once. */
  async #giveBack(c: Carried): Promise<void> {
    if (c.lost) return;
    c.phase = 'recording';
    this.counters.given_back++;
    await requeue(this.#o.pool, c.item.id, this.owner, 0);
  }

  async #record(c: Carried, receipt: Receipt): Promise<void> {
    if (c.lost) return;
    c.phase = 'recording';
    const { item } = c;
    if (receipt.ok) {
      if (await finish(this.#o.pool, item.id, this.owner, receipt, true)) this.counters.done++;
      return;
    }
    const verdict = this.retry.decide(item.failures, receipt);
    if (verdict.kind === 'retry') {
      if (await recordFailure(this.#o.pool, item.id, this.owner, receipt, verdict.afterMs)) this.counters.retried++;
    } else if (await recordFailure(this.#o.pool, item.id, this.owner, receipt, null)) {
      this.counters.failed++;
    }
  }

  /** A sibling requeued these while our heartbeats stalled: stop carrying them, record nothing. */
  #lose(ids: number[]): void {
    for (const id of ids) {
      const c = this.#carried.get(id);
      if (c === undefined || c.phase === 'recording') continue;
      c.lost = true;
      this.counters.lost++;
      c.abort.abort();
      c.lease?.cancel();
    }
    this.#changed();
  }

  #warn(err: unknown, msg: string, item?: number): void {
    this.counters.errors++;
    this.#o.log?.warn({ err, owner: this.owner, ...(item !== undefined ? { item } : {}) }, msg);
  }

  #changed(): void {
    this.emit('change');
  }
}
