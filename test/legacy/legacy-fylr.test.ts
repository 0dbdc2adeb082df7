import t from 'tap';
import { request } from 'undici';
import { ManualClock, systemClock } from '../../src/clock.js';
import { parseFylrConfig } from '../../src/config/load-config.js';
import { HIGH_PRIORITY } from '../../src/db/file-queue-schema.js';
import { enqueue, getItem } from '../../src/db/file-queue-store.js';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { type LegacyFylr, type StartLegacyFylrOptions, startLegacyFylr } from '../../legacy/fylr/legacy-fylr-process.js';
import { acquireAndRun, type AcquireResult } from '../../legacy/fylr/polling-client.js';
import { testSchema } from '../helpers/db.js';
import { catFileJob, echoJob, sleepJob, startExec, startFileServer } from './legacy-fylr-helpers.js';

type Teardown = { teardown(fn: () => unknown): void };

async function fylr(
  t: Teardown,
  addresses: string[],
  ex: { parallel: number; parallelHigh: number; connectTimeoutSec?: number },
  opts: StartLegacyFylrOptions,
): Promise<LegacyFylr> {
  const config = parseFylrConfig({
    listen: '127.0.0.1:0',
    name: 'old-fylr',
    execserver: { addresses, connectTimeoutSec: ex.connectTimeoutSec ?? 60, parallel: ex.parallel, parallelHigh: ex.parallelHigh },
  });
  const f = await startLegacyFylr(config, opts);
  t.teardown(() => f.close());
  return f;
}

/** Occupies the only `slow` slot of `url` with a long job; resolves once its PUT is out. */
async function holdSlowSlot(url: string): Promise<{ result: Promise<AcquireResult> }> {
  let running!: () => void;
  const sent = new Promise<void>((r) => (running = r));
  const result = acquireAndRun(sleepJob(60), { addresses: [url], connectTimeoutSec: 5, clock: systemClock, counters: new LegacyCounters(), onRunning: () => running() });
  await sent;
  return { result };
}

function stored(f: LegacyFylr): number {
  const r = f.counters.snapshot().results;
  return r.done + r.failed + r.requeue;
}

t.test('the old worker pool: every item claimed and run exactly once (two fylrs, one database)', async (t) => {
  const files = await startFileServer(t);
  const e1 = await startExec(t, { name: 'e1', waitgroups: { fast: 3, slow: 1 } });
  const e2 = await startExec(t, { name: 'e2', waitgroups: { fast: 3, slow: 1 } });
  const { schema, pool } = await testSchema(t, 'lf_once');
  const ITEMS = 40;
  const ids: number[] = [];
  for (let i = 0; i < ITEMS; i++) ids.push(await enqueue(pool, { action: 'cat', payload: catFileJob(`${files.url}/f/${i}`) }));

  const addresses = [e1.url, e2.url];
  const f1 = await fylr(t, addresses, { parallel: 4, parallelHigh: 1 }, { schema, owner: 'fylr-1' });
  const f2 = await fylr(t, addresses, { parallel: 4, parallelHigh: 1 }, { schema, owner: 'fylr-2' });
  await Promise.all([f1.counters.until(() => stored(f1) + stored(f2) === ITEMS), f2.counters.until(() => stored(f1) + stored(f2) === ITEMS)]);

  const items = await Promise.all(ids.map((id) => getItem(pool, id)));
  items.forEach((item, i) => {
    t.equal(item?.state, 'done', `item ${i} done`);
    t.equal(item?.attempts, 1, `item ${i} claimed once`);
    t.equal((item?.receipt as { stdout_prefix?: string } | null)?.stdout_prefix, `content of /f/${i}`, `item ${i} ran its own job`);
  });
  for (let i = 0; i < ITEMS; i++) t.equal(files.hits.get(`/f/${i}`), 1, `input ${i} fetched by exactly one execution`);
  t.equal((e1.counters.jobs.cat ?? 0) + (e2.counters.jobs.cat ?? 0), ITEMS, 'the execservers ran ITEMS jobs in all');
  const owners = new Set(items.map((i) => i?.claimed_by));
  t.same([...owners].sort(), ['fylr-1', 'fylr-2'], 'both fylrs took part');
  t.ok(f1.counters.claimQueries >= stored(f1), 'one claim query per item at least');
});

