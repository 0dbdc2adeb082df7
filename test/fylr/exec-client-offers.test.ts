import t from 'tap';
import { ManualClock } from '../../src/clock.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import type { DoneMessage, OfferMessage } from '../../src/protocol/messages.js';
import { okReceipt } from '../../src/protocol/job.js';
import { clientConfig, Recorder, sleepJob, startExec, startFakeExec, waitFor } from './fixtures.js';

const emptyJob = (service: string) => ({ service, commands: [] });

t.test('first OFFER wins across two execservers; the loser is DECLINEd and its slot is free at once', async (t) => {
  // Offers would only lapse after a minute: whatever frees the loser's slot, it is not the expiry.
  const a = await startExec(t, { name: 'a', waitgroups: { w: 1 }, services: { sleep: 'w' }, offerTimeoutMs: 60_000 });
  const b = await startExec(t, { name: 'b', waitgroups: { w: 1 }, services: { sleep: 'w' }, offerTimeoutMs: 60_000 });
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([a.url, b.url]), { observer: rec });
  t.teardown(() => client.close());
  await client.start();

  const got = await client.acquire({ jobId: 'j1', service: 'sleep', priority: 0 });
  if (got.kind !== 'slot') throw new Error('expected a slot');
  const [winner, loser] = got.lease.address === a.url ? [a, b] : [b, a];
  const loserId = loser.exec.broker.instanceId;
  t.equal(rec.sent('WANT').length, 2, 'WANT went to both');

  // Both had a free slot, so both offered; the loser's OFFER gets a DECLINE carrying its token.
  const offer = (await rec.waitFor((e) => e.kind === 'in' && e.instance === loserId && e.message.type === 'OFFER', "the loser's OFFER")) as { message: OfferMessage };
  const declines = rec.sent('DECLINE', loserId);
  t.same(declines, [{ type: 'DECLINE', job_id: 'j1', token: offer.message.token }], 'the loser got DECLINE with its own token');
  t.same(rec.sent('UNWANT', loserId), [{ type: 'UNWANT', job_id: 'j1' }], 'and UNWANT (it sent the OFFER before it saw the UNWANT)');
  t.same(rec.sent('UNWANT', winner.exec.broker.instanceId), [], 'the winner is not UNWANTed');

  await waitFor(() => {
    const wg = loser.exec.broker.status().waitgroups.w!;
    return wg.offered === 0 && wg.in_use === 0;
  }, 'the loser frees its slot');
  t.equal(winner.exec.broker.status().waitgroups.w!.offered, 1, 'the winner holds the offer until JOB');

  // Re-offered at once: another fylr that asks the loser now gets that one slot without waiting.
  const other = new ExecClient(clientConfig([loser.url], { connectTimeoutSec: 10 }));
  t.teardown(() => other.close());
  await other.start();
  const second = await other.acquire({ jobId: 'k1', service: 'sleep', priority: 0 });
  t.equal(second.kind, 'slot', "the loser's slot went to the next want");

  const receipt = await got.lease.run(emptyJob('sleep'));
  t.equal(receipt.ok, true, 'the winner runs the job');
  t.equal(rec.sent('JOB', winner.exec.broker.instanceId).length, 1);
  t.equal(rec.sent('JOB', loserId).length, 0);
  if (second.kind === 'slot') second.lease.release();
  await waitFor(() => loser.exec.broker.status().waitgroups.w!.in_use === 0, 'release() frees the slot');
});

t.test('a later OFFER gets DECLINE at once; JOB goes to the winner at run(); DONE resolves run()', async (t) => {
  const f1 = await startFakeExec(t);
  const f2 = await startFakeExec(t);
  const client = new ExecClient(clientConfig([f1.url, f2.url]));
  t.teardown(() => client.close());
  await client.start();
  const pending = client.acquire({ jobId: 'j', service: 'svc', priority: 3 });
  const c1 = await f1.conn(0);
  const c2 = await f2.conn(0);
  t.same(await c1.next((m) => m.type === 'WANT', 'WANT'), { type: 'WANT', job_id: 'j', service: 'svc', priority: 3 });
  await c2.next((m) => m.type === 'WANT', 'WANT');
  c1.send({ type: 'OFFER', job_id: 'j', token: 't1', expires_ms: 5000 });
  const got = await pending;
  if (got.kind !== 'slot') throw new Error('expected a slot');
  t.equal(got.lease.transport, 'broker');
  t.equal(got.lease.address, f1.url);
  await c2.next((m) => m.type === 'UNWANT', 'UNWANT on the other');
  c2.send({ type: 'OFFER', job_id: 'j', token: 't2', expires_ms: 5000 });
  t.same(await c2.next((m) => m.type === 'DECLINE', 'DECLINE'), { type: 'DECLINE', job_id: 'j', token: 't2' });

  const run = got.lease.run({ service: 'svc', commands: [] });
  const job = await c1.next((m) => m.type === 'JOB', 'JOB');
  t.same(job, { type: 'JOB', job_id: 'j', token: 't1', job: { service: 'svc', commands: [] } }, 'no pipes for a job without body streams');
  const done: DoneMessage = { type: 'DONE', job_id: 'j', receipt: { ...okReceipt(12), stdout_prefix: 'hi' } };
  c1.send(done);
  const receipt = await run;
  t.equal(receipt.ok, true);
  t.equal(receipt.duration_ms, 12);
  t.equal(receipt.stdout_prefix, 'hi');
  t.equal(c2.received.filter((m) => m.type === 'JOB').length, 0);
});

