import t from 'tap';
import type pg from 'pg';
import {
  claimBatch,
  claimStatement,
  HEARTBEAT_OWNER_PREFIX,
  heartbeat,
  newOwnerId,
  recordFailure,
  requeueOrphans,
} from '../../src/db/file-queue-claims.js';
import { HIGH_PRIORITY } from '../../src/db/file-queue-schema.js';
import { claimOne, enqueue, getItem } from '../../src/db/file-queue-store.js';
import { testSchema } from '../helpers/db.js';

const job = (service: string) => ({ service, commands: [] });

async function fill(pool: pg.Pool, rows: { action: string; priority?: number; delayMs?: number }[]): Promise<number[]> {
  const ids: number[] = [];
  for (const r of rows) ids.push(await enqueue(pool, { action: r.action, priority: r.priority ?? 0, payload: job(r.action), ...(r.delayMs !== undefined ? { delayMs: r.delayMs } : {}) }));
  return ids;
}

async function states(pool: pg.Pool): Promise<Map<number, { state: string; claimed_by: string | null; failures: number; attempts: number }>> {
  const { rows } = await pool.query<{ id: string; state: string; claimed_by: string | null; failures: number; attempts: number }>(
    'SELECT id, state, claimed_by, failures, attempts FROM file_queue',
  );
  return new Map(rows.map((r) => [Number(r.id), { state: r.state, claimed_by: r.claimed_by, failures: r.failures, attempts: r.attempts }]));
}

t.test('owner ids are unique, marked as heartbeating, and keep the name readable', async (t) => {
  const a = newOwnerId('fylr a/1');
  const b = newOwnerId('fylr a/1');
  t.not(a, b);
  t.ok(a.startsWith(`${HEARTBEAT_OWNER_PREFIX}fylr_a_1:`), a);
});

t.test('claimBatch: priority order, FIFO within a priority, exec and local budgets apart, start_after honoured', async (t) => {
  const { pool } = await testSchema(t, 'claims_order');
  const [e0a, e5, e0b, eLater, l0, l3, e9] = await fill(pool, [
    { action: 'convert', priority: 0 },
    { action: 'convert', priority: 5 },
    { action: 'convert', priority: 0 },
    { action: 'convert', priority: 100, delayMs: 60_000 },
    { action: 'checksum', priority: 0 },
    { action: 'sync', priority: 3 },
    { action: 'ffmpeg', priority: 9 },
  ]);
  const owner = newOwnerId('a');
  const first = await claimBatch(pool, owner, { execBound: 3, localBound: 0 });
  t.same(first.map((i) => i.id), [e9, e5, e0a], 'exec only, best first, the delayed item skipped');
  t.ok(first.every((i) => i.state === 'claimed' && i.claimed_by === owner && i.attempts === 1 && i.heartbeat_at !== null && i.failures === 0));
  const second = await claimBatch(pool, owner, { execBound: 5, localBound: 5 });
  t.same(second.map((i) => i.id), [l3, e0b, l0], 'both kinds, in priority order');
  t.same(await claimBatch(pool, owner, { execBound: 5, localBound: 5 }), [], 'nothing left that is due');
  t.equal((await getItem(pool, eLater!))!.state, 'queued');
  t.equal(claimStatement(owner, { execBound: 0, localBound: 0 }), null, 'an empty budget asks nothing');
  t.same(await claimBatch(pool, owner, { execBound: 0, localBound: 0 }), []);
});

t.test('claimBatch: minPriority limits both kinds', async (t) => {
  const { pool } = await testSchema(t, 'claims_min');
  const [lo, hi, llo, lhi] = await fill(pool, [
    { action: 'convert', priority: 0 },
    { action: 'convert', priority: 2 },
    { action: 'checksum', priority: 0 },
    { action: 'checksum', priority: 2 },
  ]);
  const got = await claimBatch(pool, newOwnerId('a'), { execBound: 5, localBound: 5, minPriority: 1 });
  t.same(got.map((i) => i.id).sort(), [hi, lhi].sort());
  t.equal((await getItem(pool, lo!))!.state, 'queued');
  t.equal((await getItem(pool, llo!))!.state, 'queued');
});

