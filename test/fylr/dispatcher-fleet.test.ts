/**
 * Several fylr servers (each: its own ExecClient, database pool and Dispatcher, as separate
 * processes would have) on ONE queue of 2,000 items and ONE real native execserver. Executions
 * are counted at the execserver: its slot source (each job names its item by a marker) and its
 * `slotgate_jobs_total` metric.
 */
import t, { type Test } from 'tap';
import { Dispatcher } from '../../src/fylr/dispatcher.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import { testSchema } from '../helpers/db.js';
import { countStates, execClientConfig, insertItems, startObservedExec, waitFor } from './dispatcher-fixtures.js';

const ITEMS = 2000;

async function fleet(t: Test, fylrs: number): Promise<void> {
  const db = await testSchema(t, `fleet${fylrs}`);
  const ex = await startObservedExec(t, { slots: 8 });
  const items = await insertItems(db.pool, ITEMS);
  const started = Date.now();
  const ds: Dispatcher[] = [];
  for (let i = 0; i < fylrs; i++) {
    const client = new ExecClient(execClientConfig([ex.url]), { name: `fylr${i}` });
    await client.start();
    const d = new Dispatcher({ pool: db.newPool(5), client, name: `fylr${i}`, heartbeatIntervalMs: 200, staleAfterMs: 3000 });
    t.teardown(async () => {
      await d.stop();
      await client.close();
    });
    ds.push(d);
  }
  for (const d of ds) d.start();

  await waitFor('every item done', async () => (await countStates(db.pool)).done === ITEMS, 60_000, 50);
  const elapsed = Date.now() - started;
  t.same(await countStates(db.pool), { queued: 0, claimed: 0, done: ITEMS, failed: 0 }, 'all done, none left claimed');

  const ok = ex.source.okByMarker();
  t.equal(ex.source.started.length, ITEMS, 'exactly 2,000 executions reached the execserver');
  t.equal(ok.size, ITEMS, 'every item executed');
  t.ok([...ok.values()].every((n) => n === 1), 'no item executed twice');
  t.ok([...items.keys()].every((m) => ok.get(m) === 1), 'each marker is one of our items');
  t.equal(await ex.jobsTotal(), ITEMS, 'slotgate_jobs_total agrees');

  const { rows } = await db.pool.query<{ attempts: number; failures: number; n: string }>(
    'SELECT attempts, failures, count(*) AS n FROM file_queue GROUP BY attempts, failures',
  );
  t.same(rows.map((r) => [r.attempts, r.failures, Number(r.n)]), [[1, 0, ITEMS]], 'one claim each, no failure, no orphan');
  const byFylr = ds.map((d) => d.counters.done);
  t.equal(byFylr.reduce((a, b) => a + b, 0), ITEMS);
  t.ok(byFylr.every((n) => n > 0), `every fylr did work: ${byFylr.join(', ')}`);
  t.ok(ds.every((d) => d.counters.orphans_requeued === 0 && d.counters.lost === 0), 'no live claim was ever stolen');
  t.comment(`${fylrs} fylrs, ${ITEMS} items in ${elapsed} ms (${Math.round((ITEMS / elapsed) * 1000)} items/s); per fylr ${byFylr.join('/')}; claim queries ${ds.map((d) => d.counters.claim_queries).join('/')}`);
}

t.test('two dispatchers, 2,000 items, one execserver: every item done exactly once', (t) => fleet(t, 2));
t.test('five dispatchers, 2,000 items, one execserver: every item done exactly once', (t) => fleet(t, 5));
