/**
 * The new dispatcher's side of `file_queue` (schema: file-queue-schema.ts; the single-item
 * moves `finish`/`requeue` of the old pool live in file-queue-store.ts and are reused).
 *
 *            claimBatch (one statement, FOR UPDATE SKIP LOCKED, priority order)
 *   queued ───────────────────────────────────────────────────────────────► claimed
 *     ▲  ▲                                                                    │ │ │
 *     │  └── recordFailure(retry)  failures+1, start_after = now()+backoff ───┘ │ │
 *     │                                                                         │ │
 *     └───── requeueOrphans  heartbeat older than the threshold, owner ≠ me ────┘ │
 *            (failures+1; at the cap: failed)                                     │
 *   failed ◄── recordFailure(final) ──────────────────────────────────────────────┘
 *
 * Every move names the owner and applies only while the row is still claimed by it, so a fylr
 * that lost a claim cannot overwrite the new owner's result. All times are the database's.
 *
 * Heartbeats: a claimer that heartbeats says so in its owner id (`HEARTBEAT_OWNER_PREFIX`). Only
 * such claims are ever requeued as orphans: the old worker pool (legacy/) never refreshes
 * `heartbeat_at`, so on a shared database its long-carried but live claims must not look stale.
 */
import { randomUUID } from 'node:crypto';
import { HIGH_PRIORITY, LOCAL_ACTIONS } from './file-queue-schema.js';
import type { FileQueueItem, Queryable } from './file-queue-store.js';

/** `claimed_by` of every heartbeating claimer starts with this. */
export const HEARTBEAT_OWNER_PREFIX = 'hb:';

/** A fresh owner id for one process start (or one dispatcher instance): never reused. */
export function newOwnerId(name: string): string {
  const clean = name.replace(/[^A-Za-z0-9_.-]/g, '_').slice(0, 60) || 'fylr';
  return `${HEARTBEAT_OWNER_PREFIX}${clean}:${randomUUID()}`;
}

export interface ClaimedItem extends FileQueueItem {
  /** Failed executions so far (the retry cap counts these, not claims). */
  failures: number;
}

export interface ClaimBudget {
  /** At most this many exec-bound items (any action not in LOCAL_ACTIONS). */
  execBound: number;
  /** At most this many local-bound items (LOCAL_ACTIONS). */
  localBound: number;
  /**
   * Of the local-bound items, at most this many below HIGH_PRIORITY; the rest of `localBound`
   * stays for high-priority work. Default: `localBound` (no reserve).
   */
  localLow?: number;
  /** Only items with priority >= this (both kinds). */
  minPriority?: number;
}

const COLUMNS =
  'id, priority, action, payload, state, start_after, claimed_by, claimed_at, heartbeat_at, attempts, failures, receipt, created_at, updated_at';

interface Row extends Omit<ClaimedItem, 'id'> {
  id: string | number;
}

function toItem(row: Row): ClaimedItem {
  return { ...row, id: Number(row.id) };
}

function assertCount(n: number, what: string): void {
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`${what} must be a non-negative integer, got ${n}`);
}

function assertMs(ms: number, what: string): void {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`${what} must be a non-negative number of ms, got ${ms}`);
}

/**
 * The local-action list as SQL literals. It must read exactly like the predicates of migration 2
 * (`file_queue_queued_local_idx`, `file_queue_queued_exec_idx`), or the planner cannot use them.
 */
const LOCAL_LIST = LOCAL_ACTIONS.map((a) => `'${a.replace(/'/g, "''")}'`).join(', ');
const EXEC_WHERE = `state = 'queued' AND action NOT IN (${LOCAL_LIST})`;
const LOCAL_WHERE = `state = 'queued' AND action IN (${LOCAL_LIST})`;

/**
 * The claim statement for a budget, or null when the budget is empty (then nothing is asked).
 * `$1` is the owner. Exported for the EXPLAIN test and docs/dispatcher.md.
 */
export function claimStatement(owner: string, budget: ClaimBudget): { text: string; values: unknown[] } | null {
  assertCount(budget.execBound, 'execBound');
  assertCount(budget.localBound, 'localBound');
  const localLow = Math.min(budget.localLow ?? budget.localBound, budget.localBound);
  assertCount(localLow, 'localLow');
  if (budget.minPriority !== undefined && !Number.isSafeInteger(budget.minPriority)) {
    throw new RangeError(`minPriority must be an integer, got ${budget.minPriority}`);
  }
  if (budget.execBound === 0 && budget.localBound === 0) return null;

  const values: unknown[] = [owner];
  const param = (v: unknown, type: string): string => {
    values.push(v);
    return `$${values.length}::${type}`;
  };
  const min = budget.minPriority === undefined ? '' : ` AND priority >= ${param(budget.minPriority, 'integer')}`;
  const ready = `start_after <= now()${min}`;
  const parts: string[] = [];
  const picks: string[] = [];
  if (budget.execBound > 0) {
    parts.push(`exec_pick AS (
      SELECT id FROM file_queue WHERE ${EXEC_WHERE} AND ${ready}
       ORDER BY priority DESC, id LIMIT ${param(budget.execBound, 'integer')} FOR UPDATE SKIP LOCKED)`);
    picks.push('SELECT id FROM exec_pick');
  }
  if (budget.localBound > 0) {
    // High-priority local work first (it may use the whole local budget), then low-priority
    // work in what is left of it, capped by the low allowance.
    const high = param(HIGH_PRIORITY, 'integer');
    const localLimit = param(budget.localBound, 'integer');
    parts.push(`local_high AS (
      SELECT id FROM file_queue WHERE ${LOCAL_WHERE} AND ${ready} AND priority >= ${high}
       ORDER BY priority DESC, id LIMIT ${localLimit} FOR UPDATE SKIP LOCKED)`);
    picks.push('SELECT id FROM local_high');
    if (localLow > 0) {
      parts.push(`local_low AS (
      SELECT id FROM file_queue WHERE ${LOCAL_WHERE} AND ${ready} AND priority < ${high}
       ORDER BY priority DESC, id
       LIMIT least(${param(localLow, 'integer')}, ${localLimit} - (SELECT count(*) FROM local_high)) FOR UPDATE SKIP LOCKED)`);
      picks.push('SELECT id FROM local_low');
    }
  }
  const text = `WITH ${parts.join(',\n    ')}
    UPDATE file_queue f
       SET state = 'claimed', claimed_by = $1, claimed_at = now(), heartbeat_at = now(),
           attempts = f.attempts + 1, updated_at = now()
      FROM (${picks.join(' UNION ALL ')}) p
     WHERE f.id = p.id
    RETURNING ${COLUMNS.split(', ').map((c) => `f.${c}`).join(', ')}`;
  return { text, values };
}

