/**
 * The claim query at 1M rows (docs/dispatcher.md quotes this test's output): 900k done, 100k
 * queued (10% of them local-bound), five priorities. Rows come from one generate_series INSERT.
 */
import t from 'tap';
import type pg from 'pg';
import { claimStatement } from '../../src/db/file-queue-claims.js';
import { testSchema } from '../helpers/db.js';

const ROWS = 1_000_000;

async function explain(pool: pg.Pool, text: string, values: unknown[]): Promise<{ plan: string; ms: number }> {
  const c = await pool.connect();
  try {
    await c.query('BEGIN');
    const { rows } = await c.query(`EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON) ${text}`, values);
    await c.query('ROLLBACK');
    const plan = rows.map((r: Record<string, string>) => r['QUERY PLAN']).join('\n');
    const ms = Number(/Execution Time: ([0-9.]+) ms/.exec(plan)?.[1]);
    return { plan, ms };
  } finally {
    c.release();
  }
}

t.test('EXPLAIN ANALYZE of the claim query at 1M rows', async (t) => {
  const { pool } = await testSchema(t, 'explain1m');
  const t0 = Date.now();
  await pool.query(
    `INSERT INTO file_queue (priority, action, payload, state, start_after)
     SELECT ((g / 10) % 5) - 2,
            CASE WHEN g % 10 = 0 THEN 'checksum' ELSE 'convert' END,
            '{"service": "convert", "commands": []}'::jsonb,
            CASE WHEN g % 100 < 90 THEN 'done' ELSE 'queued' END,
            now() - interval '1 second'
       FROM generate_series(1, $1::integer) g`,
    [ROWS],
  );
  const insertMs = Date.now() - t0;
  await pool.query('ANALYZE file_queue');
  t.comment(`generated ${ROWS} rows in ${insertMs} ms (+ ANALYZE ${Date.now() - t0 - insertMs} ms)`);

  const busy = claimStatement('hb:explain', { execBound: 10, localBound: 2, localLow: 1 })!;
  const b = await explain(pool, busy.text, busy.values);
  t.comment(`claim of 10 exec + 2 local items, 100k queued:\n${b.plan}`);
  t.match(b.plan, /Index Scan using file_queue_queued_exec_idx/);
  t.match(b.plan, /Index Scan using file_queue_queued_local_idx/);
  t.notMatch(b.plan, /Seq Scan/);
  t.match(b.plan, /Update on file_queue f .*rows=12 loops=1/, 'twelve rows claimed');
  // Time is a benchmark's business, not a test's: it is printed (docs/dispatcher.md quotes it), never asserted.
  t.comment(`claim executes in ${b.ms} ms`);

  // The idle poll: nothing queued (everything done), the common case of a quiet fleet.
  await pool.query(`UPDATE file_queue SET state = 'done' WHERE state = 'queued'`);
  await pool.query('VACUUM ANALYZE file_queue');
  const idle = claimStatement('hb:explain', { execBound: 10, localBound: 2, localLow: 1 })!;
  const i = await explain(pool, idle.text, idle.values);
  t.comment(`idle poll, 1M done rows, nothing queued:\n${i.plan}`);
  t.notMatch(i.plan, /Seq Scan/);
  t.comment(`idle poll executes in ${i.ms} ms`);
});