t.test('parallelHigh serves a high-priority item while every parallel worker is blocked in a slot wait', async (t) => {
  const exec = await startExec(t, { waitgroups: { fast: 2, slow: 1 } });
  await holdSlowSlot(exec.url);
  const { schema, pool } = await testSchema(t, 'lf_high');
  const clock = new ManualClock();
  const f = await fylr(t, [exec.url], { parallel: 2, parallelHigh: 1 }, { schema, clock, owner: 'old' });
  const c = f.counters;
  await c.until(() => c.claimQueries === 3); // every worker polled once, found nothing, sleeps 1 s

  const slow1 = await enqueue(pool, { action: 'sleep', payload: sleepJob(1) });
  const slow2 = await enqueue(pool, { action: 'sleep', payload: sleepJob(1) });
  clock.advance(1000);
  // Both parallel workers claimed a sleep item and are blocked polling the busy slow waitgroup.
  await c.until(() => c.claimQueries === 6 && c.busyRounds === 2);
  const st = f.status();
  t.equal(st.workers.waiting, 2);
  t.same(st.items.claimed.sort(), [slow1, slow2].sort());
  t.same(st.workers.workers.filter((w) => w.lane === 'normal').map((w) => w.state), ['waiting', 'waiting']);

  const normal = await enqueue(pool, { action: 'echo', payload: echoJob('normal') });
  const high = await enqueue(pool, { action: 'echo', priority: HIGH_PRIORITY, payload: echoJob('high') });
  clock.advance(1000);
  await c.until(() => c.snapshot().results.done === 1);
  const h = await getItem(pool, high);
  t.equal(h?.state, 'done', 'the high item ran');
  t.equal((h?.receipt as { stdout_prefix?: string } | null)?.stdout_prefix, 'high\n');
  t.equal(h?.claimed_by, 'old');
  t.equal((await getItem(pool, normal))?.state, 'queued', 'the normal item starves: no parallel worker is free');
  // The high worker polls again after its item; the blocked workers never query the database.
  await c.until(() => c.claimQueries >= 8 && c.busyRounds === 4);
  t.equal(c.claimQueries, 8, 'only the high worker queried the database');

  // stop(): the blocked workers give their items back at once.
  await f.close();
  for (const id of [slow1, slow2]) {
    const item = await getItem(pool, id);
    t.equal(item?.state, 'queued', `item ${id} requeued on stop`);
    t.equal(item?.attempts, 1);
    t.equal(item?.claimed_by, null);
  }
  const { rows } = await pool.query<{ due: boolean }>('SELECT bool_and(start_after <= now()) AS due FROM file_queue WHERE id = ANY($1)', [[slow1, slow2]]);
  t.equal(rows[0]?.due, true, 'claimable again at once');
});

t.test('without parallelHigh the high-priority item waits behind the blocked workers', async (t) => {
  const exec = await startExec(t, { waitgroups: { fast: 2, slow: 1 } });
  await holdSlowSlot(exec.url);
  const { schema, pool } = await testSchema(t, 'lf_nohigh');
  const clock = new ManualClock();
  const f = await fylr(t, [exec.url], { parallel: 2, parallelHigh: 0 }, { schema, clock });
  const c = f.counters;
  await c.until(() => c.claimQueries === 2);
  await enqueue(pool, { action: 'sleep', payload: sleepJob(1) });
  await enqueue(pool, { action: 'sleep', payload: sleepJob(1) });
  clock.advance(1000);
  await c.until(() => c.claimQueries === 4 && c.busyRounds === 2);
  const high = await enqueue(pool, { action: 'echo', priority: HIGH_PRIORITY, payload: echoJob('high') });
  for (let s = 1; s <= 3; s++) {
    clock.advance(1000);
    await c.until(() => c.busyRounds === 2 + 2 * s);
  }
  t.equal((await getItem(pool, high))?.state, 'queued', 'nobody claimed the high item');
  t.equal(c.claimQueries, 4, 'no worker was free to poll the database');
});

