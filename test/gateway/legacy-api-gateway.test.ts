/**
 * The legacy API on a gateway (PROTOCOL.md §5 "Served by the new side too"): old fylrs pointed at
 * the gateway get sealed tokens that name their backend, PUTs are proxied (streamed) to it, the
 * 503 gate holds while broker wants are parked, and nothing but the configured backends (and the
 * replicas their own answers name) is ever addressed.
 */
import { createHash, randomBytes } from 'node:crypto';
import t from 'tap';
import { request } from 'undici';
import { acquireAndRun } from '../../legacy/fylr/polling-client.js';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { systemClock } from '../../src/clock.js';
import type { GatewaySlotSource } from '../../src/gateway/gateway-slot-source.js';
import { GatewayTokens } from '../../src/gateway/gateway-token.js';
import type { JobSpec } from '../../src/protocol/job.js';
import { startBalancer } from '../helpers/balancer.js';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { eventually } from '../helpers/wait.js';
import { startFakeBackend } from './fake-backend.js';
import { allRequests, SECRET, startBackend, startGateway, type Teardown, tokenRequests } from './gateway-world.js';

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: () => any;
}

async function call(method: 'GET' | 'PUT', url: string, opts: { body?: Buffer | string; headers?: Record<string, string> } = {}): Promise<Answer> {
  const res = await request(url, { method, body: opts.body ?? null, headers: opts.headers ?? {} });
  const text = await res.body.text();
  return { status: res.statusCode, headers: res.headers, text, json: () => JSON.parse(text) };
}

const jobUrl = (base: string, job: JobSpec & { token?: string }): string =>
  `${base}/job/${job.service}?job=${encodeURIComponent(JSON.stringify(job))}`;

async function peer(t: Teardown, url: string): Promise<BrokerPeer> {
  const p = await BrokerPeer.connect(url);
  t.teardown(() => p.close());
  return p;
}

t.test('an old fylr gets a sealed token from the gateway and its PUT runs on the backend that issued it', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const tok = await call('GET', `${gw.url}/token/echo`);
  t.equal(tok.status, 200);
  const token = tok.json().token as string;
  t.match(token, /^gw1\./);
  t.same(new GatewayTokens(SECRET).open(token)?.backend, a.url, 'the token names its backend');
  t.equal(tok.json().service, undefined, 'no service URL when the backend named none');

  const put = await call('PUT', jobUrl(gw.url, { ...jobs.echo('via', 'gateway'), token }));
  t.equal(put.status, 200);
  t.equal(put.json().ok, true);
  t.equal(put.json().stdout_prefix, 'via gateway\n');
  t.same(a.counters.jobs, { echo: 1 });

  const again = await call('PUT', jobUrl(gw.url, { ...jobs.echo('twice'), token }));
  t.equal(again.status, 400, 'a used token is refused by the backend, as before');
  t.same(again.json(), { Error: 'Token not found', Status: 400 });
});

t.test('unknown services, /healthz and other paths', async (t) => {
  const a = await startBackend(t);
  const gw = await startGateway(t, { backends: [a.url] });
  const tok = await call('GET', `${gw.url}/token/nope`);
  t.equal(tok.status, 404);
  t.same(tok.json(), { Error: 'Unknown service "nope"', Status: 404 });
  const put = await call('PUT', jobUrl(gw.url, { service: 'nope', commands: [] }));
  t.equal(put.status, 404);
  t.same(put.json(), { Error: 'Unknown service "nope"', Status: 404 });
  t.equal((await call('GET', `${gw.url}/healthz`)).status, 200);
  const missing = await call('PUT', `${gw.url}/job/echo`);
  t.equal(missing.status, 400);
  t.equal(allRequests(a), 0, 'none of this reached the backend');
  // A probe of /job/{service} is answered as the old execserver answers it.
  const probe = await call('GET', `${gw.url}/job/echo`);
  const direct = await call('GET', `${a.url}/job/echo`);
  t.equal(probe.status, direct.status);
  t.same(probe.json(), direct.json());
  t.equal(a.counters.requests.other[404], 2, 'the probe was passed through');
  t.equal((await call('GET', `${gw.url}/job/nope`)).status, 404);
});

t.test('GET /token answers 503 with Retry-After: 1 while broker wants of the waitgroup are parked', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 } });
  const p = await peer(t, gw.url);
  await p.acquire('running', jobs.sleep(0.3));
  p.want('parked', 'echo');
  await p.sync();
  const asked = tokenRequests(a);
  for (const service of ['echo', 'sleep']) {
    const r = await call('GET', `${gw.url}/token/${service}`);
    t.equal(r.status, 503, service);
    t.equal(r.headers['retry-after'], '1');
    t.same(r.json(), { Error: 'All workers busy', Status: 503 });
  }
  t.equal(tokenRequests(a), asked, 'the gate answers without asking the backend');

  // The parked want gets the slot when the running job ends; then old fylrs are served again.
  await p.next('DONE', 'running');
  const offer = await p.next('OFFER', 'parked');
  p.job('parked', offer.token, jobs.echo('mine'));
  await p.next('DONE', 'parked');
  const free = await call('GET', `${gw.url}/token/echo`);
  t.equal(free.status, 200);
});

