import t from 'tap';
import { HIGH_PRIORITY } from '../../src/db/file-queue-schema.js';
import { claimOne, enqueue, finish, getItem, requeue } from '../../src/db/file-queue-store.js';
import { testSchema } from '../helpers/db.js';

t.test('enqueue and getItem round trip', async (t) => {
  const { pool } = await testSchema(t, 'store_rt');
  const id = await enqueue(pool, { action: 'convert', priority: 3, payload: { service: 'convert', commands: [] } });
  t.type(id, 'number');
  const item = await getItem(pool, id);
  t.ok(item);
  t.equal(item!.id, id);
  t.equal(item!.state, 'queued');
  t.equal(item!.action, 'convert');
  t.equal(item!.priority, 3);
  t.equal(item!.attempts, 0);
  t.equal(item!.claimed_by, null);
  t.equal(item!.receipt, null);
  t.same(item!.payload, { service: 'convert', commands: [] });
  t.equal(await getItem(pool, id + 1000), null);
  t.equal(await getItem(pool, -1), null);
});

t.test('claimOne: ten concurrent claimers take 200 items exactly once each', async (t) => {
  const { pool, newPool } = await testSchema(t, 'store_conc');
  const ids: number[] = [];
  for (let i = 0; i < 200; i++) ids.push(await enqueue(pool, { action: 'svc', priority: i % 3, payload: { i } }));

  // Ten claimers, each with its own pool (like ten fylr workers on separate connections).
  const claimedBy = new Map<number, string[]>();
  await Promise.all(
    Array.from({ length: 10 }, async (_, w) => {
      const p = newPool(2);
      const owner = `w${w}`;
      for (;;) {
        const item = await claimOne(p, owner);
        if (item === null) break;
        t.equal(item.state, 'claimed');
        t.equal(item.claimed_by, owner);
        claimedBy.set(item.id, [...(claimedBy.get(item.id) ?? []), owner]);
      }
    }),
  );
  t.equal(claimedBy.size, 200, 'every item claimed');
  const twice = [...claimedBy.entries()].filter(([, owners]) => owners.length !== 1);
  t.same(twice, [], 'no item claimed twice');
  t.same([...claimedBy.keys()].sort((a, b) => a - b), ids);
  const { rows } = await pool.query<{ n: string; a: number }>(
    `SELECT count(*) AS n, max(attempts) AS a FROM file_queue WHERE state = 'claimed' AND attempts = 1`,
  );
  t.equal(Number(rows[0]!.n), 200);
  t.equal(rows[0]!.a, 1);
  // Several owners actually took part (else the test proves nothing about concurrency).
  t.ok(new Set([...claimedBy.values()].map((o) => o[0])).size > 1);
});

t.test('claimOne: priority first, then id', async (t) => {
  const { pool } = await testSchema(t, 'store_prio');
  const low1 = await enqueue(pool, { action: 's', priority: 0, payload: {} });
  const high = await enqueue(pool, { action: 's', priority: 5, payload: {} });
  const low2 = await enqueue(pool, { action: 's', priority: 0, payload: {} });
  const mid = await enqueue(pool, { action: 's', priority: 2, payload: {} });
  const order: number[] = [];
  for (;;) {
    const item = await claimOne(pool, 'o');
    if (item === null) break;
    order.push(item.id);
  }
  t.same(order, [high, mid, low1, low2]);
});

t.test('claimOne highOnly takes only items at or above HIGH_PRIORITY', async (t) => {
  const { pool } = await testSchema(t, 'store_high');
  const low = await enqueue(pool, { action: 's', priority: HIGH_PRIORITY - 1, payload: {} });
  t.equal(await claimOne(pool, 'hi', { highOnly: true }), null);
  const high = await enqueue(pool, { action: 's', priority: HIGH_PRIORITY, payload: {} });
  t.equal((await claimOne(pool, 'hi', { highOnly: true }))?.id, high);
  t.equal(await claimOne(pool, 'hi', { highOnly: true }), null);
  t.equal((await claimOne(pool, 'lo'))?.id, low);
});

