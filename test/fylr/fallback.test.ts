import { PassThrough, Readable } from 'node:stream';
import t from 'tap';
import { startLegacyExecserver, type LegacyExecserver } from '../../legacy/execserver/legacy-execserver.js';
import { ManualClock } from '../../src/clock.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import { createGateway } from '../../src/gateway/gateway.js';
import { POLLING_HEADROOM } from '../../src/fylr/admission.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import type { AcquireResult, SlotLease } from '../../src/fylr/lease.js';
import { startBalancer } from '../helpers/balancer.js';
import { catJob, clientConfig, execConfig, Recorder, sleepJob, startExec, type Teardown, waitFor } from './fixtures.js';

function slot(r: AcquireResult): SlotLease {
  if (r.kind !== 'slot') throw new Error(`expected a slot, got ${JSON.stringify(r)}`);
  return r.lease;
}

async function startLegacy(t: Teardown, name: string, processes = 1): Promise<LegacyExecserver> {
  const l = await startLegacyExecserver(execConfig({ name, waitgroups: { w: processes }, services: { sleep: 'w', cat: 'w' } }));
  t.teardown(() => l.close());
  return l;
}

async function startGateway(t: Teardown, backend: string): Promise<{ url: string; instanceId: string; close(): Promise<void> }> {
  const config = parseServeConfig({
    listen: '127.0.0.1:0',
    name: 'gw',
    waitgroups: { w: 1 },
    services: { sleep: { waitgroup: 'w' }, cat: { waitgroup: 'w' } },
    backends: [{ url: backend }],
    gateway: { secret: 'test-secret' },
  });
  const gw = await createGateway({ config });
  const url = await gw.listen();
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> => (closed ??= gw.close());
  t.teardown(close);
  return { url, instanceId: gw.broker.instanceId, close };
}

const tokens200 = (l: LegacyExecserver): number => l.counters.requests.token[200] ?? 0;

t.test('an old execserver (404 on /broker) is served by polling: token, PUT, receipt; body mode too', async (t) => {
  const old = await startLegacy(t, 'old', 2);
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([old.url]), { observer: rec });
  t.teardown(() => client.close());
  await client.start();
  t.equal(client.status().addresses[0]!.transport, 'polling');
  t.ok(rec.events.some((e) => e.kind === 'dialFailed' && e.failure === 'no_broker'), 'the upgrade answered 404');
  t.equal(client.hasExecserver(), true);
  t.equal(client.admission(), POLLING_HEADROOM, 'a polling address starts at the headroom');

  const lease = slot(await client.acquire({ jobId: 'p1', service: 'sleep', priority: 0 }));
  t.equal(lease.transport, 'polling');
  t.equal(lease.address, old.url);
  t.equal(client.admission(), 1 + POLLING_HEADROOM, 'a held slot raises the share');
  const receipt = await lease.run({ service: 'sleep', commands: [{ prog: 'sleep', args: [{ type: 'value', value: '0' }] }] });
  t.equal(receipt.ok, true, JSON.stringify(receipt.error));
  t.equal(old.counters.jobs.sleep, 1);
  t.equal(client.admission(), POLLING_HEADROOM);

  const body = slot(await client.acquire({ jobId: 'p2', service: 'cat', priority: 0 }));
  const out = new PassThrough();
  const chunks: Buffer[] = [];
  out.on('data', (c: Buffer) => chunks.push(c));
  const text = 'polled body\n'.repeat(1000);
  const r2 = await body.run(catJob(), { stdin: Readable.from([Buffer.from(text)]), stdout: out });
  t.equal(r2.ok, true, JSON.stringify(r2.error));
  t.equal(Buffer.concat(chunks).toString(), text, 'stdin as the PUT body, stdout as the response body');
});

t.test('polling: once per retry tick while busy; a surplus token is given back at once', async (t) => {
  const a = await startLegacy(t, 'a', 1);
  const b = await startLegacy(t, 'b', 1);
  const clock = new ManualClock();
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([a.url, b.url]), { clock, observer: rec });
  t.teardown(() => client.close());
  await client.start();
  // Both free: both answer 200, one token wins, the other is redeemed with an empty job at once.
  const lease = slot(await client.acquire({ jobId: 'j', service: 'sleep', priority: 0 }));
  const loser = lease.address === a.url ? b : a;
  const winner = lease.address === a.url ? a : b;
  await waitFor(() => tokens200(loser) === 1 && (loser.counters.emptyJobs.sleep ?? 0) === 1, 'the surplus token is given back');
  const run = lease.run(sleepJob());
  await waitFor(() => (winner.counters.running.w ?? 0) === 1, 'the job runs');

  // The loser is free again right away; take it too, so both are busy.
  const second = slot(await client.acquire({ jobId: 'k', service: 'sleep', priority: 0 }));
  t.equal(second.address, loser.url, 'the given-back slot was free at once, not after 10 s');
  const run2 = second.run(sleepJob());
  await waitFor(() => (loser.counters.running.w ?? 0) === 1, 'both busy');

  const before = rec.events.filter((e) => e.kind === 'token').length;
  const from = rec.events.length;
  const pending = client.acquire({ jobId: 'q', service: 'sleep', priority: 0, timeoutSec: 3 });
  await waitFor(() => rec.events.filter((e) => e.kind === 'token').length === before + 2, 'first round: one GET per address');
  t.equal(rec.events.slice(from).filter((e) => e.kind === 'token' && e.outcome === 'busy').length, 2, 'both busy (503)');
  clock.advance(999);
  await new Promise((r) => setImmediate(r));
  t.equal(rec.events.filter((e) => e.kind === 'token').length, before + 2, 'no request before the tick');
  clock.advance(1);
  await waitFor(() => rec.events.filter((e) => e.kind === 'token').length === before + 4, 'second round after one tick');
  clock.advance(2000);
  t.same(await pending, { kind: 'requeue', reason: 'timeout' });
  lease.cancel();
  second.cancel();
  t.equal((await run).stopped, true, 'cancel() aborts the PUT');
  await run2;
});

