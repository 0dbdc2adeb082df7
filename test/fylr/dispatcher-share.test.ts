/**
 * Claim shares and cross-fylr priority against a real execserver. Jobs are held on their slot at
 * the execserver (RecordingSource.hold) so that claims stay claimed exactly as long as the test
 * needs; a released job then really runs.
 */
import t from 'tap';
import type pg from 'pg';
import { Dispatcher } from '../../src/fylr/dispatcher.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import { HEADROOM_PER_INSTANCE } from '../../src/fylr/admission.js';
import { testSchema } from '../helpers/db.js';
import { claimedBy, countStates, execClientConfig, insertItems, startObservedExec, until, waitFor } from './dispatcher-fixtures.js';

interface Fylr {
  client: ExecClient;
  d: Dispatcher;
  stop(): Promise<void>;
}

async function fylr(t: { teardown(fn: () => unknown): void }, url: string, pool: pg.Pool, name: string): Promise<Fylr> {
  const client = new ExecClient(execClientConfig([url]), { name });
  await client.start();
  const d = new Dispatcher({ pool, client, name, heartbeatIntervalMs: 200, staleAfterMs: 3000 });
  let stopped: Promise<void> | undefined;
  const stop = (): Promise<void> =>
    (stopped ??= (async () => {
      await d.stop();
      await client.close();
    })());
  t.teardown(stop);
  return { client, d, stop };
}

t.test('claim share: five fylrs on a 40-slot pool hold about 10 each; when one stops the others grow', async (t) => {
  const db = await testSchema(t, 'share');
  const ex = await startObservedExec(t, { slots: 40 });
  ex.source.hold = () => true;
  await insertItems(db.pool, 200);
  const fs: Fylr[] = [];
  for (let i = 0; i < 5; i++) fs.push(await fylr(t, ex.url, db.newPool(4), `f${i}`));
  // Every client has seen HELLO with clients = 5 before any claims (a fylr alone would rightly
  // claim the whole pool's share).
  const share5 = Math.ceil(40 / 5) + HEADROOM_PER_INSTANCE;
  await waitFor('every client sees five clients', () => fs.every((f) => f.client.admission() === share5));
  for (const f of fs) f.d.start();

  await waitFor('40 jobs on their slots', () => ex.source.heldNow().length === 40);
  await waitFor('every fylr carries its share', () => fs.every((f) => f.d.carried('exec').length === share5));
  const owners = await claimedBy(db.pool);
  t.equal(owners.size, 5);
  for (const f of fs) t.equal(owners.get(f.d.owner), share5, `${f.client.name} holds ${share5} claims (ceil(40/5) + ${HEADROOM_PER_INSTANCE})`);
  t.equal((await countStates(db.pool)).claimed, 5 * share5, 'nobody claimed beyond its share');
  t.ok(share5 <= 10, 'about 10 each');

  // One fylr stops: its running jobs finish, it leaves the execserver.
  const gone = fs[0]!;
  const goneIds = new Set(gone.d.carried());
  const { rows } = await db.pool.query<{ marker: number }>(
    `SELECT (payload->>'timeout_sec')::integer AS marker FROM file_queue WHERE id = ANY($1::bigint[])`,
    [[...goneIds]],
  );
  const goneMarkers = new Set(rows.map((r) => r.marker));
  const stopping = gone.stop();
  ex.source.releaseWhere((e) => goneMarkers.has(e.marker!));
  await stopping;
  const share4 = Math.ceil(40 / 4) + HEADROOM_PER_INSTANCE;
  const rest = fs.slice(1);
  await waitFor('the survivors see four clients', () => rest.every((f) => f.client.admission() === share4));
  await waitFor('the survivors claim their larger share', () => rest.every((f) => f.d.carried('exec').length === share4));
  const after = await claimedBy(db.pool);
  t.notOk(after.has(gone.d.owner), 'the stopped fylr holds nothing');
  for (const f of rest) t.equal(after.get(f.d.owner), share4, `${f.client.name} grew to ${share4}`);
  t.ok(share4 > share5);
  t.equal((await countStates(db.pool)).done, goneIds.size - (gone.d.counters.given_back), 'the stopped fylr finished what ran and gave back what waited');

  ex.source.releaseAll();
  await waitFor('all done', async () => (await countStates(db.pool)).done === 200, 60_000);
  t.equal(ex.source.okByMarker().size, 200);
  t.ok([...ex.source.okByMarker().values()].every((n) => n === 1), 'each once');
});

t.test('priority: with one slot, a high-priority item claimed by fylr B starts before fylr A\'s earlier low-priority items', async (t) => {
  const db = await testSchema(t, 'prio');
  const ex = await startObservedExec(t, { slots: 1 });
  ex.source.hold = () => true;
  const low = await insertItems(db.pool, 6, { markerBase: 100, priority: 0 });
  const a = await fylr(t, ex.url, db.newPool(4), 'A');
  a.d.start();
  const shareA = 1 + HEADROOM_PER_INSTANCE;
  await until(a.d, 'A carries its share', () => a.d.carried().length === shareA);
  await waitFor('A\'s first job holds the slot', () => ex.source.heldNow().length === 1);
  t.equal(ex.source.started[0]!.marker, 101, 'the oldest low item runs');
  await waitFor('A\'s other wants are parked at the execserver', () => ex.exec.broker.status().waitgroups.w!.parked === shareA - 1);

  const high = await insertItems(db.pool, 1, { markerBase: 900, priority: 5 });
  const highId = high.get(901)!;
  const b = await fylr(t, ex.url, db.newPool(4), 'B');
  b.d.start();
  await until(b.d, 'B claims the high item', () => b.d.carried().includes(highId));
  t.notOk(a.d.carried().includes(highId), 'A never had it');
  await waitFor('B\'s high want is parked', () => (ex.exec.broker.status().waitgroups.w!.parked_by_priority['5'] ?? 0) === 1);

  // The slot frees: the execserver's next offer goes to the highest priority, across fylrs.
  ex.source.releaseWhere((e) => e.marker === 101);
  await waitFor('the next job is on the slot', () => ex.source.started.length === 2);
  t.equal(ex.source.started[1]!.marker, 901, "B's high item started before A's earlier low ones (102, 103)");

  ex.source.releaseAll();
  await waitFor('all done', async () => (await countStates(db.pool)).done === low.size + 1, 30_000);
  const order = ex.source.started.map((e) => e.marker);
  t.equal(order.indexOf(901), 1);
  t.ok(order.indexOf(901) < order.indexOf(102) && order.indexOf(901) < order.indexOf(103), `start order ${order.join(', ')}`);
});
