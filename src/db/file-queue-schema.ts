/**
 * The one owner of the `file_queue` schema, shared by the new dispatcher (src/fylr/) and the old
 * worker pool (legacy/). Migrations are append-only; each runs once, in order, under an advisory
 * lock so that several fylr servers starting together do not race.
 *
 * Claim query the indexes serve (both transports):
 *   SELECT ... FROM file_queue WHERE state = 'queued' AND start_after <= now()
 *   ORDER BY priority DESC, id LIMIT n FOR UPDATE SKIP LOCKED
 * `file_queue_queued_idx` is partial (queued rows only), so done rows, however many, cost nothing.
 */
import type pg from 'pg';

export const FILE_QUEUE_STATES = ['queued', 'claimed', 'done', 'failed'] as const;
export type FileQueueState = (typeof FILE_QUEUE_STATES)[number];

/** Actions that run on the fylr itself, not on an execserver. Everything else names a service. */
export const LOCAL_ACTIONS = ['sync', 'checksum', 'copy_move'] as const;

/**
 * Items at or above this priority are "high": the old pool's `parallelHigh` workers take only
 * these, and the new dispatcher keeps a fraction of its local slots for them.
 */
export const HIGH_PRIORITY = 1;

export function isLocalAction(action: string): boolean {
  return (LOCAL_ACTIONS as readonly string[]).includes(action);
}

const MIGRATIONS: readonly string[] = [
  // 1: the queue
  `CREATE TABLE file_queue (
     id           bigserial PRIMARY KEY,
     priority     integer     NOT NULL DEFAULT 0,
     action       text        NOT NULL,
     payload      jsonb       NOT NULL DEFAULT '{}'::jsonb,
     state        text        NOT NULL DEFAULT 'queued'
                  CHECK (state IN ('queued', 'claimed', 'done', 'failed')),
     start_after  timestamptz NOT NULL DEFAULT now(),
     claimed_by   text,
     claimed_at   timestamptz,
     heartbeat_at timestamptz,
     attempts     integer     NOT NULL DEFAULT 0,
     receipt      jsonb,
     created_at   timestamptz NOT NULL DEFAULT now(),
     updated_at   timestamptz NOT NULL DEFAULT now()
   );
   CREATE INDEX file_queue_queued_idx ON file_queue (priority DESC, id) INCLUDE (start_after, action)
     WHERE state = 'queued';
   CREATE INDEX file_queue_claimed_idx ON file_queue (heartbeat_at) WHERE state = 'claimed';
   CREATE INDEX file_queue_claimed_by_idx ON file_queue (claimed_by) WHERE state = 'claimed';`,
  // 2: the new dispatcher (src/db/file-queue-claims.ts). It claims exec-bound and local-bound
  // items in separate budgets, so each kind gets its own partial index: a poll that wants only
  // local work never walks a million queued exec items, and vice versa. The predicates must match
  // the claim query's literally (the planner proves index usability from the text); the list is
  // LOCAL_ACTIONS as of this migration, and test/db/file-queue-claims.test.ts checks the plans.
  // `failures` counts failed executions (the retry cap), apart from `attempts` (claims), so that a
  // "no slot" requeue does not use up a poison item's retries.
  `CREATE INDEX file_queue_queued_exec_idx ON file_queue (priority DESC, id)
     WHERE state = 'queued' AND action NOT IN ('sync', 'checksum', 'copy_move');
   CREATE INDEX file_queue_queued_local_idx ON file_queue (priority DESC, id)
     WHERE state = 'queued' AND action IN ('sync', 'checksum', 'copy_move');
   ALTER TABLE file_queue ADD COLUMN failures integer NOT NULL DEFAULT 0;`,
];

export const SCHEMA_VERSION = MIGRATIONS.length;

/** An arbitrary constant: the advisory lock key that serialises migrations. */
const MIGRATION_LOCK_KEY = 80119;

/** Creates or migrates the schema in the pool's current search_path. Idempotent. */
export async function migrateFileQueue(pool: pg.Pool): Promise<number> {
  const client = await pool.connect();
  try {
    await client.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK_KEY]);
    await client.query(
      `CREATE TABLE IF NOT EXISTS slotgate_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`,
    );
    const { rows } = await client.query<{ v: number | null }>('SELECT max(version) AS v FROM slotgate_migrations');
    const current = rows[0]?.v ?? 0;
    for (let v = current + 1; v <= MIGRATIONS.length; v++) {
      await client.query('BEGIN');
      try {
        await client.query(MIGRATIONS[v - 1] as string);
        await client.query('INSERT INTO slotgate_migrations (version) VALUES ($1)', [v]);
        await client.query('COMMIT');
      } catch (e) {
        await client.query('ROLLBACK');
        throw e;
      }
    }
    return MIGRATIONS.length;
  } finally {
    await client.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK_KEY]).catch(() => undefined);
    client.release();
  }
}
