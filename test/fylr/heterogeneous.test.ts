import t from 'tap';
import { ManualClock } from '../../src/clock.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import type { AcquireResult, SlotLease } from '../../src/fylr/lease.js';
import { clientConfig, hello, Recorder, sleepJob, startExec, startFakeExec, waitFor } from './fixtures.js';

function slot(r: AcquireResult): SlotLease {
  if (r.kind !== 'slot') throw new Error(`expected a slot, got ${JSON.stringify(r)}`);
  return r.lease;
}

t.test('heterogeneous fleet: a want is parked only where HELLO announced the service', async (t) => {
  const a = await startExec(t, { name: 'a', waitgroups: { w: 1 }, services: { convert: 'w' } });
  const b = await startExec(t, { name: 'b', waitgroups: { w: 5 }, services: { other: 'w' } });
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([a.url, b.url]), { observer: rec });
  t.teardown(() => client.close());
  await client.start();
  const first = slot(await client.acquire({ jobId: 'j1', service: 'convert', priority: 0 }));
  const run1 = first.run(sleepJob('convert'));
  const pending = client.acquire({ jobId: 'j2', service: 'convert', priority: 0 });
  await waitFor(() => a.exec.broker.status().waitgroups.w!.parked === 1, 'j2 parked on a');
  t.equal(b.exec.broker.status().connections[0]!.frames_in, 0, 'b, which does not offer convert, received no frame at all');
  t.equal(rec.sent('WANT', b.exec.broker.instanceId).length, 0);
  t.equal(b.exec.broker.status().waitgroups.w!.parked, 0, "b's free slots are not taken");
  first.cancel();
  await run1;
  const second = slot(await pending);
  t.equal(second.address, a.url, 'served where the service lives');
  second.release();
  // The other service goes only to b.
  const o = slot(await client.acquire({ jobId: 'o', service: 'other', priority: 0 }));
  t.equal(o.address, b.url);
  t.equal(rec.sent('WANT', a.exec.broker.instanceId).filter((m) => m.type === 'WANT' && m.service === 'other').length, 0);
  o.release();
});

t.test('HELLO changes are applied at once: a service that appears gets the parked want; a draining instance gets none', async (t) => {
  const f = await startFakeExec(t, { hello: () => hello({ instance_id: 'h1', services: {}, waitgroups: { w: { processes: 4, running: 0, parked: 0 } } }) });
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([f.url]), { observer: rec });
  t.teardown(() => client.close());
  await client.start();
  const c = await f.conn(0);
  t.equal(client.admission(), 0, 'no service announced: no capacity');
  const pending = client.acquire({ jobId: 'j', service: 'svc', priority: 0, timeoutSec: 3600 });
  c.send(hello({ instance_id: 'h1', services: { svc: 'w' }, draining: true }));
  await rec.waitFor((e) => e.kind === 'in' && e.message.type === 'HELLO' && e.message.draining, 'the draining HELLO is seen');
  t.equal(client.admission(), 0, 'a draining instance adds no admission');
  t.equal(client.hasExecserver(), false, 'nor counts as an execserver');
  t.equal(c.received.length, 0, 'no WANT to a draining instance');
  c.send(hello({ instance_id: 'h1', services: { svc: 'w' }, draining: false }));
  t.same(await c.next((m) => m.type === 'WANT', 'WANT'), { type: 'WANT', job_id: 'j', service: 'svc', priority: 0 });
  t.equal(client.admission(), 4 + 2, 'processes 4, clients 1, headroom 2');
  t.equal(client.hasExecserver(), true);
  c.send({ type: 'OFFER', job_id: 'j', token: 't', expires_ms: 5000 });
  slot(await pending).release();
  // A WANT the server refuses (it is draining after all) is not counted as parked there.
  const p2 = client.acquire({ jobId: 'k', service: 'svc', priority: 0, timeoutSec: 3600 });
  await c.next((m) => m.type === 'WANT' && m.job_id === 'k', 'WANT k');
  c.send({ type: 'ERROR', code: 'draining', message: 'draining', job_id: 'k' });
  c.send(hello({ instance_id: 'h1', services: { svc: 'w' }, clients: 2 }));
  await waitFor(() => c.received.filter((m) => m.type === 'WANT' && m.job_id === 'k').length === 2, 'the refused WANT is sent again on the next HELLO');
  c.send({ type: 'OFFER', job_id: 'k', token: 't2', expires_ms: 5000 });
  slot(await p2).release();
});

t.test('an address with /job/<service> is used for that service only', async (t) => {
  const a = await startExec(t, { name: 'a', waitgroups: { w: 3, x: 7 }, services: { convert: 'w', other: 'x' } });
  const clock = new ManualClock();
  const client = new ExecClient(clientConfig([`${a.url}/job/convert`]), { clock, pingIntervalMs: 3_600_000 });
  t.teardown(() => client.close());
  await client.start();
  t.equal(client.admission(), 3 + 2, "only convert's waitgroup counts");
  const other = client.acquire({ jobId: 'o', service: 'other', priority: 0, timeoutSec: 5 });
  const conv = slot(await client.acquire({ jobId: 'c', service: 'convert', priority: 0 }));
  t.equal(a.exec.broker.status().connections[0]!.frames_in, 1, 'only the WANT for convert reached the server');
  clock.advance(5000);
  t.same(await other, { kind: 'requeue', reason: 'timeout' });
  conv.release();
});