t.test('GET /token tries every backend offering the service; 503 only when all are busy', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const b = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url, b.url], waitgroups: { w: 1 } });
  await call('GET', `${a.url}/token/echo`); // a is busy (an old fylr straight at it)
  const tokens = new GatewayTokens(SECRET);
  for (let i = 0; i < 2; i++) {
    // Whichever backend comes first in turn, the token is b's.
    const r = await call('GET', `${gw.url}/token/echo`);
    t.equal(r.status, 200);
    const token = r.json().token as string;
    t.equal(tokens.open(token)?.backend, b.url);
    const put = await call('PUT', jobUrl(gw.url, { service: 'echo', commands: [], token }));
    t.equal(put.status, 200);
  }
  await call('GET', `${b.url}/token/echo`); // now b is busy too
  const busy = await call('GET', `${gw.url}/token/echo`);
  t.equal(busy.status, 503);
  t.equal(busy.headers['retry-after'], '1');
  t.ok(tokenRequests(a) >= 2 && tokenRequests(b) >= 3, 'both were asked');
});

t.test('a forged or tampered token gets 400 Token not found and no backend is contacted', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 2 } });
  const gw = await startGateway(t, { backends: [a.url] });
  const good = (await call('GET', `${gw.url}/token/echo`)).json().token as string;
  const raw = (await call('GET', `${a.url}/token/echo`)).json().token as string;
  const seen = allRequests(a);
  const [prefix, payload, mac] = good.split('.') as [string, string, string];
  const evil = Buffer.from(JSON.stringify({ b: 'http://169.254.169.254', s: 'echo', t: 'x' })).toString('base64url');
  const forged = {
    'a raw backend token (valid at the backend)': raw,
    'sealed with another secret': new GatewayTokens('guess').seal({ backend: a.url, service: 'echo', token: raw }),
    'sealed naming an unconfigured backend': new GatewayTokens(SECRET).seal({ backend: 'http://169.254.169.254', service: 'echo', token: raw }),
    'sealed naming a refused replica': new GatewayTokens(SECRET).seal({ backend: a.url, service: 'echo', token: raw, target: 'http://evil.example:80' }),
    'payload replaced': `${prefix}.${evil}.${mac}`,
    'mac cut': `${prefix}.${payload}.${mac.slice(0, 10)}`,
    'of another service': good,
  };
  for (const [what, token] of Object.entries(forged)) {
    const service = what === 'of another service' ? 'sleep' : 'echo';
    const r = await call('PUT', jobUrl(gw.url, { service, commands: [], token }));
    t.equal(r.status, 400, what);
    t.same(r.json(), { Error: 'Token not found', Status: 400 }, what);
  }
  const noToken = await call('PUT', jobUrl(gw.url, { service: 'echo', commands: [] }));
  t.equal(noToken.status, 400);
  t.equal(allRequests(a), seen, 'the backend heard of none of them');
  // The genuine token still works, whatever Host or forwarding headers the client sends.
  const ok = await call('PUT', jobUrl(gw.url, { ...jobs.echo('ok'), token: good }), { headers: { host: '169.254.169.254', 'x-forwarded-host': 'evil.example' } });
  t.equal(ok.status, 200);
  t.equal(ok.json().stdout_prefix, 'ok\n');
});

t.test('a service URL in the backend\'s answer becomes the gateway\'s advertised URL', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 2 }, tokenResponseSendServerIP: true });
  const advertised = await startGateway(t, { backends: [a.url], gateway: { advertised_url: 'http://exec-gw.example:8083' } });
  const r = await call('GET', `${advertised.url}/token/echo`);
  t.equal(r.json().service, 'http://exec-gw.example:8083');
  const plain = await startGateway(t, { backends: [a.url] });
  const r2 = await call('GET', `${plain.url}/token/echo`);
  t.equal(r2.json().service, undefined, 'left out without an advertised URL: the old fylr PUTs to the address it asked');
  const put = await call('PUT', jobUrl(plain.url, { service: 'echo', commands: [], token: r2.json().token }));
  t.equal(put.status, 200);
});