t.test('claimBatch: the local low-priority allowance keeps the rest of the local budget for high priority', async (t) => {
  const { pool } = await testSchema(t, 'claims_reserve');
  const low = await fill(pool, Array.from({ length: 5 }, () => ({ action: 'checksum', priority: 0 })));
  const owner = newOwnerId('a');
  const a = await claimBatch(pool, owner, { execBound: 0, localBound: 4, localLow: 3 });
  t.same(a.map((i) => i.id), low.slice(0, 3), 'three low items, the fourth slot held back');
  const [h1, h2] = await fill(pool, [{ action: 'sync', priority: HIGH_PRIORITY }, { action: 'copy_move', priority: HIGH_PRIORITY + 4 }]);
  const b = await claimBatch(pool, owner, { execBound: 0, localBound: 1, localLow: 0 });
  t.same(b.map((i) => i.id), [h2], 'the reserved slot goes to the best high item');
  const c = await claimBatch(pool, owner, { execBound: 0, localBound: 3, localLow: 3 });
  t.same(c.map((i) => i.id), [h1, low[3], low[4]], 'high first, then low in what is left');
});

t.test('claimBatch: concurrent claimers never share an item and leave nothing behind', async (t) => {
  const db = await testSchema(t, 'claims_race');
  const n = 600;
  await db.pool.query(
    `INSERT INTO file_queue (action, priority, payload)
     SELECT CASE WHEN g % 4 = 0 THEN 'checksum' ELSE 'convert' END, g % 3, '{}'::jsonb FROM generate_series(1, $1) g`,
    [n],
  );
  const claimers = Array.from({ length: 8 }, (_, i) => ({ owner: newOwnerId(`c${i}`), pool: db.newPool(2), got: [] as number[] }));
  await Promise.all(
    claimers.map(async (c) => {
      for (;;) {
        const items = await claimBatch(c.pool, c.owner, { execBound: 7, localBound: 3 });
        if (items.length === 0) return;
        c.got.push(...items.map((i) => i.id));
      }
    }),
  );
  const all = claimers.flatMap((c) => c.got);
  t.equal(all.length, n, 'every item claimed');
  t.equal(new Set(all).size, n, 'no item claimed twice');
  const s = await states(db.pool);
  for (const c of claimers) for (const id of c.got) if (s.get(id)!.claimed_by !== c.owner) t.fail(`item ${id} not owned by its claimer`);
  t.ok([...s.values()].every((r) => r.state === 'claimed' && r.attempts === 1));
  t.ok(claimers.filter((c) => c.got.length > 0).length >= 2, 'the work was spread over several claimers');
});

t.test('heartbeat: refreshes only the owner\'s live claims and reports the ones it still holds', async (t) => {
  const { pool } = await testSchema(t, 'claims_hb');
  await fill(pool, [{ action: 'convert' }, { action: 'convert' }, { action: 'convert' }]);
  const a = newOwnerId('a');
  const b = newOwnerId('b');
  const [x, y] = (await claimBatch(pool, a, { execBound: 2, localBound: 0 })).map((i) => i.id);
  const [z] = (await claimBatch(pool, b, { execBound: 1, localBound: 0 })).map((i) => i.id);
  await pool.query(`UPDATE file_queue SET heartbeat_at = now() - interval '1 hour'`);
  t.same((await heartbeat(pool, a, [x!, y!, z!])).sort(), [x, y].sort(), 'z belongs to b');
  const { rows } = await pool.query<{ id: string; fresh: boolean }>(`SELECT id, heartbeat_at > now() - interval '1 minute' AS fresh FROM file_queue`);
  const fresh = new Map(rows.map((r) => [Number(r.id), r.fresh]));
  t.same([fresh.get(x!), fresh.get(y!), fresh.get(z!)], [true, true, false]);
  t.same(await heartbeat(pool, a, []), [], 'nothing carried: no query');
});

t.test('requeueOrphans: stale claims of other heartbeating owners only', async (t) => {
  const { pool } = await testSchema(t, 'claims_orphans');
  await fill(pool, Array.from({ length: 5 }, () => ({ action: 'convert' })));
  const me = newOwnerId('me');
  const dead = newOwnerId('dead');
  const live = newOwnerId('live');
  const [mine] = (await claimBatch(pool, me, { execBound: 1, localBound: 0 })).map((i) => i.id);
  const deadIds = (await claimBatch(pool, dead, { execBound: 2, localBound: 0 })).map((i) => i.id);
  const [liveId] = (await claimBatch(pool, live, { execBound: 1, localBound: 0 })).map((i) => i.id);
  const legacy = await claimOne(pool, 'legacy-fylr-1234');
  t.ok(legacy, 'an old-pool claim (no heartbeats)');
  await pool.query(`UPDATE file_queue SET heartbeat_at = now() - interval '10 seconds' WHERE id <> $1`, [liveId]);

  t.same(await requeueOrphans(pool, 60_000, me), { requeued: [], failed: [] }, 'nothing is older than a minute');
  const sweep = await requeueOrphans(pool, 5_000, me);
  t.same(sweep, { requeued: deadIds, failed: [] }, "only the dead owner's claims");
  const s = await states(pool);
  t.equal(s.get(mine!)!.claimed_by, me, 'never my own');
  t.equal(s.get(liveId!)!.claimed_by, live, 'never a fresh heartbeat');
  t.equal(s.get(legacy!.id)!.claimed_by, 'legacy-fylr-1234', 'never an old-pool claim');
  for (const id of deadIds) t.match(s.get(id), { state: 'queued', claimed_by: null, failures: 1, attempts: 1 });
  const again = await claimBatch(pool, live, { execBound: 5, localBound: 0 });
  t.same(again.map((i) => i.id), deadIds, 'requeued orphans are claimable at once');
  t.ok(again.every((i) => i.attempts === 2));
});

