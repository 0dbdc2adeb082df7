/**
 * What the gateway costs the legacy backends: nothing while idle, about one token request per
 * backend per poll interval while wants wait (however many), and no wait for the poll when a
 * slot frees through a job the gateway relayed. The gateway runs on a ManualClock, so "5 s of
 * idle" and "10 poll intervals" are exact and take no real time.
 */
import t from 'tap';
import { ManualClock } from '../../src/clock.js';
import type { GatewaySlotSource } from '../../src/gateway/gateway-slot-source.js';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { eventually } from '../helpers/wait.js';
import { allRequests, type RunningGateway, startBackend, startGateway, type Teardown, tokenRequests, turns } from './gateway-world.js';

async function peer(t: Teardown, url: string): Promise<BrokerPeer> {
  const p = await BrokerPeer.connect(url);
  t.teardown(() => p.close());
  return p;
}

/** Waits until the gateway has no token request in flight (their answers are counted at the backends by then). */
async function settled(gw: RunningGateway): Promise<void> {
  const source = gw.server.source as GatewaySlotSource;
  await eventually(() => source.status().token_requests_in_flight === 0, { what: 'token requests to settle' });
  await turns();
}

/** Takes a backend's slot the way an old fylr does, straight at the backend; returns the token. */
async function holdSlot(url: string, service = 'echo'): Promise<string> {
  const res = await fetch(`${url}/token/${service}`);
  const body = (await res.json()) as { token?: string };
  if (res.status !== 200 || body.token === undefined) throw new Error(`GET /token: ${res.status}`);
  return body.token;
}

async function giveBackDirectly(url: string, token: string, service = 'echo'): Promise<void> {
  const job = encodeURIComponent(JSON.stringify({ service, commands: [], token }));
  const res = await fetch(`${url}/job/${service}?job=${job}`, { method: 'PUT' });
  if (res.status !== 200) throw new Error(`give-back: ${res.status}`);
  await res.text();
}

t.test('zero backend requests while idle, with broker connections open', async (t) => {
  const clock = new ManualClock();
  const backendClock = new ManualClock(); // tokens held by the test never lapse
  const a = await startBackend(t, { waitgroups: { w: 1 }, clock: backendClock });
  const b = await startBackend(t, { waitgroups: { w: 1 }, clock: backendClock });
  const gw = await startGateway(t, { backends: [a.url, b.url], waitgroups: { w: 1 }, clock });
  const p1 = await peer(t, gw.url);
  const p2 = await peer(t, gw.url);
  const idle = async (ms: number): Promise<void> => {
    for (let elapsed = 0; elapsed < ms; elapsed += 100) {
      clock.advance(100);
      await turns();
    }
  };

  await idle(5000);
  t.equal(allRequests(a) + allRequests(b), 0, 'nothing in 5 s of idle');

  const done = await p1.run('j1', jobs.echo('one'));
  t.equal(done.receipt.ok, true);
  const afterJob = allRequests(a) + allRequests(b);
  t.equal(afterJob, 2, 'one token request and one PUT for one job');
  await idle(5000);
  t.equal(allRequests(a) + allRequests(b), afterJob, 'nothing in 5 s of idle after work');

  // Wants behind busy backends arm the poll; once they are withdrawn, the poll stops.
  const ta = await holdSlot(a.url);
  const tb = await holdSlot(b.url);
  const beforeWants = tokenRequests(a) + tokenRequests(b);
  p2.want('w1', 'echo');
  p2.want('w2', 'echo');
  await p2.sync();
  await settled(gw);
  t.equal(tokenRequests(a) + tokenRequests(b) - beforeWants, 2, 'the waiting wants asked each backend once (and were told 503)');
  p2.unwant('w1');
  p2.unwant('w2');
  await p2.sync();
  const withdrawn = allRequests(a) + allRequests(b);
  await idle(5000);
  t.equal(allRequests(a) + allRequests(b), withdrawn, 'nothing after the wants were withdrawn');
  await giveBackDirectly(a.url, ta);
  await giveBackDirectly(b.url, tb);
});