t.test('an address switches to the broker when a gateway appears in front (one re-probe), and back to polling when it goes', async (t) => {
  const old = await startLegacy(t, 'old', 1);
  const lb = await startBalancer([old.url]);
  t.teardown(() => lb.close());
  const clock = new ManualClock();
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([lb.url], { reprobe_interval_ms: 30_000 }), {
    clock,
    observer: rec,
    pingIntervalMs: 3_600_000,
    backoff: { initialMs: 500, maxMs: 500 },
    random: () => 1,
  });
  t.teardown(() => client.close());
  await client.start();
  t.equal(client.status().addresses[0]!.transport, 'polling');
  const l1 = slot(await client.acquire({ jobId: 'a', service: 'sleep', priority: 0 }));
  t.equal(l1.transport, 'polling');
  t.equal((await l1.run({ service: 'sleep', commands: [] })).ok, true);

  // Operator puts a gateway in front of the old execserver; the balancer now routes to it.
  const gw = await startGateway(t, old.url);
  lb.setTargets([gw.url]);
  clock.advance(29_999);
  await new Promise((r) => setImmediate(r));
  t.equal(client.status().addresses[0]!.transport, 'polling', 'no switch before the re-probe');
  t.equal(rec.dials('reprobe').length, 0);
  clock.advance(1);
  await rec.waitFor((e) => e.kind === 'transport' && e.transport === 'broker', 'switched to the broker');
  t.same(rec.dials('reprobe').map((d) => d.at), [30_000], 'at the first re-probe');
  t.same(client.status().addresses[0]!.instances, [gw.instanceId]);
  const l2 = slot(await client.acquire({ jobId: 'b', service: 'sleep', priority: 0 }));
  t.equal(l2.transport, 'broker', 'slots now come as OFFERs');
  const r2 = await l2.run({ service: 'sleep', commands: [{ prog: 'sleep', args: [{ type: 'value', value: '0' }] }] });
  t.equal(r2.ok, true, JSON.stringify(r2.error));
  t.equal(old.counters.jobs.sleep, 2, 'the job ran on the old execserver, through the gateway');

  // The gateway goes away; behind the address is the old server again.
  lb.setTargets([old.url]);
  await gw.close();
  await rec.waitFor((e) => e.kind === 'disconnected', 'the broker connection drops');
  clock.advance(500);
  await rec.waitFor((e) => e.kind === 'transport' && e.transport === 'polling', 'fell back to polling', 10_000, rec.events.findIndex((e) => e.kind === 'disconnected'));
  t.equal(client.status().addresses[0]!.transport, 'polling');
  const l3 = slot(await client.acquire({ jobId: 'c', service: 'sleep', priority: 0 }));
  t.equal(l3.transport, 'polling');
  t.equal((await l3.run({ service: 'sleep', commands: [] })).ok, true);
});

t.test('a broker address and a polling address race for one job; a busy broker loses to a free old server', async (t) => {
  const modern = await startExec(t, { name: 'new', waitgroups: { w: 1 }, services: { sleep: 'w' } });
  const old = await startLegacy(t, 'old', 1);
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([modern.url, old.url]), { observer: rec });
  t.teardown(() => client.close());
  await client.start();
  t.same(client.status().addresses.map((a) => a.transport), ['broker', 'polling']);
  // Occupy both, then free only the old one.
  const first = slot(await client.acquire({ jobId: 'x', service: 'sleep', priority: 0 }));
  const second = slot(await client.acquire({ jobId: 'y', service: 'sleep', priority: 0 }));
  t.same([first.transport, second.transport].sort(), ['broker', 'polling']);
  const [onBroker, onOld] = first.transport === 'broker' ? [first, second] : [second, first];
  const runB = onBroker.run(sleepJob());
  const runO = onOld.run(sleepJob());
  await waitFor(() => modern.exec.broker.status().waitgroups.w!.running === 1 && (old.counters.running.w ?? 0) === 1, 'both busy');
  const pending = client.acquire({ jobId: 'z', service: 'sleep', priority: 0 });
  await waitFor(() => modern.exec.broker.status().waitgroups.w!.parked === 1, 'z parked on the broker');
  onOld.cancel();
  await runO;
  const z = slot(await pending);
  t.equal(z.transport, 'polling', 'the old server had the first free slot');
  await waitFor(() => modern.exec.broker.status().waitgroups.w!.parked === 0, 'and the broker want was withdrawn');
  t.same(rec.sent('UNWANT', modern.exec.broker.instanceId).filter((m) => m.type === 'UNWANT' && m.job_id === 'z'), [{ type: 'UNWANT', job_id: 'z' }]);
  z.release();
  onBroker.cancel();
  await runB;
});
