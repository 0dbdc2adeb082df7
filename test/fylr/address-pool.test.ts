import t from 'tap';
import { ManualClock } from '../../src/clock.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import type { AcquireResult, SlotLease } from '../../src/fylr/lease.js';
import { startBalancer } from '../helpers/balancer.js';
import { clientConfig, Recorder, type RunningExec, sleepJob, startExec, waitFor } from './fixtures.js';

const quiet = { pingIntervalMs: 3_600_000 };

function slot(r: AcquireResult): SlotLease {
  if (r.kind !== 'slot') throw new Error(`expected a slot, got ${JSON.stringify(r)}`);
  return r.lease;
}

/** Advance the client's clock one retry tick at a time, letting sockets answer in between. */
async function tick(clock: ManualClock, ms: number): Promise<void> {
  for (let done = 0; done < ms; done += 1000) {
    clock.advance(Math.min(1000, ms - done));
    await new Promise((r) => setImmediate(r));
  }
}

function connectionsOf(e: RunningExec): number {
  return e.exec.broker.connectionCount;
}

t.test('three replicas behind a balancer: the pool grows under backpressure until covered, one dial per 2 s at most; a later replica is found after the re-probe', async (t) => {
  const reps = await Promise.all(['r1', 'r2', 'r3'].map((name) => startExec(t, { name, waitgroups: { w: 1 }, services: { sleep: 'w' } })));
  const lb = await startBalancer(reps.map((r) => r.url));
  t.teardown(() => lb.close());
  const clock = new ManualClock();
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([lb.url], { reprobe_interval_ms: 60_000 }), { clock, observer: rec, ...quiet });
  t.teardown(() => client.close());
  await client.start();
  t.equal(client.status().addresses[0]!.connections, 1, 'one connection to start');

  const runs: Promise<unknown>[] = [];
  const leases: SlotLease[] = [];
  const hold = (l: SlotLease): void => {
    leases.push(l);
    runs.push(l.run(sleepJob()));
  };
  t.teardown(() => leases.forEach((l) => l.cancel()));

  hold(slot(await client.acquire({ jobId: 'j1', service: 'sleep', priority: 0 })));
  // j2 finds the only reached replica busy: backpressure.
  const j2 = client.acquire({ jobId: 'j2', service: 'sleep', priority: 0, timeoutSec: 3600 });
  await tick(clock, 1000);
  t.equal(rec.dials().length, 1, 'no growth before 2 s have passed since the last dial');
  await tick(clock, 1000);
  hold(slot(await j2));
  t.equal(client.status().addresses[0]!.connections, 2, 'grown to a second replica, which served j2');

  const j3 = client.acquire({ jobId: 'j3', service: 'sleep', priority: 0, timeoutSec: 3600 });
  await tick(clock, 1000);
  t.equal(rec.dials().length, 2, 'rate limit: still two dials one second later');
  await tick(clock, 1000);
  hold(slot(await j3));
  t.equal(client.status().addresses[0]!.connections, 3);

  // Every replica is busy now; the next dial lands on a replica already in the pool.
  const j4 = client.acquire({ jobId: 'j4', service: 'sleep', priority: 0, timeoutSec: 3600 });
  await tick(clock, 2000);
  await rec.waitFor((e) => e.kind === 'duplicate', 'a duplicate instance');
  await waitFor(() => reps.every((r) => connectionsOf(r) === 1), 'the duplicate is closed: each replica counts this fylr once');
  let st = client.status().addresses[0]!;
  t.equal(st.connections, 3);
  t.equal(st.covered, true, 'covered: circled back to a known replica');
  t.same([...st.instances].sort(), reps.map((r) => r.exec.broker.instanceId).sort(), 'reached all three');

  await tick(clock, 20_000);
  t.equal(rec.dials().length, 4, 'covered: no more growth while the want still waits');
  const times = rec.dials().map((d) => d.at);
  t.same(times, [0, 2000, 4000, 6000], 'dial times');
  for (let i = 1; i < times.length; i++) t.ok(times[i]! - times[i - 1]! >= 2000, `dial ${i} is ≥ 2 s after the one before`);

  // A fourth replica joins. Put it where the round-robin balancer picks next (it counts every pick).
  const r4 = await startExec(t, { name: 'r4', waitgroups: { w: 1 }, services: { sleep: 'w' } });
  const picks = Object.values(lb.counts).reduce((a, b) => a + b, 0);
  const targets = reps.map((r) => r.url);
  targets.splice(picks % 3, 0, r4.url);
  lb.setTargets(targets);
  await tick(clock, 60_000 - 26_000 - 1000);
  t.equal(rec.dials().length, 4, 'no dial before the re-probe, although a replica was added');
  t.equal(client.status().addresses[0]!.covered, true);
  await tick(clock, 1000); // t = 60 000: the re-probe clears `covered`, the tick grows
  const lease4 = slot(await j4);
  hold(lease4);
  st = client.status().addresses[0]!;
  t.equal(st.connections, 4, 'the new replica joined the pool');
  t.ok(st.instances.includes(r4.exec.broker.instanceId));
  t.same(rec.dials().map((d) => d.at), [0, 2000, 4000, 6000, 60_000]);
  await waitFor(() => r4.exec.broker.status().waitgroups.w!.running === 1, 'j4 runs on the new replica');
  t.equal(rec.sent('WANT', r4.exec.broker.instanceId).length, 1, 'the parked want was registered on the new replica');
  for (const l of leases) l.cancel();
  await Promise.all(runs);
});

