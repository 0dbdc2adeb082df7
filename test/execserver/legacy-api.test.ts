/**
 * The legacy HTTP API of PROTOCOL.md §5 on the native execserver, one test per row, plus what
 * "served by the new side too" adds: tokens and broker offers share the same slots, the 503 gate
 * (also in the contract), a hang-up, a drain. Real sockets, real processes.
 */
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import t, { type Test } from 'tap';
import { request } from 'undici';
import { ManualClock } from '../../src/clock.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { JobSpec, Receipt } from '../../src/protocol/job.js';
import { jobs } from '../helpers/broker-peer.js';
import { eventually, within } from '../helpers/wait.js';
import { serveNative, type ServedNative } from '../helpers/serve-native.js';
import { CONTRACT_COMMANDS, CONTRACT_SERVICES } from './broker-contract.js';

const WG = 'main';

async function serve(t: Test, opts: { processes?: number; clock?: ManualClock; sendServerIp?: boolean } = {}): Promise<ServedNative> {
  const config = parseServeConfig({
    listen: '127.0.0.1:0',
    name: 'legacy-test',
    waitgroups: { [WG]: opts.processes ?? 1 },
    commands: CONTRACT_COMMANDS,
    services: CONTRACT_SERVICES,
    tokenResponseSendServerIP: opts.sendServerIp ?? false,
  });
  return serveNative(t, config, opts.clock);
}

async function getToken(url: string, service: string): Promise<{ status: number; body: Record<string, unknown>; retryAfter: string | null }> {
  const res = await fetch(`${url}/token/${service}`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown>, retryAfter: res.headers.get('retry-after') };
}

function jobUrl(url: string, service: string, job: JobSpec & { token?: string }): string {
  return `${url}/job/${service}?job=${encodeURIComponent(JSON.stringify(job))}`;
}

async function putJob(url: string, service: string, job: JobSpec & { token?: string }, body?: Readable | string): Promise<{ status: number; json: unknown; text: string }> {
  const res = await request(jobUrl(url, service, job), { method: 'PUT', ...(body !== undefined ? { body } : {}) });
  const text = await res.body.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.statusCode, json, text };
}

t.test('§5 GET /token/{service}: 200 {"token": T} reserves one slot, single use', async (t) => {
  const s = await serve(t, { processes: 1 });
  const tok = await getToken(s.url, 'echo');
  t.equal(tok.status, 200);
  t.same(Object.keys(tok.body), ['token'], 'just the token');
  const token = tok.body.token as string;
  t.match(token, /^[A-Za-z0-9_-]{22}$/, '128 random bits, base64url');
  t.equal(s.server.broker.status().waitgroups[WG]!.in_use, 1, 'the slot is reserved');
  const p = await s.peer();
  await p.park('w1', 'echo');
  t.equal(p.all('OFFER').length, 0, 'a broker want cannot take the reserved slot');
  const put = await putJob(s.url, 'echo', { ...jobs.echo('legacy'), token });
  t.equal(put.status, 200);
  t.equal((put.json as Receipt).stdout_prefix, 'legacy\n');
  await within(p.next('OFFER', 'w1'), 3000, 'the slot to go to the parked want after the job');
  const again = await putJob(s.url, 'echo', { ...jobs.echo('twice'), token });
  t.equal(again.status, 400, 'a used token is gone');
  t.same(again.json, { Error: 'Token not found', Status: 400 });
});

t.test('§5 a token lives 10 s: unredeemed, it lapses, its slot goes to a parked want, and the PUT gets Token not found', async (t) => {
  const clock = new ManualClock(0);
  const s = await serve(t, { processes: 1, clock });
  const token = (await getToken(s.url, 'echo')).body.token as string;
  const p = await s.peer();
  await p.park('w1', 'echo');
  clock.advance(9_999);
  await p.sync();
  t.equal(p.all('OFFER').length, 0, 'still reserved at 9999 ms');
  clock.advance(1);
  await within(p.next('OFFER', 'w1'), 3000, 'the lapsed slot offered');
  const put = await putJob(s.url, 'echo', { ...jobs.echo('late'), token });
  t.equal(put.status, 400);
  t.same(put.json, { Error: 'Token not found', Status: 400 });
});

t.test('§5 with tokenResponseSendServerIP the token body also has "service": "http://<own ip>:<port>", where the PUT goes', async (t) => {
  const s = await serve(t, { sendServerIp: true });
  const tok = await getToken(s.url, 'echo');
  t.equal(tok.status, 200);
  t.equal(tok.body.service, s.url, 'the address the request came in on');
  const put = await putJob(tok.body.service as string, 'echo', { ...jobs.echo('via ip'), token: tok.body.token as string });
  t.equal(put.status, 200);
});

t.test('§5 503 {"Error": "All workers busy", "Status": 503} with Retry-After: 1 when no slot is free', async (t) => {
  const s = await serve(t, { processes: 1 });
  t.equal((await getToken(s.url, 'echo')).status, 200);
  const busy = await getToken(s.url, 'sleep');
  t.equal(busy.status, 503, 'the one slot of the waitgroup is reserved');
  t.same(busy.body, { Error: 'All workers busy', Status: 503 });
  t.equal(busy.retryAfter, '1');
});