t.test('no slot within the timeout: UNWANT everywhere, requeue; an OFFER after the UNWANT is DECLINEd', async (t) => {
  const clock = new ManualClock();
  const f1 = await startFakeExec(t);
  const f2 = await startFakeExec(t);
  const client = new ExecClient(clientConfig([f1.url, f2.url], { connectTimeoutSec: 30 }), { clock, pingIntervalMs: 3_600_000 });
  t.teardown(() => client.close());
  await client.start();
  const pending = client.acquire({ jobId: 'j', service: 'svc', priority: 0 });
  const c1 = await f1.conn(0);
  const c2 = await f2.conn(0);
  await c1.next((m) => m.type === 'WANT', 'WANT 1');
  await c2.next((m) => m.type === 'WANT', 'WANT 2');
  clock.advance(29_999);
  t.equal(client.status().waiting, 1, 'still waiting just before connectTimeoutSec');
  clock.advance(1);
  t.same(await pending, { kind: 'requeue', reason: 'timeout' });
  t.same(await c1.next((m) => m.type === 'UNWANT', 'UNWANT 1'), { type: 'UNWANT', job_id: 'j' });
  t.same(await c2.next((m) => m.type === 'UNWANT', 'UNWANT 2'), { type: 'UNWANT', job_id: 'j' });
  c1.send({ type: 'OFFER', job_id: 'j', token: 'late', expires_ms: 5000 });
  t.same(await c1.next((m) => m.type === 'DECLINE', 'DECLINE'), { type: 'DECLINE', job_id: 'j', token: 'late' });
  // An OFFER for a job this fylr never asked for is declined too.
  c2.send({ type: 'OFFER', job_id: 'nobody', token: 'x', expires_ms: 5000 });
  t.same(await c2.next((m) => m.type === 'DECLINE', 'DECLINE'), { type: 'DECLINE', job_id: 'nobody', token: 'x' });

  // timeoutSec overrides connectTimeoutSec.
  const short = client.acquire({ jobId: 's', service: 'svc', priority: 0, timeoutSec: 2 });
  clock.advance(2000);
  t.same(await short, { kind: 'requeue', reason: 'timeout' });
});

t.test('abort: UNWANT and requeue; a duplicate job id is refused', async (t) => {
  const f = await startFakeExec(t);
  const client = new ExecClient(clientConfig([f.url]));
  t.teardown(() => client.close());
  await client.start();
  const ac = new AbortController();
  const pending = client.acquire({ jobId: 'j', service: 'svc', priority: 0 }, ac.signal);
  const c = await f.conn(0);
  await c.next((m) => m.type === 'WANT', 'WANT');
  await t.rejects(client.acquire({ jobId: 'j', service: 'svc', priority: 0 }), { code: 'duplicate_job' });
  ac.abort();
  t.same(await pending, { kind: 'requeue', reason: 'aborted' });
  await c.next((m) => m.type === 'UNWANT', 'UNWANT');
  t.equal(c.received.filter((m) => m.type === 'WANT').length, 1);
});