t.test('no slot within connectTimeoutSec: requeued with start_after +1 min', async (t) => {
  const exec = await startExec(t, { waitgroups: { fast: 2, slow: 1 } });
  await holdSlowSlot(exec.url);
  const { schema, pool } = await testSchema(t, 'lf_requeue');
  const id = await enqueue(pool, { action: 'sleep', payload: sleepJob(1) });
  const clock = new ManualClock();
  const f = await fylr(t, [exec.url], { parallel: 1, parallelHigh: 0, connectTimeoutSec: 2 }, { schema, clock });
  const c = f.counters;
  await c.until(() => c.busyRounds === 1);
  t.equal((await getItem(pool, id))?.state, 'claimed');
  clock.advance(1000);
  await c.until(() => c.busyRounds === 2);
  clock.advance(1000);
  await c.until(() => c.snapshot().results.requeue === 1);
  const item = await getItem(pool, id);
  t.equal(item?.state, 'queued');
  t.equal(item?.attempts, 1);
  t.equal(item?.claimed_by, null);
  const { rows } = await pool.query<{ s: number }>('SELECT extract(epoch FROM start_after - now())::float8 AS s FROM file_queue WHERE id = $1', [id]);
  t.ok(rows[0]!.s > 55 && rows[0]!.s <= 60, `start_after ~60 s ahead (${rows[0]!.s})`);
  t.equal(c.snapshot().token_requests.total, 2, 'one token request per second until the deadline');
  // The worker goes back to polling the database; the item is not claimable for a minute.
  await c.until(() => c.claimQueries === 2);
  clock.advance(1000);
  await c.until(() => c.claimQueries === 3);
  t.equal(c.snapshot().claims, 1);
});

t.test('the process: POST /items, GET /items/:id, GET /status', async (t) => {
  const exec = await startExec(t, { waitgroups: { fast: 2, slow: 1 } });
  const { schema, pool } = await testSchema(t, 'lf_proc');
  const f = await fylr(t, [exec.url, `${exec.url}/job/echo`], { parallel: 2, parallelHigh: 1 }, { schema });
  t.match(f.url, /^http:\/\/127\.0\.0\.1:\d+$/);

  const post = async (body: unknown): Promise<{ status: number; json: any }> => {
    const res = await request(`${f.url}/items`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    return { status: res.statusCode, json: await res.body.json() };
  };
  const getJson = async (path: string): Promise<any> => (await request(`${f.url}${path}`)).body.json();

  const bad = await post({ action: 'echo', job: { commands: [], token: 'x' } });
  t.equal(bad.status, 400);
  t.equal(bad.json.error.field, 'job.token');

  const created = await post({ action: 'echo', job: { commands: [{ prog: 'echo', args: [{ type: 'value', value: 'via items' }] }] } });
  t.equal(created.status, 201);
  const id = created.json.id as number;
  await f.counters.until(() => f.counters.snapshot().results.done === 1);
  const item = await getJson(`/items/${id}`);
  t.same(Object.keys(item).sort(), ['attempts', 'id', 'receipt', 'state']);
  t.equal(item.state, 'done');
  t.equal(item.attempts, 1);
  t.equal(item.receipt.ok, true);
  t.equal(item.receipt.stdout_prefix, 'via items\n');

  // A long job: /status shows it claimed and running here.
  const long = await post({ action: 'sleep', job: sleepJob(30) });
  await f.counters.until(() => f.status().workers.running === 1);
  const st = await getJson('/status');
  t.equal(st.kind, 'legacy-fylr');
  t.same(st.addresses, [
    { address: exec.url, transport: 'polling', only_service: null },
    { address: `${exec.url}/job/echo`, transport: 'polling', only_service: 'echo' },
  ]);
  t.same(st.items, { claimed: [long.json.id], running: [long.json.id] });
  t.equal(st.workers.parallel, 2);
  t.equal(st.workers.parallelHigh, 1);
  t.equal(st.workers.busy, 1);
  t.equal(st.workers.idle, 2);
  t.equal(st.counters.puts_sent, 2);
  t.same(st.counters.puts, { total: 1, by_status: { '200': 1 } }, 'two PUTs: one answered, one running');
  t.ok(st.counters.claim_queries >= 2);
  t.equal(st.counters.token_requests.by_address[`${exec.url}/job/echo`]?.total, 1, 'the echo-only address was asked for echo only');

  // stop() waits for the running item; closing its execserver ends it first.
  await exec.close();
  await f.close();
  const ended = await getItem(pool, long.json.id);
  t.equal(ended?.state, 'failed', 'the running item was finished, not abandoned');
  t.equal(f.status().workers.workers.every((w) => w.state === 'stopped'), true);
  await t.rejects(request(`${f.url}/status`), 'the listener is closed');
});
