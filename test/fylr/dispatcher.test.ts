/**
 * Unit tests of the dispatcher's claim, admission, retry and heartbeat logic: a real PostgreSQL
 * (own schema per test), a ManualClock (no poll happens unless the test advances time or an
 * event wakes the loop), and a scripted broker client. The integration tests with the real
 * client and execservers are the other dispatcher-*.test.ts files.
 */
import t from 'tap';
import type pg from 'pg';
import { ManualClock } from '../../src/clock.js';
import { HIGH_PRIORITY } from '../../src/db/file-queue-schema.js';
import { enqueue, getItem } from '../../src/db/file-queue-store.js';
import { Dispatcher, type DispatcherOptions } from '../../src/fylr/dispatcher.js';
import { failedReceipt, okReceipt } from '../../src/protocol/job.js';
import { testSchema } from '../helpers/db.js';
import { countStates, ScriptedClient, until, waitFor } from './dispatcher-fixtures.js';

const noop = (service: string) => ({ service, commands: [] });

async function add(pool: pg.Pool, n: number, action = 'convert', priority = 0, payload?: unknown): Promise<number[]> {
  const ids: number[] = [];
  for (let i = 0; i < n; i++) ids.push(await enqueue(pool, { action, priority, payload: payload ?? noop(action) }));
  return ids;
}

function dispatcher(t: { teardown(fn: () => unknown): void }, pool: pg.Pool, client: ScriptedClient, opts: Partial<DispatcherOptions> = {}): { d: Dispatcher; clock: ManualClock } {
  const clock = new ManualClock();
  const d = new Dispatcher({ pool, client, clock, name: 'unit', localSlots: 4, localHighReserve: 1, heartbeatIntervalMs: 200, staleAfterMs: 1000, ...opts });
  t.teardown(async () => {
    for (const run of client.open.values()) run.finish();
    await d.stop();
  });
  return { d, clock };
}

t.test('exec-bound claims follow admission() minus what is carried; an ending item re-polls at once', async (t) => {
  const { pool } = await testSchema(t, 'disp_adm');
  await add(pool, 10);
  const client = new ScriptedClient();
  client.share = 3;
  const { d } = dispatcher(t, pool, client);
  d.start();
  await until(d, '3 running', () => client.open.size === 3);
  t.equal((await countStates(pool)).claimed, 3, 'three claimed in the database');
  t.equal(d.counters.claim_queries, 1, 'one claim statement for three items');

  const queries = d.counters.claim_queries;
  client.runs[0]!.finish();
  await until(d, 'a fourth run', () => client.runs.length === 4 && d.carried('exec').length === 3);
  t.equal(d.counters.claim_queries, queries + 1, 'the ending item re-polled without waiting for the clock');
  t.equal((await countStates(pool)).done, 1);

  client.share = 5;
  client.changed();
  await until(d, 'five carried', () => d.carried('exec').length === 5);
  t.equal((await countStates(pool)).claimed, 5, 'a larger share (onChange) is claimed at once');

  client.share = 1;
  client.changed();
  await until(d, 'a poll after the change', () => d.counters.polls >= 4);
  t.equal(d.carried('exec').length, 5, 'a smaller share takes nothing away, it only stops claims');
  t.same(d.status().admission, { exec_share: 1, has_execserver: true, exec_carried: 5, local: { size: 4, reserved_high: 1, in_use: 0, in_use_low: 0 } });
});

t.test('the poll: once per interval while idle, one statement each', async (t) => {
  const { pool } = await testSchema(t, 'disp_poll');
  const client = new ScriptedClient();
  const { d, clock } = dispatcher(t, pool, client);
  d.start();
  await until(d, 'first poll', () => d.counters.claim_queries === 1 && d.counters.polls === 1);
  for (let i = 2; i <= 5; i++) {
    clock.advance(1000);
    await until(d, `poll ${i}`, () => d.counters.claim_queries === i);
  }
  clock.advance(999);
  await new Promise((r) => setTimeout(r, 0));
  t.equal(d.counters.claim_queries, 5, 'no poll before the interval is up');
  t.equal(d.counters.heartbeat_queries, 0, 'nothing carried: no heartbeat query');
  const [id] = await add(pool, 1);
  clock.advance(1);
  await until(d, 'claimed', () => client.open.size === 1);
  t.equal(client.acquired[0], `${id}:1`);
});

