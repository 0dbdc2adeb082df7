/**
 * Typed access to `file_queue` (schema: file-queue-schema.ts), shared by both transports.
 *
 * An item's life:
 *
 *   queued --claim--> claimed --finish(ok)--> done
 *     ^                  |  \---finish(!ok)--> failed
 *     +----requeue-------+
 *
 * Every move out of `claimed` names the owner that claimed it and applies only while the row is
 * still claimed by that owner, so a fylr that lost its claim (requeued as an orphan by a sibling)
 * cannot overwrite the new owner's result. Times in the table are the database's clock
 * (`now()`), never the caller's.
 *
 * `claimOne` is the OLD claim of the per-worker pool: one transaction per worker per poll. The
 * new dispatcher adds its batch claim and heartbeats to this module.
 */
import type pg from 'pg';
import { type FileQueueState, HIGH_PRIORITY } from './file-queue-schema.js';

/** What a query can run on: a pool or one checked-out client. */
export type Queryable = Pick<pg.Pool, 'query'>;

export interface FileQueueItem {
  id: number;
  priority: number;
  action: string;
  payload: unknown;
  state: FileQueueState;
  start_after: Date;
  claimed_by: string | null;
  claimed_at: Date | null;
  heartbeat_at: Date | null;
  attempts: number;
  /** The receipt of the last finished attempt (PROTOCOL.md §4), as stored. */
  receipt: unknown;
  created_at: Date;
  updated_at: Date;
}

export interface EnqueueInput {
  action: string;
  priority?: number;
  payload: unknown;
  /** Not claimable before this instant (the caller's clock: prefer `delayMs`). */
  startAfter?: Date;
  /** Not claimable before the database's `now()` plus this many milliseconds. */
  delayMs?: number;
}

const COLUMNS =
  'id, priority, action, payload, state, start_after, claimed_by, claimed_at, heartbeat_at, attempts, receipt, created_at, updated_at';

/** A `file_queue` row as pg returns it. */
type Row = Omit<FileQueueItem, 'id'> & { id: string | number };

/** bigserial arrives as a string; ids stay far below 2^53. */
function toItem(row: Row): FileQueueItem {
  return { ...row, id: Number(row.id) };
}

function assertDelay(ms: number, what: string): void {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`${what} must be a non-negative number of ms, got ${ms}`);
}

/** Inserts a queued item; resolves with its id. */
export async function enqueue(db: Queryable, input: EnqueueInput): Promise<number> {
  const priority = input.priority ?? 0;
  if (!Number.isSafeInteger(priority)) throw new RangeError(`priority must be an integer, got ${priority}`);
  if (input.delayMs !== undefined) assertDelay(input.delayMs, 'delayMs');
  const { rows } = await db.query<{ id: string }>(
    `INSERT INTO file_queue (action, priority, payload, start_after)
     VALUES ($1, $2, $3::jsonb, COALESCE($4::timestamptz, now()) + ($5::double precision * interval '1 millisecond'))
     RETURNING id`,
    [input.action, priority, JSON.stringify(input.payload ?? {}), input.startAfter ?? null, input.delayMs ?? 0],
  );
  return Number(rows[0]!.id);
}

export async function getItem(db: Queryable, id: number): Promise<FileQueueItem | null> {
  if (!Number.isSafeInteger(id) || id <= 0) return null;
  const { rows } = await db.query<Row>(`SELECT ${COLUMNS} FROM file_queue WHERE id = $1`, [id]);
  return rows[0] === undefined ? null : toItem(rows[0]);
}

export interface ClaimOptions {
  /** Only items with priority >= HIGH_PRIORITY (the old `parallelHigh` workers). */
  highOnly?: boolean;
}

/**
 * The old claim: in one transaction, lock the best claimable row (`FOR UPDATE SKIP LOCKED`, so
 * concurrent claimers never wait for nor take the same row) and mark it claimed by `owner`.
 * Resolves with the claimed item, or null when nothing is claimable.
 */
export async function claimOne(pool: pg.Pool, owner: string, opts: ClaimOptions = {}): Promise<FileQueueItem | null> {
  const client = await pool.connect();
  let released = false;
  try {
    await client.query('BEGIN');
    const high = opts.highOnly === true ? 'AND priority >= $1' : '';
    const { rows } = await client.query<{ id: string }>(
      `SELECT id FROM file_queue
        WHERE state = 'queued' AND start_after <= now() ${high}
        ORDER BY priority DESC, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED`,
      opts.highOnly === true ? [HIGH_PRIORITY] : [],
    );
    const picked = rows[0];
    if (picked === undefined) {
      await client.query('COMMIT');
      return null;
    }
    const updated = await client.query<Row>(
      `UPDATE file_queue
          SET state = 'claimed', claimed_by = $2, claimed_at = now(), heartbeat_at = now(),
              attempts = attempts + 1, updated_at = now()
        WHERE id = $1
        RETURNING ${COLUMNS}`,
      [picked.id, owner],
    );
    await client.query('COMMIT');
    return toItem(updated.rows[0]!);
  } catch (e) {
    await client.query('ROLLBACK').catch(() => undefined);
    // A client whose connection broke must not go back into the pool.
    client.release(e instanceof Error ? e : true);
    released = true;
    throw e;
  } finally {
    if (!released) client.release();
  }
}

/**
 * Ends a claimed item: `done` when `ok`, else `failed`, storing the receipt. Applies only while
 * the item is still claimed by `owner`; resolves with whether it applied.
 */
export async function finish(db: Queryable, id: number, owner: string, receipt: unknown, ok: boolean): Promise<boolean> {
  const res = await db.query(
    `UPDATE file_queue
        SET state = $3, receipt = $4::jsonb, heartbeat_at = NULL, updated_at = now()
      WHERE id = $1 AND state = 'claimed' AND claimed_by = $2`,
    [id, owner, ok ? 'done' : 'failed', JSON.stringify(receipt ?? null)],
  );
  return res.rowCount === 1;
}

/**
 * Puts a claimed item back in the queue, claimable again `delayMs` after the database's now()
 * (the old client: 60 000 after connectTimeoutSec without a slot). Same owner rule as finish.
 */
export async function requeue(db: Queryable, id: number, owner: string, delayMs: number): Promise<boolean> {
  assertDelay(delayMs, 'delayMs');
  const res = await db.query(
    `UPDATE file_queue
        SET state = 'queued', start_after = now() + ($3::double precision * interval '1 millisecond'),
            claimed_by = NULL, claimed_at = NULL, heartbeat_at = NULL, updated_at = now()
      WHERE id = $1 AND state = 'claimed' AND claimed_by = $2`,
    [id, owner, delayMs],
  );
  return res.rowCount === 1;
}