t.test('§5 404 {"Error": "Unknown service \\"x\\"", "Status": 404} for a service not configured', async (t) => {
  const s = await serve(t);
  const tok = await getToken(s.url, 'x');
  t.equal(tok.status, 404);
  t.same(tok.body, { Error: 'Unknown service "x"', Status: 404 });
  const put = await putJob(s.url, 'x', { ...jobs.echo(), service: 'x', token: 'whatever' });
  t.equal(put.status, 404);
  t.same(put.json, { Error: 'Unknown service "x"', Status: 404 });
  t.equal((await getToken(s.url, '__proto__')).status, 404, 'names of Object.prototype are no services');
});

t.test('§5 PUT /job (not body mode): 200 with the receipt JSON, ok or not', async (t) => {
  const s = await serve(t);
  const ok = await putJob(s.url, 'echo', { ...jobs.echo('a', 'b'), token: (await getToken(s.url, 'echo')).body.token as string });
  t.equal(ok.status, 200);
  const r = ok.json as Receipt;
  t.equal(r.ok, true);
  t.equal(r.stdout_prefix, 'a b\n');
  t.same(r.commands.map((c) => [c.prog, c.exit_code]), [['echo', 0]]);
  const failing: JobSpec = { service: 'fail', commands: [{ prog: 'fail', args: [{ type: 'value', value: '10' }] }] };
  const bad = await putJob(s.url, 'fail', { ...failing, token: (await getToken(s.url, 'fail')).body.token as string });
  t.equal(bad.status, 200, 'not body mode: 200 even for a failure');
  t.equal((bad.json as Receipt).ok, false);
  t.equal((bad.json as Receipt).exit_code, 3);
  const noService = { commands: jobs.echo('path').commands, token: (await getToken(s.url, 'echo')).body.token as string } as unknown as JobSpec;
  const fromPath = await putJob(s.url, 'echo', noService);
  t.equal(fromPath.status, 200, 'a job without service takes the one of the path');
  t.equal((fromPath.json as Receipt).stdout_prefix, 'path\n');
  const long = { ...jobs.echo('x'.repeat(30_000)), token: (await getToken(s.url, 'echo')).body.token as string };
  const big = await putJob(s.url, 'echo', long);
  t.equal(big.status, 200, 'a job of 30 kB in the query string is taken (old execservers took 1 MiB heads)');
});

t.test('§5 PUT /job in body mode: the request body is stdin, the response body is stdout', async (t) => {
  const s = await serve(t);
  const token = (await getToken(s.url, 'cat')).body.token as string;
  const size = 5 * 1024 * 1024 + 3;
  const inHash = createHash('sha256');
  let sent = 0;
  const body = new Readable({
    read() {
      if (sent >= size) return void this.push(null);
      const chunk = Buffer.alloc(Math.min(65536, size - sent), sent % 251);
      sent += chunk.length;
      inHash.update(chunk);
      this.push(chunk);
    },
  });
  const job = { ...jobs.cat({}), token };
  delete job.pipes;
  const res = await request(jobUrl(s.url, 'cat', job), { method: 'PUT', body });
  t.equal(res.statusCode, 200);
  const outHash = createHash('sha256');
  let got = 0;
  for await (const chunk of res.body) {
    got += (chunk as Buffer).length;
    outHash.update(chunk as Buffer);
  }
  t.equal(got, size);
  t.equal(outHash.digest('hex'), inHash.digest('hex'));
});

t.test('§5 body mode: a failure before the commit answers 500 with the receipt JSON', async (t) => {
  const s = await serve(t);
  const token = (await getToken(s.url, 'fail')).body.token as string;
  const put = await putJob(s.url, 'fail', { ...jobs.fail(100), token });
  t.equal(put.status, 500);
  const r = put.json as Receipt;
  t.equal(r.ok, false);
  t.equal(r.exit_code, 3);
  t.equal(r.stdout_prefix, 'x\n'.repeat(50), 'the small output travels in the receipt');
});

t.test('§5 body mode: a failure after the commit cuts the response body off', async (t) => {
  const s = await serve(t);
  const token = (await getToken(s.url, 'fail')).body.token as string;
  const res = await request(jobUrl(s.url, 'fail', { ...jobs.fail(1_000_000), token }), { method: 'PUT' });
  t.equal(res.statusCode, 200, 'committed: the status line went out with the first bytes');
  const read = (async () => {
    let n = 0;
    for await (const chunk of res.body) n += (chunk as Buffer).length;
    return n;
  })();
  await t.rejects(read, 'the body does not end cleanly');
});