t.test('no execserver connected: nothing exec-bound is claimed, local-bound work still runs', async (t) => {
  const { pool } = await testSchema(t, 'disp_noexec');
  const exec = await add(pool, 3);
  const local = [...(await add(pool, 2, 'checksum')), ...(await add(pool, 1, 'sync')), ...(await add(pool, 1, 'copy_move'))];
  const client = new ScriptedClient();
  client.connected = false;
  const { d, clock } = dispatcher(t, pool, client);
  d.start();
  await until(d, 'local items done', () => d.counters.done === local.length);
  for (let i = 0; i < 3; i++) {
    clock.advance(1000);
    await until(d, 'a poll', () => d.counters.claim_queries >= i + 2);
  }
  for (const id of exec) t.equal((await getItem(pool, id))!.state, 'queued');
  t.equal(client.acquired.length, 0, 'no slot was even asked for');
  const sum = (await getItem(pool, local[0]!))!.receipt as { ok: boolean; stdout_prefix: string };
  t.ok(sum.ok);
  t.match(sum.stdout_prefix, /^[0-9a-f]{64}$/, 'checksum receipt carries the digest');

  client.connected = true;
  client.changed();
  await until(d, 'exec items claimed once an execserver is there', () => client.open.size === 3);
});

t.test('local semaphore: low priority never takes the reserved slot; high priority can', async (t) => {
  const { pool } = await testSchema(t, 'disp_local');
  const low = await add(pool, 6, 'sync', 0, { hold_ms: 60_000 });
  const client = new ScriptedClient();
  const { d, clock } = dispatcher(t, pool, client, { localSlots: 4, localHighReserve: 1 });
  d.start();
  await until(d, 'three low running', () => d.carried('local').length === 3);
  clock.advance(1000);
  await until(d, 'second poll', () => d.counters.polls >= 2);
  t.equal(d.carried('local').length, 3, 'the fourth slot stays free for high priority');
  const [h1, h2] = [...(await add(pool, 1, 'checksum', HIGH_PRIORITY, { data: 'x' })), ...(await add(pool, 1, 'copy_move', HIGH_PRIORITY, { hold_ms: 60_000 }))];
  clock.advance(1000);
  await until(d, 'h1 done', () => d.counters.done === 1);
  t.equal((await getItem(pool, h1!))!.state, 'done', 'a high item took the reserved slot at once, past six queued low ones');
  await until(d, 'h2 holding the reserved slot', () => d.carried('local').includes(h2!));
  t.same(d.status().admission.local, { size: 4, reserved_high: 1, in_use: 4, in_use_low: 3 });
  t.equal((await countStates(pool)).queued, 3, 'three low items still queued');
  clock.advance(60_000);
  await until(d, 'the first holds ended', () => d.counters.done === 5);
  await until(d, 'the last three low ones took their slots', () => d.carried('local').length === 3);
  t.same(d.carried('local').sort(), low.slice(3).sort(), 'in FIFO order');
  clock.advance(60_000);
  await until(d, 'all done', () => d.counters.done === 8);
});

t.test('"no slot" requeues with start_after +1 min and is not a failure', async (t) => {
  const { pool } = await testSchema(t, 'disp_noslot');
  const [id] = await add(pool, 1);
  const client = new ScriptedClient();
  client.mode = 'requeue';
  const { d } = dispatcher(t, pool, client);
  d.start();
  await until(d, 'requeued', () => d.counters.requeued_no_slot === 1 && d.carried().length === 0);
  const { rows } = await pool.query<{ state: string; attempts: number; failures: number; secs: number }>(
    `SELECT state, attempts, failures, extract(epoch FROM start_after - now())::float AS secs FROM file_queue WHERE id = $1`,
    [id],
  );
  t.match(rows[0], { state: 'queued', attempts: 1, failures: 0 });
  t.ok(rows[0]!.secs > 55 && rows[0]!.secs <= 60, `start_after is a minute ahead (${rows[0]!.secs} s)`);
});