t.test('requeueOrphans: an item orphaned maxFailures times ends failed with the receipt', async (t) => {
  const { pool } = await testSchema(t, 'claims_orph_cap');
  const [id] = await fill(pool, [{ action: 'convert' }]);
  const receipt = { ok: false, error: { code: 'stopped', message: 'orphaned' } };
  for (let round = 1; round <= 3; round++) {
    const owner = newOwnerId(`crash${round}`);
    t.equal((await claimBatch(pool, owner, { execBound: 1, localBound: 0 })).length, 1, `claim ${round}`);
    await pool.query(`UPDATE file_queue SET heartbeat_at = now() - interval '1 minute'`);
    const sweep = await requeueOrphans(pool, 1000, 'someone-else', { maxFailures: 3, receipt });
    t.same(sweep, round < 3 ? { requeued: [id], failed: [] } : { requeued: [], failed: [id] });
  }
  const item = await getItem(pool, id!);
  t.equal(item!.state, 'failed');
  t.same(item!.receipt, receipt);
});

t.test('recordFailure: retry with a delay, or final; only by the owner', async (t) => {
  const { pool } = await testSchema(t, 'claims_fail');
  const [id] = await fill(pool, [{ action: 'convert' }]);
  const owner = newOwnerId('a');
  await claimBatch(pool, owner, { execBound: 1, localBound: 0 });
  t.equal(await recordFailure(pool, id!, 'hb:other', { ok: false }, 0), false, 'not the owner');
  t.equal(await recordFailure(pool, id!, owner, { ok: false, n: 1 }, 60_000), true);
  let s = (await states(pool)).get(id!)!;
  t.match(s, { state: 'queued', failures: 1, claimed_by: null });
  t.same(await claimBatch(pool, owner, { execBound: 1, localBound: 0 }), [], 'not due before the backoff');
  await pool.query(`UPDATE file_queue SET start_after = now() - interval '1 ms'`);
  t.equal((await claimBatch(pool, owner, { execBound: 1, localBound: 0 }))[0]!.failures, 1);
  t.equal(await recordFailure(pool, id!, owner, { ok: false, n: 2 }, null), true);
  s = (await states(pool)).get(id!)!;
  t.match(s, { state: 'failed', failures: 2, attempts: 2 });
  t.same((await getItem(pool, id!))!.receipt, { ok: false, n: 2 });
  t.equal(await recordFailure(pool, id!, owner, { ok: false }, null), false, 'no longer claimed');
});

t.test('the claim, heartbeat and sweep statements can use the partial indexes (plans)', async (t) => {
  const { pool } = await testSchema(t, 'claims_plan');
  const c = await pool.connect();
  t.teardown(() => c.release());
  await c.query('SET enable_seqscan = off');
  const plan = async (text: string, values: unknown[]): Promise<string> => {
    await c.query('BEGIN');
    try {
      const { rows } = await c.query(`EXPLAIN ${text}`, values);
      return rows.map((r: Record<string, string>) => r['QUERY PLAN']).join('\n');
    } finally {
      await c.query('ROLLBACK');
    }
  };
  const s = claimStatement('hb:x', { execBound: 3, localBound: 2, localLow: 1 })!;
  const p = await plan(s.text, s.values);
  t.match(p, /file_queue_queued_exec_idx/, 'exec claim: its own partial index');
  t.match(p, /file_queue_queued_local_idx/, 'local claim: its own partial index');
  t.notMatch(p, /Seq Scan/);
  const sweep = await plan(
    `SELECT id FROM file_queue WHERE state = 'claimed' AND heartbeat_at < now() - interval '1 s' AND starts_with(claimed_by, 'hb:') AND claimed_by <> 'x'`,
    [],
  );
  t.match(sweep, /file_queue_claimed_idx/, 'orphan sweep: the heartbeat index');
});