/**
 * Claims up to the budget's items for `owner` in one statement: each kind in priority order
 * (priority DESC, then id: FIFO within a priority), skipping rows other claimers hold locked, so
 * concurrent claimers never wait for nor take the same row. Resolves with the claimed items in
 * priority order.
 */
export async function claimBatch(db: Queryable, owner: string, budget: ClaimBudget): Promise<ClaimedItem[]> {
  const stmt = claimStatement(owner, budget);
  if (stmt === null) return [];
  const { rows } = await db.query<Row>(stmt.text, stmt.values);
  return rows.map(toItem).sort((a, b) => b.priority - a.priority || a.id - b.id);
}

/**
 * Refreshes `heartbeat_at` of the given claims of `owner`. Resolves with the ids still claimed by
 * it: an id missing from the answer was lost (requeued as an orphan, or finished elsewhere).
 */
export async function heartbeat(db: Queryable, owner: string, ids: readonly number[]): Promise<number[]> {
  if (ids.length === 0) return [];
  const { rows } = await db.query<{ id: string }>(
    `UPDATE file_queue SET heartbeat_at = now()
      WHERE id = ANY($2::bigint[]) AND state = 'claimed' AND claimed_by = $1
      RETURNING id`,
    [owner, ids],
  );
  return rows.map((r) => Number(r.id));
}

export interface OrphanOptions {
  /** An orphaned claim counts as a failed execution; at this many failures the item ends failed. */
  maxFailures?: number;
  /** The receipt stored on an item that ends failed this way. */
  receipt?: unknown;
}

export interface OrphanSweep {
  /** Back to queued, claimable at once. */
  requeued: number[];
  /** Over the failure cap: ended failed. */
  failed: number[];
}

/**
 * Requeues claims of heartbeating owners other than `exceptOwner` whose heartbeat is older than
 * `staleAfterMs` (the database's clock): their owner stopped heartbeating, so it is gone. A live
 * owner's claims are never touched as long as it heartbeats more often than the threshold.
 */
export async function requeueOrphans(db: Queryable, staleAfterMs: number, exceptOwner: string, opts: OrphanOptions = {}): Promise<OrphanSweep> {
  assertMs(staleAfterMs, 'staleAfterMs');
  const maxFailures = opts.maxFailures ?? 2 ** 31 - 1;
  assertCount(maxFailures, 'maxFailures');
  const { rows } = await db.query<{ id: string; state: string }>(
    `UPDATE file_queue
        SET state = CASE WHEN failures + 1 >= $3 THEN 'failed' ELSE 'queued' END,
            receipt = CASE WHEN failures + 1 >= $3 THEN $4::jsonb ELSE receipt END,
            failures = failures + 1,
            start_after = now(), claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, updated_at = now()
      WHERE state = 'claimed'
        AND heartbeat_at < now() - ($1::double precision * interval '1 millisecond')
        AND starts_with(claimed_by, $5) AND claimed_by <> $2
      RETURNING id, state`,
    [staleAfterMs, exceptOwner, maxFailures, JSON.stringify(opts.receipt ?? null), HEARTBEAT_OWNER_PREFIX],
  );
  const sweep: OrphanSweep = { requeued: [], failed: [] };
  for (const r of rows) (r.state === 'failed' ? sweep.failed : sweep.requeued).push(Number(r.id));
  sweep.requeued.sort((a, b) => a - b);
  sweep.failed.sort((a, b) => a - b);
  return sweep;
}

/**
 * A claimed item's execution failed: `failures` + 1 and the receipt is stored; with
 * `retryAfterMs` it goes back to the queue, claimable that long after now(), else it ends
 * failed. Same owner rule as `finish`; resolves with whether it applied.
 */
export async function recordFailure(db: Queryable, id: number, owner: string, receipt: unknown, retryAfterMs: number | null): Promise<boolean> {
  if (retryAfterMs !== null) assertMs(retryAfterMs, 'retryAfterMs');
  const res = await db.query(
    retryAfterMs === null
      ? `UPDATE file_queue
            SET state = 'failed', failures = failures + 1, receipt = $3::jsonb, heartbeat_at = NULL, updated_at = now()
          WHERE id = $1 AND state = 'claimed' AND claimed_by = $2`
      : `UPDATE file_queue
            SET state = 'queued', failures = failures + 1, receipt = $3::jsonb,
                start_after = now() + ($4::double precision * interval '1 millisecond'),
                claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, updated_at = now()
          WHERE id = $1 AND state = 'claimed' AND claimed_by = $2`,
    retryAfterMs === null ? [id, owner, JSON.stringify(receipt ?? null)] : [id, owner, JSON.stringify(receipt ?? null), retryAfterMs],
  );
  return res.rowCount === 1;
}