t.test('retry policy: a poison item runs maxFailures times, each with its own job id, then ends failed', async (t) => {
  const { pool } = await testSchema(t, 'disp_poison');
  const [id] = await add(pool, 1);
  const client = new ScriptedClient();
  client.autoFinish = () => failedReceipt('command_failed', 'exit 1');
  const { d, clock } = dispatcher(t, pool, client, { retry: { maxFailures: 3, backoffMs: 0 } });
  d.start();
  for (let n = 1; n <= 3; n++) {
    await until(d, `run ${n}`, () => client.runs.length === n && d.carried().length === 0);
    clock.advance(1000);
  }
  await until(d, 'failed', () => d.counters.failed === 1);
  const item = await getItem(pool, id!);
  t.equal(item!.state, 'failed');
  t.equal(item!.attempts, 3);
  t.same(client.acquired, [`${id}:1`, `${id}:2`, `${id}:3`], 'a unique job id per attempt');
  t.equal((item!.receipt as { error: { code: string } }).error.code, 'command_failed');
  t.equal(d.counters.retried, 2);
  clock.advance(1000);
  await until(d, 'another poll', () => d.counters.polls >= 5);
  t.equal(client.runs.length, 3, 'never run again');
});

t.test('retry policy: a transient failure retries after the backoff and then succeeds', async (t) => {
  const { pool } = await testSchema(t, 'disp_transient');
  const [id] = await add(pool, 1);
  const client = new ScriptedClient();
  let n = 0;
  client.autoFinish = () => (++n === 1 ? { ...failedReceipt('stopped', 'connection closed'), stopped: true } : okReceipt());
  const { d, clock } = dispatcher(t, pool, client, { retry: { maxFailures: 3, backoffMs: 5000 } });
  d.start();
  await until(d, 'first failure', () => d.counters.retried === 1 && d.carried().length === 0);
  clock.advance(1000);
  await until(d, 'poll', () => d.counters.polls >= 2);
  t.equal(client.runs.length, 1, 'not before its backoff (database time)');
  await pool.query(`UPDATE file_queue SET start_after = now() WHERE id = $1`, [id]);
  clock.advance(1000);
  await until(d, 'done', () => d.counters.done === 1);
  t.match(await getItem(pool, id!), { state: 'done', attempts: 2 });
});

t.test('final errors and bad payloads end failed at once', async (t) => {
  const { pool } = await testSchema(t, 'disp_final');
  const [bad] = await add(pool, 1, 'convert', 0, { commands: 'nope' });
  const [notAllowed] = await add(pool, 1);
  const client = new ScriptedClient();
  client.autoFinish = () => failedReceipt('command_not_allowed', 'no such command');
  const { d } = dispatcher(t, pool, client);
  d.start();
  await until(d, 'both failed', () => d.counters.failed === 2);
  t.match(await getItem(pool, bad!), { state: 'failed', attempts: 1, receipt: { error: { code: 'invalid_job' } } });
  t.match(await getItem(pool, notAllowed!), { state: 'failed', attempts: 1, receipt: { error: { code: 'command_not_allowed' } } });
  t.same(client.acquired, [`${notAllowed}:1`], 'the bad payload never asked for a slot');
});

t.test('stop(): waiting items go back at once, running ones finish and are recorded, then no more claims', async (t) => {
  const { pool } = await testSchema(t, 'disp_stop');
  await add(pool, 4);
  const client = new ScriptedClient();
  client.share = 4;
  // The first two get a slot and run; the others wait (acquire never answers until aborted).
  let granted = 0;
  const realAcquire = client.acquire.bind(client);
  client.acquire = async (req, signal) => {
    if (granted++ < 2) return realAcquire(req, signal);
    client.acquired.push(req.jobId);
    return new Promise((resolve) => signal?.addEventListener('abort', () => resolve({ kind: 'requeue' }), { once: true }));
  };
  const { d } = dispatcher(t, pool, client);
  d.start();
  await until(d, 'two running, two waiting', () => client.open.size === 2 && d.status().items.waiting.length === 2);
  const stopped = d.stop();
  await waitFor('waiting items given back', async () => (await countStates(pool)).queued === 2);
  t.equal((await countStates(pool)).claimed, 2, 'the running ones are still carried');
  let done = false;
  void stopped.then(() => (done = true));
  await new Promise((r) => setTimeout(r, 0));
  t.notOk(done, 'stop waits for running items');
  for (const run of [...client.open.values()]) run.finish();
  await stopped;
  t.same(await countStates(pool), { queued: 2, claimed: 0, done: 2, failed: 0 });
  t.equal(d.counters.given_back, 2);
  const { rows } = await pool.query<{ due: boolean }>(`SELECT start_after <= now() AS due FROM file_queue WHERE state = 'queued'`);
  t.ok(rows.every((r) => r.due), 'given back with no delay: nothing ran');
});