t.test('claimOne respects start_after', async (t) => {
  const { pool } = await testSchema(t, 'store_after');
  const later = await enqueue(pool, { action: 's', payload: {}, delayMs: 60_000 });
  const alsoLater = await enqueue(pool, { action: 's', payload: {}, startAfter: new Date(Date.now() + 3_600_000) });
  t.equal(await claimOne(pool, 'o'), null, 'nothing claimable yet');
  const past = await enqueue(pool, { action: 's', payload: {}, startAfter: new Date(Date.now() - 1000) });
  t.equal((await claimOne(pool, 'o'))?.id, past);
  // Make the delayed one due: it is claimed, the hour-later one is not.
  await pool.query(`UPDATE file_queue SET start_after = now() - interval '1 second' WHERE id = $1`, [later]);
  t.equal((await claimOne(pool, 'o'))?.id, later);
  t.equal(await claimOne(pool, 'o'), null);
  t.equal((await getItem(pool, alsoLater))?.state, 'queued');
});

t.test('finish: only the owner of a live claim', async (t) => {
  const { pool } = await testSchema(t, 'store_finish');
  const id = await enqueue(pool, { action: 's', payload: {} });
  t.equal(await finish(pool, id, 'a', { ok: true }, true), false, 'not claimed yet');
  const item = await claimOne(pool, 'a');
  t.equal(item?.id, id);
  t.equal(await finish(pool, id, 'b', { ok: true }, true), false, 'another owner is refused');
  t.equal((await getItem(pool, id))?.state, 'claimed');
  t.equal(await finish(pool, id, 'a', { ok: true, exit_code: 0 }, true), true);
  const done = await getItem(pool, id);
  t.equal(done?.state, 'done');
  t.same(done?.receipt, { ok: true, exit_code: 0 });
  t.equal(await finish(pool, id, 'a', { ok: false }, false), false, 'a finished item stays finished');
  t.equal((await getItem(pool, id))?.state, 'done');

  const id2 = await enqueue(pool, { action: 's', payload: {} });
  await claimOne(pool, 'a');
  t.equal(await finish(pool, id2, 'a', { ok: false }, false), true);
  t.equal((await getItem(pool, id2))?.state, 'failed');
});

t.test('requeue: back to queued after the delay, only by the owner', async (t) => {
  const { pool } = await testSchema(t, 'store_requeue');
  const id = await enqueue(pool, { action: 's', payload: {} });
  await claimOne(pool, 'a');
  t.equal(await requeue(pool, id, 'b', 0), false, 'another owner is refused');
  t.equal(await requeue(pool, id, 'a', 60_000), true);
  const item = await getItem(pool, id);
  t.equal(item?.state, 'queued');
  t.equal(item?.claimed_by, null);
  t.equal(item?.attempts, 1);
  const { rows } = await pool.query<{ s: number }>(`SELECT extract(epoch FROM start_after - now())::float8 AS s FROM file_queue WHERE id = $1`, [id]);
  t.ok(rows[0]!.s > 55 && rows[0]!.s <= 60, `start_after is ~60 s ahead (${rows[0]!.s})`);
  t.equal(await claimOne(pool, 'a'), null, 'not claimable during the delay');
  t.equal(await requeue(pool, id, 'a', 0), false, 'a queued item cannot be requeued');

  const id2 = await enqueue(pool, { action: 's', payload: {} });
  await claimOne(pool, 'a');
  t.equal(await requeue(pool, id2, 'a', 0), true);
  const again = await claimOne(pool, 'c');
  t.equal(again?.id, id2, 'delay 0: claimable at once');
  t.equal(again?.attempts, 2);
  await t.rejects(requeue(pool, id2, 'c', -1), RangeError);
});
