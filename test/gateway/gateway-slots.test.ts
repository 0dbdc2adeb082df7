/**
 * The gateway's slots are legacy tokens held from real old execservers: HELLO's processes, jobs
 * relayed as PUT /job (plain and body mode), CANCEL, and the token-passing rules (DECLINE and an
 * expired offer pass the token on; a token nobody wants is given back at once).
 */
import t from 'tap';
import { ManualClock } from '../../src/clock.js';
import type { GatewaySlotSource, GatewaySourceStatus } from '../../src/gateway/gateway-slot-source.js';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { startPipeServer } from '../helpers/pipe-server.js';
import { eventually } from '../helpers/wait.js';
import { startBackend, startGateway, tokenRequests, turns, type RunningGateway, type Teardown } from './gateway-world.js';

async function peer(t: Teardown, url: string): Promise<BrokerPeer> {
  const p = await BrokerPeer.connect(url);
  t.teardown(() => p.close());
  return p;
}

function gatewayStatus(gw: RunningGateway): GatewaySourceStatus {
  return (gw.server.source as GatewaySlotSource).status();
}

t.test('HELLO announces the services and the sum of the backends\' slots; a backend entry may replace the waitgroups', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const b = await startBackend(t, { waitgroups: { w: 2 } });
  const gw = await startGateway(t, {
    waitgroups: { w: 2, x: 3 },
    services: { echo: { waitgroup: 'w' }, xs: { waitgroup: 'x' } },
    backends: [{ url: a.url, waitgroups: { w: 1 } }, b.url],
  });
  const p = await peer(t, gw.url);
  t.same(p.hello.services, { echo: 'w', xs: 'x' });
  // a: only w (its own list replaces the top level); b: the top level.
  t.same(p.hello.waitgroups, { w: { processes: 3, running: 0, parked: 0 }, x: { processes: 3, running: 0, parked: 0 } });
  const status = (await (await fetch(`${gw.url}/status`)).json()) as { kind: string; gateway: GatewaySourceStatus };
  t.equal(status.kind, 'gateway');
  t.same(status.gateway.backends.map((s) => s.processes), [{ w: 1 }, { w: 2, x: 3 }]);
  t.equal(tokenRequests(a) + tokenRequests(b), 0, 'connecting asks no backend for anything');
});

t.test('a JOB is relayed as PUT /job to the backend that issued the token', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const p = await peer(t, gw.url);

  const done = await p.run('j1', jobs.echo('hello', 'old', 'world'));
  t.equal(done.receipt.ok, true);
  t.equal(done.receipt.stdout_prefix, 'hello old world\n');
  t.same(done.receipt.commands.map((c) => c.prog), ['echo'], 'the backend\'s own receipt');
  t.same(a.counters.jobs, { echo: 1 });
  t.equal(a.counters.tokensIssued, 1);

  const empty = await p.run('j2', jobs.empty('echo'));
  t.equal(empty.receipt.ok, true, 'a job with no commands succeeds on a gateway too');
  t.equal(a.counters.emptyJobs.echo, 1);

  const bad = await p.run('j3', { service: 'echo', commands: [{ prog: 'nope', args: [] }] });
  t.equal(bad.receipt.ok, false);
  t.equal(bad.receipt.error?.code, 'command_not_allowed', 'the backend\'s verdict reaches the fylr');
});

t.test('body mode: stdin from the in-pipe into the PUT body, the answer into the out-pipe; the 4000-byte rule', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 2 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 2 } });
  const pipes = await startPipeServer();
  t.teardown(() => pipes.close());
  const p = await peer(t, gw.url);

  t.test('a stream of 1 MiB arrives whole', async (t) => {
    const src = pipes.source(1 << 20);
    const sink = pipes.sink();
    const done = await p.run('cat1', jobs.cat({ in: src.url, out: sink.url }));
    t.equal(done.receipt.ok, true, JSON.stringify(done.receipt.error));
    const [sent, got] = await Promise.all([src.served, sink.received]);
    t.equal(got.bytes, 1 << 20);
    t.equal(got.sha256, sent.sha256);
    t.equal(got.complete, true);
    t.equal(done.receipt.output_bytes, 1 << 20);
    // 4000 random bytes, decoded as UTF-8 (invalid sequences become U+FFFD).
    t.ok(done.receipt.stdout_prefix.length > 0 && done.receipt.stdout_prefix.length <= 4000);
  });

  t.test('a small output of a successful job is committed at the end', async (t) => {
    const src = pipes.source(10);
    const sink = pipes.sink();
    const done = await p.run('cat2', jobs.cat({ in: src.url, out: sink.url }));
    t.equal(done.receipt.ok, true);
    const got = await sink.received;
    t.equal(got.bytes, 10);
    t.equal(got.complete, true);
  });

  t.test('a failure with at most 4000 bytes never touches the out-pipe: the output is in the receipt', async (t) => {
    const sink = pipes.sink();
    const done = await p.run('f1', jobs.fail(100, { out: sink.url }));
    t.equal(done.receipt.ok, false);
    t.equal(done.receipt.error?.code, 'command_failed');
    t.equal(done.receipt.exit_code, 3);
    t.equal(done.receipt.stdout_prefix, 'x'.repeat(100));
    t.equal(sink.started, false, 'no PUT to the out-pipe');
  });

  t.test('a failure after the commit aborts the out-pipe mid-stream, then DONE carries the error', async (t) => {
    const sink = pipes.sink();
    const done = await p.run('f2', jobs.fail(100_000, { out: sink.url }));
    t.equal(done.receipt.ok, false);
    // The old execserver only breaks its answer off; it still answers /healthz, so the job failed.
    t.equal(done.receipt.error?.code, 'command_failed');
    t.equal(Buffer.byteLength(done.receipt.stdout_prefix), 4000);
    const got = await sink.received;
    t.equal(got.complete, false, 'the out-pipe saw an incomplete body, not a clean end');
  });

  t.test('an in-pipe that fails is pipe_in_failed and the token goes back', async (t) => {
    const src = pipes.source(10, { status: 404 });
    const before = a.counters.emptyJobs.cat ?? 0;
    const done = await p.run('cat3', jobs.cat({ in: src.url, out: pipes.sink().url }));
    t.equal(done.receipt.ok, false);
    t.equal(done.receipt.error?.code, 'pipe_in_failed');
    await eventually(() => (a.counters.emptyJobs.cat ?? 0) === before + 1, { what: 'the unused token given back' });
  });
});