t.test('heartbeats keep claims fresh; a claim lost to a sibling is cancelled and not recorded', async (t) => {
  const { pool } = await testSchema(t, 'disp_lost');
  const [a, b] = await add(pool, 2);
  const client = new ScriptedClient();
  const { d, clock } = dispatcher(t, pool, client);
  d.start();
  await until(d, 'two running', () => client.open.size === 2);
  await pool.query(`UPDATE file_queue SET heartbeat_at = now() - interval '1 hour'`);
  clock.advance(200);
  await until(d, 'a heartbeat', () => d.counters.heartbeat_queries === 1);
  await waitFor('fresh heartbeats', async () => {
    const { rows } = await pool.query<{ n: string }>(`SELECT count(*) AS n FROM file_queue WHERE heartbeat_at > now() - interval '1 minute'`);
    return Number(rows[0]!.n) === 2;
  });
  // A sibling took item a (as requeueOrphans would, had our heartbeats stalled).
  await pool.query(`UPDATE file_queue SET state = 'queued', claimed_by = NULL, heartbeat_at = NULL WHERE id = $1`, [a]);
  clock.advance(200);
  await until(d, 'loss noticed', () => d.counters.lost === 1 && d.carried().length === 1);
  t.ok(client.runs.find((r) => r.jobId === `${a}:1`)!.cancelled, 'its run was cancelled');
  t.match(await getItem(pool, a!), { state: 'queued', claimed_by: null, receipt: null }, 'nothing recorded over the sibling');
  client.open.get(`${b}:1`)!.finish();
  await until(d, 'b done', () => d.counters.done === 1);
});

t.test("the sweep requeues a dead sibling's stale claims, never a live one's", async (t) => {
  const { pool } = await testSchema(t, 'disp_sweep');
  await add(pool, 4);
  const deadClient = new ScriptedClient();
  deadClient.share = 2;
  const { d: dead, clock: deadClock } = dispatcher(t, pool, deadClient);
  dead.start();
  await until(dead, 'dead carries two', () => deadClient.open.size === 2);
  const liveClient = new ScriptedClient();
  liveClient.share = 2;
  const { d: live, clock } = dispatcher(t, pool, liveClient, { staleAfterMs: 1000, sweepIntervalMs: 200 });
  live.start();
  await until(live, 'live carries two', () => liveClient.open.size === 2);
  t.same([...new Set((await pool.query(`SELECT claimed_by FROM file_queue`)).rows.map((r) => r.claimed_by))].sort(), [dead.owner, live.owner].sort());
  // `dead` stops heartbeating (its clock never moves again); its claims age past the threshold.
  void deadClock;
  await pool.query(`UPDATE file_queue SET heartbeat_at = now() - interval '5 seconds'`);
  clock.advance(200); // live heartbeats first (same interval), then sweeps
  await until(live, 'swept', () => live.counters.orphans_requeued === 2);
  const owners = (await pool.query<{ claimed_by: string | null; state: string }>(`SELECT claimed_by, state FROM file_queue ORDER BY id`)).rows;
  t.equal(owners.filter((r) => r.claimed_by === live.owner).length, 2, "live's own claims untouched");
  t.equal(owners.filter((r) => r.state === 'queued').length, 2, "dead's claims are queued again");
  for (const run of [...liveClient.open.values()]) run.finish();
  await until(live, 'live takes over the orphans', () => liveClient.runs.length === 4);
  for (const run of [...liveClient.open.values()]) run.finish();
  await until(live, 'all four done by live', () => live.counters.done === 4);
  t.same(await countStates(pool), { queued: 0, claimed: 0, done: 4, failed: 0 });
  t.equal(dead.counters.done, 0, 'the dead one recorded nothing');
});