t.test('200 parked wants behind two busy backends: one token request per backend per poll interval', async (t) => {
  const clock = new ManualClock();
  const backendClock = new ManualClock();
  const a = await startBackend(t, { waitgroups: { w: 1 }, clock: backendClock });
  const b = await startBackend(t, { waitgroups: { w: 1 }, clock: backendClock });
  const gw = await startGateway(t, { backends: [a.url, b.url], waitgroups: { w: 1 }, clock, gateway: { poll_interval_ms: 100 } });
  const ta = await holdSlot(a.url);
  await holdSlot(b.url);
  const base = { a: tokenRequests(a), b: tokenRequests(b) };

  const p = await peer(t, gw.url);
  for (let i = 0; i < 200; i++) p.want(`j${i}`, 'echo');
  await p.sync();
  await settled(gw);
  t.same({ a: tokenRequests(a) - base.a, b: tokenRequests(b) - base.b }, { a: 1, b: 1 }, 'the first ask: one per backend, not 200');

  const perInterval: { a: number; b: number }[] = [];
  for (let i = 0; i < 10; i++) {
    const before = { a: tokenRequests(a), b: tokenRequests(b) };
    clock.advance(100);
    await settled(gw);
    perInterval.push({ a: tokenRequests(a) - before.a, b: tokenRequests(b) - before.b });
  }
  t.same(perInterval, Array.from({ length: 10 }, () => ({ a: 1, b: 1 })), 'exactly one request per backend per interval');
  const total = tokenRequests(a) - base.a + tokenRequests(b) - base.b;
  t.equal(total, 22, `22 requests in 11 rounds for 200 wants (the old clients would have sent ${200 * 2 * 11})`);
  t.equal(a.counters.requests.token[503], 11);

  // A slot freed behind the gateway's back is found by the next poll.
  await giveBackDirectly(a.url, ta);
  clock.advance(100);
  const offer = await p.next('OFFER', 'j0');
  t.ok(offer.token);
});

t.test('when a slot frees through a relayed job, the next OFFER follows at once (no waiting for the poll)', async (t) => {
  const clock = new ManualClock();
  const backendClock = new ManualClock();
  const a = await startBackend(t, { waitgroups: { w: 2 }, clock: backendClock });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 2 }, clock, gateway: { poll_interval_ms: 100 } });
  await holdSlot(a.url); // one slot taken by an old fylr straight at the backend
  const p = await peer(t, gw.url);
  await p.acquire('long', jobs.sleep(0.3));
  await eventually(() => a.counters.running.w === 1, { what: 'the relayed job to run' });

  p.want('next', 'echo');
  await p.sync();
  await settled(gw);
  const asked = tokenRequests(a);
  t.equal(a.counters.requests.token[503], 1, 'the backend said busy: the gateway pauses for the poll interval');

  // The injected clock never moves: the pause never ends on its own. Only the relayed job's end
  // can wake the pump.
  const done = await p.next('DONE', 'long');
  t.equal(done.receipt.ok, true);
  const offer = await p.next('OFFER', 'next');
  t.equal(tokenRequests(a), asked + 1, 'asked again at once, exactly once');
  p.job('next', offer.token, jobs.echo('at once'));
  t.equal((await p.next('DONE', 'next')).receipt.ok, true);
});

t.test('a backend whose slots the gateway holds is not asked at all', async (t) => {
  const clock = new ManualClock();
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 }, clock });
  const p = await peer(t, gw.url);
  await p.acquire('long', jobs.sleep(0.2));
  for (let i = 0; i < 50; i++) p.want(`j${i}`, 'echo');
  await p.sync();
  for (let i = 0; i < 10; i++) {
    clock.advance(100);
    await turns();
  }
  t.equal(tokenRequests(a), 1, 'only the request for the running job');
  await p.next('DONE', 'long');
  await p.next('OFFER', 'j0');
  t.equal(tokenRequests(a), 2);
});

t.test('priority across two broker connections through the gateway', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const low = await peer(t, gw.url);
  const high = await peer(t, gw.url);
  await low.acquire('running', jobs.sleep(0.2));
  low.want('l1', 'echo', 0);
  low.want('l2', 'echo', 0);
  await low.sync();
  high.want('h1', 'sleep', 10); // another service, higher priority, parked later
  await high.sync();

  await low.next('DONE', 'running');
  const oh = await high.next('OFFER', 'h1');
  t.equal(low.all('OFFER').length, 1, 'the low-priority wants got nothing yet');
  high.job('h1', oh.token, jobs.sleep(0));
  await high.next('DONE', 'h1');
  const ol1 = await low.next('OFFER', 'l1');
  low.job('l1', ol1.token, jobs.echo('l1'));
  await low.next('DONE', 'l1');
  const ol2 = await low.next('OFFER', 'l2');
  low.job('l2', ol2.token, jobs.echo('l2'));
  await low.next('DONE', 'l2');
  t.same(a.counters.jobs, { sleep: 2, echo: 2 });
  t.same(a.counters.emptyJobs, {}, 'every token went to the want it was asked for');
});