t.test('CANCEL aborts the backend request; the old execserver stops the job', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const p = await peer(t, gw.url);
  await p.acquire('s1', jobs.sleep(30));
  await eventually(() => a.counters.running.w === 1, { what: 'the job running at the backend' });
  p.cancel('s1');
  const done = await p.next('DONE', 's1');
  t.equal(done.receipt.ok, false);
  t.equal(done.receipt.stopped, true);
  t.equal(done.receipt.error?.code, 'stopped');
  await eventually(() => a.counters.running.w === 0, { what: 'the backend to stop the job' });
  // The slot is usable again at once.
  const next = await p.run('e1', jobs.echo('after'));
  t.equal(next.receipt.ok, true);
});

t.test('a DECLINEd offer passes the still-valid token to the next want of its service', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const p = await peer(t, gw.url);
  p.want('j1', 'echo');
  const o1 = await p.next('OFFER', 'j1');
  p.want('j2', 'echo');
  await p.sync();
  p.decline('j1', o1.token);
  const o2 = await p.next('OFFER', 'j2');
  p.job('j2', o2.token, jobs.echo('second'));
  const done = await p.next('DONE', 'j2');
  t.equal(done.receipt.ok, true);
  t.equal(a.counters.tokensIssued, 1, 'one token, used by the second want');
  t.equal(tokenRequests(a), 1, `no request for the second want: the token was passed on ${JSON.stringify(a.counters.requests)}`);
  t.same(a.counters.emptyJobs, {}, 'nothing was given back');
});

t.test('a token nobody wants any more is given back at once (redeemed with a job without commands)', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const p = await peer(t, gw.url);
  p.want('j1', 'echo');
  await p.next('OFFER', 'j1');
  t.equal(a.counters.tokensIssued, 1);
  p.unwant('j1');
  await eventually(() => a.counters.emptyJobs.echo === 1, { what: 'the give-back PUT', timeoutMs: 2000 });
  t.equal(a.counters.tokensExpired, 0, 'not left to lapse');
  // The backend counts the give-back before its answer reaches the gateway: wait for that answer.
  await eventually(() => gatewayStatus(gw).tokens.returning === 0, { what: 'the give-back answered', timeoutMs: 2000 });
  t.same(gatewayStatus(gw).tokens, { free: 0, offered: 0, running: 0, returning: 0 });
  // The backend's slot is free at once: an old fylr asking it directly gets a token.
  const res = await fetch(`${a.url}/token/echo`);
  t.equal(res.status, 200);
  await res.text();
});

t.test('a connection that closes with an offer gives the token back when no other want of its service waits', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const p = await BrokerPeer.connect(gw.url);
  p.want('j1', 'echo');
  await p.next('OFFER', 'j1');
  await p.close();
  await eventually(() => a.counters.emptyJobs.echo === 1, { what: 'the give-back PUT', timeoutMs: 2000 });
});

t.test('an expired offer passes the token on while it has life left for another offer; then it is given back', async (t) => {
  const clock = new ManualClock();
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 }, clock, broker: { offer_timeout_ms: 2000 } });
  const p = await peer(t, gw.url);
  for (let i = 1; i <= 5; i++) p.want(`j${i}`, 'echo');
  await p.next('OFFER', 'j1');
  // Token age when re-offered: 2000, 4000, 6000 ms (+2000 offer +500 margin <= 10000); at 8000 it
  // would outlive the legacy token's 10 s: given back, and a fresh one fetched.
  for (let i = 1; i <= 3; i++) {
    clock.advance(2000);
    await p.error('offer_expired', `j${i}`);
    await p.next('OFFER', `j${i + 1}`);
    t.equal(a.counters.tokensIssued, 1, `offer ${i + 1} reuses the first token`);
  }
  clock.advance(2000);
  await p.error('offer_expired', 'j4');
  const o5 = await p.next('OFFER', 'j5');
  t.equal(a.counters.emptyJobs.echo, 1, 'the old token was given back');
  t.equal(a.counters.tokensIssued, 2, 'j5 got a fresh token');
  p.job('j5', o5.token, jobs.echo('five'));
  t.equal((await p.next('DONE', 'j5')).receipt.ok, true);
  await turns();
});

t.test('a DECLINE with no other want of that service gives the token back, and the next head gets its own', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const p = await peer(t, gw.url);
  p.want('e1', 'echo');
  const o = await p.next('OFFER', 'e1');
  p.want('s1', 'sleep');
  await p.sync();
  p.decline('e1', o.token);
  // The echo token is of no use to a sleep want: back it goes, and a sleep token follows.
  const os = await p.next('OFFER', 's1');
  t.equal(a.counters.emptyJobs.echo, 1);
  p.job('s1', os.token, jobs.sleep(0));
  t.equal((await p.next('DONE', 's1')).receipt.ok, true);
  t.same(a.counters.jobs, { echo: 1, sleep: 1 });
});