t.test('a backend that is a balancer in front of old replicas: the replica its answer names is where the token goes', async (t) => {
  const r1 = await startBackend(t, { waitgroups: { w: 4 }, tokenResponseSendServerIP: true });
  const r2 = await startBackend(t, { waitgroups: { w: 4 }, tokenResponseSendServerIP: true });
  const lb = await startBalancer([r1.url, r2.url]);
  t.teardown(() => lb.close());
  const gw = await startGateway(t, { backends: [lb.url], waitgroups: { w: 8 } });
  const p = await peer(t, gw.url);
  // Broker jobs and old fylrs' jobs alike: each PUT must reach the replica that issued its token.
  for (let i = 0; i < 10; i++) {
    const done = await p.run(`b${i}`, jobs.echo(`b${i}`));
    t.equal(done.receipt.ok, true, `broker job ${i}: ${JSON.stringify(done.receipt.error)}`);
    const tok = (await call('GET', `${gw.url}/token/echo`)).json().token as string;
    const put = await call('PUT', jobUrl(gw.url, { ...jobs.echo(`l${i}`), token: tok }));
    t.equal(put.status, 200, `legacy job ${i}`);
  }
  t.ok((r1.counters.jobs.echo ?? 0) > 0 && (r2.counters.jobs.echo ?? 0) > 0, 'both replicas ran jobs');
  t.equal((r1.counters.requests.job[400] ?? 0) + (r2.counters.requests.job[400] ?? 0), 0, 'no Token not found');
  const status = (gw.server.source as GatewaySlotSource).status();
  t.equal(status.backends[0]?.replicas.length, 2, 'both replicas are listed under the balancer\'s entry');
});

t.test('a service URL the gateway must not address: the token is not used, nothing is sent there', async (t) => {
  const fake = await startFakeBackend(() => ({ status: 200, body: { token: 'T', service: 'http://169.254.169.254:80' } }));
  t.teardown(() => fake.close());
  const gw = await startGateway(t, { backends: [fake.url], waitgroups: { w: 1 }, gateway: { poll_interval_ms: 50 } });
  const r = await call('GET', `${gw.url}/token/echo`);
  t.equal(r.status, 503, 'the old fylr is told busy');
  const p = await peer(t, gw.url);
  p.want('j', 'echo');
  await eventually(() => fake.requests.length >= 3, { what: 'the pump to ask again after its pause' });
  p.unwant('j');
  t.equal(p.all('OFFER').length, 0, 'no offer from an unusable token');
  t.ok(fake.requests.every((q) => q.method === 'GET' && q.url === '/token/echo'), 'only token requests, never a PUT');
  const status = (gw.server.source as GatewaySlotSource).status();
  t.match(status.backends[0]?.last_error, /169\.254\.169\.254/);
  t.ok((status.backends[0]?.token_requests.refused_service_url ?? 0) >= 1);
});

t.test('body mode through the proxy: the PUT body streams to the backend and stdout streams back', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 2 } });
  const gw = await startGateway(t, { backends: [a.url] });
  const input = randomBytes(3 << 20);
  const counters = new LegacyCounters();
  const { Readable, PassThrough } = await import('node:stream');
  const out = new PassThrough();
  const hash = createHash('sha256');
  let bytes = 0;
  out.on('data', (c: Buffer) => {
    bytes += c.length;
    hash.update(c);
  });
  const result = await acquireAndRun(jobs.cat({}), {
    addresses: [gw.url],
    connectTimeoutSec: 10,
    clock: systemClock,
    counters,
    stdin: Readable.from([input]),
    stdout: out,
  });
  t.equal(result.kind, 'done', JSON.stringify(result));
  t.equal(bytes, input.length);
  t.equal(hash.digest('hex'), createHash('sha256').update(input).digest('hex'));

  // A failure after the backend's commit breaks the old fylr's answer off too: no clean end.
  const failing = await acquireAndRun(jobs.fail(100_000), { addresses: [gw.url], connectTimeoutSec: 10, clock: systemClock, counters, stdout: new PassThrough().resume() });
  t.equal(failing.kind, 'failed');
  if (failing.kind === 'failed') t.equal(failing.error.code, 'pipe_out_failed');
});

t.test('a legacy job relayed through the gateway wakes the slot pump for its backend', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url], waitgroups: { w: 1 }, gateway: { poll_interval_ms: 60_000 } });
  const tok = (await call('GET', `${gw.url}/token/sleep`)).json().token as string;
  const put = call('PUT', jobUrl(gw.url, { ...jobs.sleep(0.3), token: tok }));
  await eventually(() => a.counters.running.w === 1, { what: 'the legacy job to run' });
  const p = await peer(t, gw.url);
  p.want('next', 'echo');
  await eventually(() => (a.counters.requests.token[503] ?? 0) === 1, { what: 'the pump to hear busy' });
  // The poll is a minute away; the old fylr's job ending through the gateway is what wakes it.
  t.equal((await put).status, 200);
  const offer = await p.next('OFFER', 'next', 5000);
  t.ok(offer.token);
});
