import { once } from 'node:events';
import t from 'tap';
import { ManualClock } from '../../src/clock.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import type { AcquireResult, SlotLease } from '../../src/fylr/lease.js';
import { clientConfig, Recorder, sleepJob, startExec, startFakeExec, waitFor } from './fixtures.js';

function slot(r: AcquireResult): SlotLease {
  if (r.kind !== 'slot') throw new Error(`expected a slot, got ${JSON.stringify(r)}`);
  return r.lease;
}

t.test('execserver restart: the parked want waits through the outage and is re-registered after the reconnect', async (t) => {
  const first = await startExec(t, { name: 'x', waitgroups: { w: 1 }, services: { sleep: 'w' } });
  const clock = new ManualClock();
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([first.url]), {
    clock,
    observer: rec,
    pingIntervalMs: 3_600_000,
    backoff: { initialMs: 1000, maxMs: 1000 },
    random: () => 1,
  });
  t.teardown(() => client.close());
  await client.start();
  const running = slot(await client.acquire({ jobId: 'j1', service: 'sleep', priority: 0 }));
  const run1 = running.run(sleepJob());
  const pending = client.acquire({ jobId: 'j2', service: 'sleep', priority: 5 });
  await waitFor(() => first.exec.broker.status().waitgroups.w!.parked === 1, 'j2 parked');

  await first.close();
  const r1 = await run1;
  t.equal(r1.stopped, true, 'the running job is reported stopped');
  await rec.waitFor((e) => e.kind === 'disconnected', 'the link drops');
  t.equal(client.status().addresses[0]!.transport, 'down');
  clock.advance(1000);
  await rec.waitFor((e) => e.kind === 'dialFailed' && e.purpose === 'reconnect', 'a reconnect fails while the server is down');
  t.equal(client.status().waiting, 1, 'j2 still waits (no requeue while the execserver is away)');

  const second = await startExec(t, { name: 'x', waitgroups: { w: 1 }, services: { sleep: 'w' }, listen: `127.0.0.1:${first.port}` });
  t.not(second.exec.broker.instanceId, first.exec.broker.instanceId, 'a new boot, a new instance_id');
  clock.advance(1000);
  const lease = slot(await pending);
  t.equal(lease.address, first.url);
  t.same(rec.sent('WANT', second.exec.broker.instanceId), [{ type: 'WANT', job_id: 'j2', service: 'sleep', priority: 5 }], 're-registered with its priority');
  t.equal((await lease.run({ service: 'sleep', commands: [] })).ok, true, 'and served');
  t.equal(client.status().addresses[0]!.transport, 'broker');
});

t.test('ping: a server silent for two intervals is terminated; one that answers is kept', async (t) => {
  const mute = await startFakeExec(t, { autoPong: false });
  const fine = await startFakeExec(t);
  const clock = new ManualClock();
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([mute.url, fine.url]), { clock, observer: rec, pingIntervalMs: 1000, backoff: { initialMs: 1e9, maxMs: 1e9 } });
  t.teardown(() => client.close());
  await client.start();
  const m = await mute.conn(0);
  const pinged = once(m.ws, 'ping');
  clock.advance(1000);
  await pinged;
  await rec.waitFor((e) => e.kind === 'pong' && e.address === fine.url, 'the answering server pongs');
  t.equal(client.status().addresses[0]!.connections, 1, 'one silent interval is tolerated');
  clock.advance(1000);
  const gone = await rec.waitFor((e) => e.kind === 'disconnected', 'the silent server is dropped');
  t.same(gone, { kind: 'disconnected', address: mute.url, instance: 'fake-0', reason: 'ping_timeout' });
  await rec.waitFor((e) => e.kind === 'pong' && e.address === fine.url, 'pong', 10_000, rec.events.indexOf(gone));
  clock.advance(1000);
  await rec.waitFor((e) => e.kind === 'pong' && e.address === fine.url, 'pong again', 10_000, rec.events.length);
  t.equal(client.status().addresses[1]!.connections, 1, 'the answering server is kept');
  t.equal(rec.events.filter((e) => e.kind === 'disconnected').length, 1);
});
