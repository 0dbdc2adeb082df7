/**
 * Crashes and slow-but-alive dispatchers: `slotgate fylr` child processes (SIGKILL is a real
 * crash: no close, no UNWANT, no requeue) and in-process dispatchers, one real execserver whose
 * jobs are held on their slots while the test looks.
 */
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { Dispatcher } from '../../src/fylr/dispatcher.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import { TIMINGS_ENV } from '../../src/fylr/fylr-process.js';
import { type CliProcess, startCli } from '../helpers/spawn-cli.js';
import { type TestSchema, testSchema } from '../helpers/db.js';
import { claimedBy, countStates, execClientConfig, insertItems, startObservedExec, until, waitFor } from './dispatcher-fixtures.js';

const TIMINGS = { heartbeatIntervalMs: 200, staleAfterMs: 1000 };

async function fylrChild(t: { teardown(fn: () => unknown): void }, db: TestSchema, execUrl: string, name: string): Promise<{ cli: CliProcess; owner: string; status(): Promise<any> }> {
  const dir = await mkdtemp(join(tmpdir(), 'sg-fylr-'));
  const file = join(dir, 'fylr.yml');
  const database = `${db.url}${db.url.includes('?') ? '&' : '?'}options=${encodeURIComponent(`-c search_path=${db.schema},public`)}`;
  await writeFile(file, `listen: 127.0.0.1:0\nname: ${name}\nexecserver: {addresses: ["${execUrl}"], connectTimeoutSec: 60}\ndatabase: "${database}"\n`);
  const cli = await startCli(['fylr', '--config', file], { env: { [TIMINGS_ENV]: JSON.stringify(TIMINGS) }, t });
  const status = async (): Promise<any> => (await request(`${cli.url}/status`)).body.json();
  const s = await status();
  return { cli, owner: s.owner as string, status };
}

t.test('crash: a SIGKILLed fylr\'s claims are requeued by a survivor after the threshold and complete', async (t) => {
  const db = await testSchema(t, 'crash');
  const ex = await startObservedExec(t, { slots: 4 });
  ex.source.hold = () => true;
  const items = await insertItems(db.pool, 12);

  const a = await fylrChild(t, db, ex.url, 'A');
  await waitFor('A claims its share (4 + 2)', async () => (await claimedBy(db.pool)).get(a.owner) === 6);
  await waitFor('A holds every slot', () => ex.source.heldNow().length === 4);
  const b = await fylrChild(t, db, ex.url, 'B');
  await waitFor('B claims its share (ceil(4/2) + 2)', async () => (await claimedBy(db.pool)).get(b.owner) === 4);
  const { rows: aRows } = await db.pool.query<{ id: string }>(`SELECT id FROM file_queue WHERE claimed_by = $1`, [a.owner]);
  const aIds = aRows.map((r) => Number(r.id));
  const { rows: bRows } = await db.pool.query<{ id: string }>(`SELECT id FROM file_queue WHERE claimed_by = $1`, [b.owner]);
  const bIds = bRows.map((r) => Number(r.id));

  const killedAt = Date.now();
  t.equal(await a.cli.kill('SIGKILL'), 'SIGKILL');
  t.same((await claimedBy(db.pool)).get(a.owner), 6, "right after the crash A's claims still look claimed (fresh heartbeats)");
  await waitFor("A's claims requeued", async () => !(await claimedBy(db.pool)).has(a.owner), 20_000);
  const tookMs = Date.now() - killedAt;
  t.ok(tookMs >= TIMINGS.staleAfterMs - TIMINGS.heartbeatIntervalMs - 100, `not before the threshold (${tookMs} ms after the kill)`);
  const bStatus = await b.status();
  t.equal(bStatus.dispatcher.counters.orphans_requeued, 6, 'B, the survivor, requeued them');
  const { rows: bNow } = await db.pool.query<{ n: string }>(`SELECT count(*) AS n FROM file_queue WHERE id = ANY($1::bigint[]) AND claimed_by = $2 AND attempts = 1`, [bIds, b.owner]);
  t.equal(Number(bNow[0]!.n), bIds.length, "the live survivor's own claims were never touched");

  ex.source.releaseAll();
  await waitFor('all done', async () => (await countStates(db.pool)).done === items.size, 30_000);
  t.same(await countStates(db.pool), { queued: 0, claimed: 0, done: 12, failed: 0 });
  const ok = ex.source.okByMarker();
  t.equal(ok.size, 12);
  t.ok([...ok.values()].every((n) => n === 1), 'each item completed exactly once (a DONE that went out)');
  const { rows } = await db.pool.query<{ id: string; attempts: number; failures: number }>(`SELECT id, attempts, failures FROM file_queue`);
  for (const r of rows) {
    const id = Number(r.id);
    if (aIds.includes(id)) t.match(r, { attempts: 2, failures: 1 }, `A's item ${id}: orphaned once, then done`);
    else if (bIds.includes(id)) t.match(r, { attempts: 1, failures: 0 }, `B's item ${id}: one attempt`);
  }
  const stopped = ex.source.finished.filter((e) => e.aborted);
  t.equal(stopped.length, 4, "A's four running jobs were stopped by the execserver when A's connection closed");
  t.equal(ex.source.started.length, 16, '12 items + 4 repeated executions of the jobs A was running when it died');
});

t.test("a live but slow dispatcher's claims are never stolen", async (t) => {
  const db = await testSchema(t, 'slow');
  const ex = await startObservedExec(t, { slots: 2 });
  ex.source.hold = () => true;
  await insertItems(db.pool, 4);
  const mk = async (name: string, extra: object = {}) => {
    const client = new ExecClient(execClientConfig([ex.url]), { name });
    await client.start();
    const d = new Dispatcher({ pool: db.newPool(3), client, name, ...TIMINGS, ...extra });
    t.teardown(async () => {
      await d.stop();
      await client.close();
    });
    return d;
  };
  const slow = await mk('slow');
  slow.start();
  await until(slow, 'slow carries all four', () => slow.carried().length === 4);
  const sweeper = await mk('sweeper', { sweepIntervalMs: 100 });
  sweeper.start();
  const t0 = Date.now();
  // Thirty sweeps, 100 ms apart: three times the stale threshold, while slow's jobs do not move.
  await until(sweeper, '30 sweeps', () => sweeper.counters.sweep_queries >= 30, 20_000);
  t.ok(Date.now() - t0 >= 3 * TIMINGS.staleAfterMs - 200, 'the sweeps spanned several thresholds');
  t.equal(sweeper.counters.orphans_requeued, 0, 'nothing requeued');
  t.equal(slow.counters.lost, 0, 'slow lost nothing');
  t.ok(slow.counters.heartbeat_queries >= 10, `slow kept heartbeating (${slow.counters.heartbeat_queries})`);
  const owners = await claimedBy(db.pool);
  t.same([...owners], [[slow.owner, 4]], 'all four still claimed by slow');
  const { rows } = await db.pool.query<{ fresh: boolean }>(`SELECT heartbeat_at > now() - interval '1 second' AS fresh FROM file_queue`);
  t.ok(rows.every((r) => r.fresh), 'heartbeats are fresh');
  ex.source.releaseAll();
  await waitFor('all done', async () => (await countStates(db.pool)).done === 4);
  t.equal(slow.counters.done, 4, 'slow finished its own items');
  t.ok([...ex.source.okByMarker().values()].every((n) => n === 1) && ex.source.started.length === 4, 'each executed once');
});