t.test('§5 400 Token not found for an unknown or forged token; 400 for a token of another service', async (t) => {
  const s = await serve(t, { processes: 2 });
  const forged = await putJob(s.url, 'echo', { ...jobs.echo(), token: 'AAAAAAAAAAAAAAAAAAAAAA' });
  t.equal(forged.status, 400);
  t.same(forged.json, { Error: 'Token not found', Status: 400 });
  const none = await putJob(s.url, 'echo', jobs.echo());
  t.equal(none.status, 400, 'no token at all');
  const catToken = (await getToken(s.url, 'cat')).body.token as string;
  const other = await putJob(s.url, 'echo', { ...jobs.echo(), token: catToken });
  t.equal(other.status, 400, "a token of another service (same waitgroup) is refused");
  t.same(other.json, { Error: 'Token not found', Status: 400 });
  const mismatch = await putJob(s.url, 'cat', { ...jobs.echo(), token: catToken });
  t.equal(mismatch.status, 400, 'job.service must match the path');
  const right = await putJob(s.url, 'cat', { service: 'cat', commands: [], token: catToken });
  t.equal(right.status, 200, 'the cat token still works for cat: refusals did not spend it');
});

t.test('§5 GET /healthz answers 200', async (t) => {
  const s = await serve(t);
  const res = await fetch(`${s.url}/healthz`);
  t.equal(res.status, 200);
});

t.test('a legacy client that hangs up stops its job; the slot comes back', async (t) => {
  const s = await serve(t, { processes: 1 });
  const token = (await getToken(s.url, 'sleep')).body.token as string;
  const abort = new AbortController();
  const put = request(jobUrl(s.url, 'sleep', { ...jobs.sleep(60), token }), { method: 'PUT', signal: abort.signal });
  await eventually(() => s.source.running(WG) === 1, { what: 'the job to run' });
  abort.abort();
  await t.rejects(put);
  await eventually(() => s.source.inUse(WG) === 0, { what: 'the slot to come back', timeoutMs: 5000 });
  t.equal((await getToken(s.url, 'echo')).status, 200, 'a new token can be had');
});

t.test('a legacy token and a broker offer never share a slot: 200 mixed acquisitions against 3 slots', async (t) => {
  const s = await serve(t, { processes: 3 });
  const job = jobs.sleep('0.01');
  const t0 = Date.now();
  const legacyTimes: number[] = [];
  let legacy503 = 0;
  const legacyClient = async (n: number): Promise<number> => {
    let ok = 0;
    for (let i = 0; i < n; i++) {
      let tok = await getToken(s.url, 'sleep');
      while (tok.status === 503) {
        legacy503++;
        await new Promise((r) => setTimeout(r, 2)); // the client's retry pace (old fylrs: 1 s)
        tok = await getToken(s.url, 'sleep');
      }
      legacyTimes.push(Date.now());
      const put = await putJob(s.url, 'sleep', { ...job, token: tok.body.token as string });
      if (put.status === 200 && (put.json as Receipt).ok) ok++;
    }
    return ok;
  };
  const brokerClient = async (n: number, name: string): Promise<{ ok: number; endedAt: number }> => {
    const p = await s.peer();
    let ok = 0;
    for (let i = 0; i < n; i++) {
      const done = await p.run(`${name}-${i}`, job);
      if (done.receipt.ok) ok++;
    }
    return { ok, endedAt: Date.now() };
  };
  const [b1, b2, ...legacy] = await Promise.all([brokerClient(50, 'b1'), brokerClient(50, 'b2'), legacyClient(25), legacyClient(25), legacyClient(25), legacyClient(25)]);
  t.equal(b1!.ok + b2!.ok, 100, '100 broker jobs ran');
  t.equal((legacy as number[]).reduce((a, b) => a + b, 0), 100, '100 legacy jobs ran');
  t.ok((s.source.maxRunning.get(WG) ?? 0) <= 3, `running never exceeded 3 (max ${s.source.maxRunning.get(WG)})`);
  t.equal(s.source.maxInUse.get(WG), 3, 'reserved + running never exceeded 3, and all 3 were used at once');
  const brokerEnd = Math.min(b1!.endedAt, b2!.endedAt);
  t.ok(legacyTimes.some((x) => x < brokerEnd), 'legacy tokens were issued while broker jobs were still coming: they really shared');
  t.ok(legacy503 > 0, `legacy clients were turned away while slots were taken (${legacy503} times)`);
  t.equal(s.source.inUse(WG), 0, 'every slot came home');
  t.comment(`503s: ${legacy503}, broker ended ${brokerEnd - t0} ms, all ${Date.now() - t0} ms`);
});

t.test('drain with a legacy token out: /token answers 503, the token can still be redeemed, then the server closes', async (t) => {
  const s = await serve(t, { processes: 2 });
  const token = (await getToken(s.url, 'echo')).body.token as string;
  await fetch(`${s.url}/drain`, { method: 'POST' });
  const gated = await getToken(s.url, 'echo');
  t.equal(gated.status, 503, 'no new tokens while draining');
  t.equal(gated.retryAfter, '1');
  t.equal((await fetch(`${s.url}/readyz`)).status, 503);
  const put = await putJob(s.url, 'echo', { ...jobs.echo('last'), token });
  t.equal(put.status, 200, 'the token issued before the drain is honoured');
  await within(s.server.closed, 5000, 'the server to close once the slot came home');
  t.pass('closed');
});