t.test('growth is capped by max_connections_per_address', async (t) => {
  const reps = await Promise.all(['c1', 'c2', 'c3'].map((name) => startExec(t, { name, waitgroups: { w: 1 }, services: { sleep: 'w' } })));
  const lb = await startBalancer(reps.map((r) => r.url));
  t.teardown(() => lb.close());
  const clock = new ManualClock();
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([lb.url], { max_connections_per_address: 2 }), { clock, observer: rec, ...quiet });
  t.teardown(() => client.close());
  await client.start();
  const leases: SlotLease[] = [];
  t.teardown(() => leases.forEach((l) => l.cancel()));
  const l1 = slot(await client.acquire({ jobId: 'a', service: 'sleep', priority: 0 }));
  leases.push(l1);
  void l1.run(sleepJob());
  const b = client.acquire({ jobId: 'b', service: 'sleep', priority: 0, timeoutSec: 3600 });
  await tick(clock, 2000);
  const l2 = slot(await b);
  leases.push(l2);
  void l2.run(sleepJob());
  const c = client.acquire({ jobId: 'c', service: 'sleep', priority: 0, timeoutSec: 3600 });
  await tick(clock, 10_000);
  t.equal(rec.dials().length, 2, 'no third connection');
  t.equal(client.status().addresses[0]!.connections, 2);
  t.equal(client.status().addresses[0]!.covered, false, 'stopped by the cap, not by a duplicate');
  t.equal(client.status().waiting, 1);
  leases.forEach((l) => l.cancel());
  const lc = slot(await c);
  lc.release();
});

t.test('a single execserver: one probe dial finds the same instance, the pool stays at one connection', async (t) => {
  const only = await startExec(t, { name: 'only', waitgroups: { w: 1 }, services: { sleep: 'w' } });
  const clock = new ManualClock();
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([only.url]), { clock, observer: rec, ...quiet });
  t.teardown(() => client.close());
  await client.start();
  const l1 = slot(await client.acquire({ jobId: 'a', service: 'sleep', priority: 0 }));
  const run = l1.run(sleepJob());
  const b = client.acquire({ jobId: 'b', service: 'sleep', priority: 0, timeoutSec: 3600 });
  await tick(clock, 2000);
  await rec.waitFor((e) => e.kind === 'duplicate', 'the probe dial reaches the same instance');
  await tick(clock, 20_000);
  t.equal(rec.dials().length, 2, 'no further dials once covered');
  await waitFor(() => connectionsOf(only) === 1, 'one connection left');
  t.equal(client.status().addresses[0]!.connections, 1);
  l1.cancel();
  await run;
  slot(await b).release();
});

t.test('heterogeneous replicas behind one balancer: growth finds the replica that announces the service', async (t) => {
  const general = await startExec(t, { name: 'general', waitgroups: { w: 4 }, services: { other: 'w' } });
  const special = await startExec(t, { name: 'special', waitgroups: { g: 1 }, services: { convert: 'g' } });
  const lb = await startBalancer([general.url, special.url]);
  t.teardown(() => lb.close());
  const clock = new ManualClock();
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([lb.url]), { clock, observer: rec, ...quiet });
  t.teardown(() => client.close());
  await client.start();
  t.same(client.status().addresses[0]!.instances, [general.exec.broker.instanceId], 'the first connection reached the general replica');
  const pending = client.acquire({ jobId: 'v', service: 'convert', priority: 0 });
  await tick(clock, 1000);
  t.equal(rec.sent('WANT').length, 0, 'no replica reached so far announces convert: no WANT anywhere');
  await tick(clock, 1000);
  const lease = slot(await pending);
  t.equal(lease.address, lb.url);
  t.equal(rec.sent('WANT', special.exec.broker.instanceId).length, 1);
  t.equal(rec.sent('WANT', general.exec.broker.instanceId).length, 0, 'never a WANT where the service is not announced');
  t.equal(general.exec.broker.status().connections[0]!.frames_in, 0, 'the general replica received nothing');
  t.equal((await lease.run({ service: 'convert', commands: [] })).ok, true);
});