t.test('release() DECLINEs; a lapsed offer runs nothing (no_slot); offer_expired voids the lease', async (t) => {
  const clock = new ManualClock();
  const f = await startFakeExec(t);
  const client = new ExecClient(clientConfig([f.url]), { clock, pingIntervalMs: 3_600_000 });
  t.teardown(() => client.close());
  await client.start();
  const c = await f.conn(0);

  const p1 = client.acquire({ jobId: 'r', service: 'svc', priority: 0 });
  await c.next((m) => m.type === 'WANT' && m.job_id === 'r', 'WANT r');
  c.send({ type: 'OFFER', job_id: 'r', token: 'tr', expires_ms: 5000 });
  const r1 = await p1;
  if (r1.kind !== 'slot') throw new Error('slot');
  r1.lease.release();
  t.same(await c.next((m) => m.type === 'DECLINE', 'DECLINE'), { type: 'DECLINE', job_id: 'r', token: 'tr' });
  t.equal((await r1.lease.run(emptyJob('svc'))).error?.code, 'no_slot', 'run() after release(): nothing ran');

  const p2 = client.acquire({ jobId: 'e', service: 'svc', priority: 0 });
  await c.next((m) => m.type === 'WANT' && m.job_id === 'e', 'WANT e');
  c.send({ type: 'OFFER', job_id: 'e', token: 'te', expires_ms: 100 });
  const r2 = await p2;
  if (r2.kind !== 'slot') throw new Error('slot');
  clock.advance(100);
  const lapsed = await r2.lease.run(emptyJob('svc'));
  t.equal(lapsed.ok, false);
  t.equal(lapsed.error?.code, 'no_slot');
  t.equal(c.received.filter((m) => m.type === 'JOB').length, 0, 'no JOB for a lapsed offer');

  const p3 = client.acquire({ jobId: 'x', service: 'svc', priority: 0 });
  await c.next((m) => m.type === 'WANT' && m.job_id === 'x', 'WANT x');
  c.send({ type: 'OFFER', job_id: 'x', token: 'tx', expires_ms: 5000 });
  const r3 = await p3;
  if (r3.kind !== 'slot') throw new Error('slot');
  c.send({ type: 'ERROR', code: 'offer_expired', message: 'too slow', job_id: 'x' });
  await waitFor(() => client.status().leases === 0, 'the lease is void');
  t.equal((await r3.lease.run(emptyJob('svc'))).error?.code, 'no_slot');

  // A JOB the server refuses (no_offer) ran nothing either.
  const p4 = client.acquire({ jobId: 'n', service: 'svc', priority: 0 });
  await c.next((m) => m.type === 'WANT' && m.job_id === 'n', 'WANT n');
  c.send({ type: 'OFFER', job_id: 'n', token: 'tn', expires_ms: 5000 });
  const r4 = await p4;
  if (r4.kind !== 'slot') throw new Error('slot');
  const run4 = r4.lease.run(emptyJob('svc'));
  await c.next((m) => m.type === 'JOB' && m.job_id === 'n', 'JOB n');
  c.send({ type: 'ERROR', code: 'no_offer', message: 'no live offer', job_id: 'n' });
  t.equal((await run4).error?.code, 'no_slot');

  // run() with another service than acquired: refused locally, the slot is given back.
  const p5 = client.acquire({ jobId: 'w', service: 'svc', priority: 0 });
  await c.next((m) => m.type === 'WANT' && m.job_id === 'w', 'WANT w');
  c.send({ type: 'OFFER', job_id: 'w', token: 'tw', expires_ms: 5000 });
  const r5 = await p5;
  if (r5.kind !== 'slot') throw new Error('slot');
  t.equal((await r5.lease.run(emptyJob('other'))).error?.code, 'invalid_job');
  t.same(await c.next((m) => m.type === 'DECLINE' && m.job_id === 'w', 'DECLINE w'), { type: 'DECLINE', job_id: 'w', token: 'tw' });
});

t.test('cancel() sends CANCEL; a connection lost while running reports stopped', async (t) => {
  const f = await startFakeExec(t);
  const client = new ExecClient(clientConfig([f.url]), { backoff: { initialMs: 10_000, maxMs: 10_000 } });
  t.teardown(() => client.close());
  await client.start();
  const c = await f.conn(0);
  const p = client.acquire({ jobId: 'c', service: 'svc', priority: 0 });
  await c.next((m) => m.type === 'WANT', 'WANT');
  c.send({ type: 'OFFER', job_id: 'c', token: 't', expires_ms: 5000 });
  const got = await p;
  if (got.kind !== 'slot') throw new Error('slot');
  const run = got.lease.run(sleepJob('svc'));
  await c.next((m) => m.type === 'JOB', 'JOB');
  got.lease.cancel();
  t.same(await c.next((m) => m.type === 'CANCEL', 'CANCEL'), { type: 'CANCEL', job_id: 'c' });
  c.ws.terminate();
  const receipt = await run;
  t.equal(receipt.ok, false);
  t.equal(receipt.stopped, true);
  t.equal(receipt.error?.code, 'stopped');
});

t.test('real execserver: a sleeping job is cancelled and its DONE says stopped', async (t) => {
  const a = await startExec(t, { name: 'a', waitgroups: { w: 1 }, services: { sleep: 'w' } });
  const client = new ExecClient(clientConfig([a.url]));
  t.teardown(() => client.close());
  await client.start();
  const got = await client.acquire({ jobId: 'j', service: 'sleep', priority: 0 });
  if (got.kind !== 'slot') throw new Error('slot');
  const run = got.lease.run(sleepJob());
  await waitFor(() => a.exec.broker.status().waitgroups.w!.running === 1, 'the job runs');
  got.lease.cancel();
  const receipt = await run;
  t.equal(receipt.stopped, true);
  t.equal(receipt.ok, false);
});
