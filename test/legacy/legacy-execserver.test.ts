import { createHash, randomBytes } from 'node:crypto';
import { type IncomingMessage, request as httpRequest } from 'node:http';
import t from 'tap';
import { request } from 'undici';
import WebSocket from 'ws';
import { type LegacyExecserver, startLegacyExecserver } from '../../legacy/execserver/legacy-execserver.js';
import { ManualClock, type Clock } from '../../src/clock.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { ServeConfig } from '../../src/config/types.js';
import type { JobCommand, Receipt } from '../../src/protocol/job.js';

interface Teardown {
  teardown(fn: () => unknown): void;
}

function config(extra: Record<string, unknown> = {}): ServeConfig {
  return parseServeConfig({
    listen: '127.0.0.1:0',
    name: 'old-exec',
    waitgroups: { small: 2, solo: 1 },
    commands: {
      cat: { prog: 'cat' },
      sh: { prog: '/bin/sh', args: ['-c'] },
    },
    services: {
      cat: { waitgroup: 'small', commands: ['cat', 'sh'] },
      sh: { waitgroup: 'small', commands: ['sh'] },
      solo: { waitgroup: 'solo', commands: ['sh'] },
    },
    ...extra,
  });
}

async function start(t: Teardown, opts: { clock?: Clock; extra?: Record<string, unknown> } = {}): Promise<LegacyExecserver> {
  const o: { clock?: Clock } = {};
  if (opts.clock) o.clock = opts.clock;
  const s = await startLegacyExecserver(config(opts.extra), o);
  t.teardown(() => s.close());
  return s;
}

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json: () => any;
}

async function call(method: 'GET' | 'PUT', url: string, body?: Buffer | string, headers: Record<string, string> = {}): Promise<Answer> {
  const res = await request(url, { method, body: body ?? null, headers });
  const text = await res.body.text();
  return { status: res.statusCode, headers: res.headers, text, json: () => JSON.parse(text) };
}

async function token(s: LegacyExecserver, service: string): Promise<string> {
  const a = await call('GET', `${s.url}/token/${service}`);
  if (a.status !== 200) throw new Error(`GET /token/${service}: ${a.status} ${a.text}`);
  return a.json().token as string;
}

const sh = (script: string, stream: { stdin?: boolean; stdout?: boolean } = {}): JobCommand => ({
  prog: 'sh',
  args: [{ type: 'value', value: script }],
  ...(stream.stdin ? { stdin: { type: 'body' as const } } : {}),
  ...(stream.stdout ? { stdout: { type: 'body' as const } } : {}),
});
const catBody: JobCommand = { prog: 'cat', args: [], stdin: { type: 'body' }, stdout: { type: 'body' } };

function jobUrl(s: LegacyExecserver, service: string, tok: string | undefined, commands: JobCommand[]): string {
  const job: Record<string, unknown> = { service, commands };
  if (tok !== undefined) job.token = tok;
  return `${s.url}/job/${service}?job=${encodeURIComponent(JSON.stringify(job))}`;
}

/** A PUT whose body the test writes piece by piece (node:http, so a truncated response shows). */
function streamingPut(url: string, headers: Record<string, string> = {}) {
  const req = httpRequest(url, { method: 'PUT', headers: { 'transfer-encoding': 'chunked', ...headers } });
  const response = new Promise<IncomingMessage>((resolve, reject) => {
    req.on('response', resolve);
    req.on('error', reject);
  });
  /** The whole response body, and whether it ended cleanly. */
  const body = response.then(
    (res) =>
      new Promise<{ status: number; data: Buffer; complete: boolean }>((resolve) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        const done = (): void => resolve({ status: res.statusCode ?? 0, data: Buffer.concat(chunks), complete: res.complete });
        res.on('end', done);
        res.on('error', done);
        res.on('aborted', done);
      }),
  );
  req.flushHeaders();
  return { req, response, body };
}

const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

t.test('GET /token: 200, 503 and 404 bodies exactly as §5, always Connection: close', async (t) => {
  const s = await start(t);
  const ok = await call('GET', `${s.url}/token/solo`);
  t.equal(ok.status, 200);
  t.same(Object.keys(ok.json()), ['token'], 'no service URL without tokenResponseSendServerIP');
  t.type(ok.json().token, 'string');
  t.equal(ok.headers.connection, 'close');

  const busy = await call('GET', `${s.url}/token/solo`);
  t.equal(busy.status, 503);
  t.equal(busy.text, '{"Error":"All workers busy","Status":503}');
  t.equal(busy.headers.connection, 'close');

  const unknown = await call('GET', `${s.url}/token/x`);
  t.equal(unknown.status, 404);
  t.equal(unknown.text, '{"Error":"Unknown service \\"x\\"","Status":404}');
  t.equal(unknown.headers.connection, 'close');

  const health = await call('GET', `${s.url}/healthz`);
  t.equal(health.status, 200);
  t.equal(health.headers.connection, 'close');

  t.equal(s.counters.requests.token[200], 1);
  t.equal(s.counters.requests.token[503], 1);
  t.equal(s.counters.requests.token[404], 1);
  t.equal(s.counters.tokensIssued, 1);
});

t.test('tokenResponseSendServerIP adds the service URL of this instance', async (t) => {
  const s = await start(t, { extra: { tokenResponseSendServerIP: true } });
  const a = await call('GET', `${s.url}/token/cat`);
  t.equal(a.status, 200);
  t.equal(a.json().service, s.url);
  t.match(s.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  // The PUT goes there.
  const r = await call('PUT', jobUrl(s, 'cat', a.json().token, [sh('echo hi')]));
  t.equal(r.status, 200);
  t.equal(r.json().stdout_prefix, 'hi\n');
});

t.test('a token lives 10 s: then it is Token not found and its slot is free again', async (t) => {
  const clock = new ManualClock();
  const s = await start(t, { clock });
  const tok = await token(s, 'solo');
  clock.advance(9999);
  t.equal((await call('GET', `${s.url}/token/solo`)).status, 503, 'still reserved just before 10 s');
  clock.advance(1);
  t.equal(s.counters.tokensExpired, 1, 'the cleanup timer freed it');
  const again = await call('GET', `${s.url}/token/solo`);
  t.equal(again.status, 200, 'the slot is free again');
  const put = await call('PUT', jobUrl(s, 'solo', tok, [sh('echo never')]));
  t.equal(put.status, 400);
  t.equal(put.text, '{"Error":"Token not found","Status":400}');
  t.equal(s.counters.jobs.solo, undefined, 'nothing ran');
});

t.test('a token lapsed between cleanup ticks is refused on use', async (t) => {
  const clock = new ManualClock();
  const s = await start(t, { clock });
  clock.advance(500);
  const tok = await token(s, 'solo');
  clock.advance(10_000); // expires at 10500; the last tick was at 10000
  t.equal(s.counters.tokensExpired, 0);
  const put = await call('PUT', jobUrl(s, 'solo', tok, []));
  t.equal(put.status, 400);
  t.equal(put.json().Error, 'Token not found');
  t.equal(s.counters.tokensExpired, 1);
});

t.test('a token is single use', async (t) => {
  const s = await start(t);
  const tok = await token(s, 'solo');
  const first = await call('PUT', jobUrl(s, 'solo', tok, [sh('echo once')]));
  t.equal(first.status, 200);
  t.equal(first.json().ok, true);
  t.equal(first.headers.connection, 'close');
  const second = await call('PUT', jobUrl(s, 'solo', tok, [sh('echo twice')]));
  t.equal(second.status, 400);
  t.equal(second.text, '{"Error":"Token not found","Status":400}');
  t.equal(second.headers.connection, 'close');
  t.equal(s.counters.jobs.solo, 1);
  t.equal(s.counters.requests.job[400], 1);

  const none = await call('PUT', jobUrl(s, 'solo', undefined, [sh('echo')]));
  t.equal(none.text, '{"Error":"Token not found","Status":400}', 'a job without a token');
  const forged = await call('PUT', jobUrl(s, 'solo', 'forged', [sh('echo')]));
  t.equal(forged.text, '{"Error":"Token not found","Status":400}');
});

t.test('a token of another service is refused and not spent', async (t) => {
  const s = await start(t);
  const tok = await token(s, 'solo');
  const wrong = await call('PUT', jobUrl(s, 'cat', tok, [sh('echo wrong')]));
  t.equal(wrong.status, 400);
  t.equal(wrong.text, '{"Error":"Token not valid for service \\"cat\\"","Status":400}');
  const right = await call('PUT', jobUrl(s, 'solo', tok, [sh('echo right')]));
  t.equal(right.status, 200);
  t.equal(right.json().stdout_prefix, 'right\n');
  t.equal(s.counters.jobs.cat, undefined);
});

t.test('a job that does not parse or validate is 400 and leaves the token alone', async (t) => {
  const s = await start(t);
  const tok = await token(s, 'solo');
  const missing = await call('PUT', `${s.url}/job/solo`);
  t.equal(missing.status, 400);
  t.equal(missing.text, '{"Error":"Missing query parameter \\"job\\"","Status":400}');
  const garbage = await call('PUT', `${s.url}/job/solo?job=${encodeURIComponent('{"service": ')}`);
  t.equal(garbage.status, 400);
  t.match(garbage.json().Error, /^Invalid job JSON: /);
  t.equal(garbage.json().Status, 400);
  const bad = await call('PUT', `${s.url}/job/solo?job=${encodeURIComponent(JSON.stringify({ service: 'solo', token: tok, commands: [{ prog: 7 }] }))}`);
  t.equal(bad.status, 400);
  t.equal(bad.text, '{"Error":"Invalid job: job.commands[0].prog must be a string","Status":400}');
  const unknown = await call('PUT', jobUrl(s, 'nope', tok, []));
  t.equal(unknown.status, 404);
  t.equal(unknown.text, '{"Error":"Unknown service \\"nope\\"","Status":404}');
  const ok = await call('PUT', jobUrl(s, 'solo', tok, [sh('echo still valid')]));
  t.equal(ok.status, 200);
  t.equal(ok.json().ok, true);
});

t.test('a job that fails outside body mode is 200 with ok: false in the receipt', async (t) => {
  const s = await start(t);
  const r = await call('PUT', jobUrl(s, 'solo', await token(s, 'solo'), [sh('echo out; echo why >&2; exit 5')]));
  t.equal(r.status, 200);
  const receipt = r.json() as Receipt;
  t.equal(receipt.ok, false);
  t.equal(receipt.exit_code, 5);
  t.equal(receipt.error?.code, 'command_failed');
  t.equal(receipt.stderr_line, 'why');
  const notAllowed = await call('PUT', jobUrl(s, 'solo', await token(s, 'solo'), [{ prog: 'cat', args: [] }]));
  t.equal(notAllowed.status, 200);
  t.equal(notAllowed.json().error.code, 'command_not_allowed', 'cat is configured, but not for service solo');
});

t.test('a job with no commands is answered at once and frees its slot', async (t) => {
  const s = await start(t);
  const r = await call('PUT', jobUrl(s, 'solo', await token(s, 'solo'), []));
  t.equal(r.status, 200);
  t.same(r.json(), { ok: true, exit_code: 0, duration_ms: 0, timed_out: false, stopped: false, stderr_line: '', stdout_prefix: '', output_bytes: 0, commands: [], error: null });
  t.equal(s.counters.emptyJobs.solo, 1);
  t.equal((await call('GET', `${s.url}/token/solo`)).status, 200, 'the slot is free again');
});

t.test('body mode through cat: bytes in = bytes out, any content type', async (t) => {
  const s = await start(t);
  const input = randomBytes(1024 * 1024 + 17);
  for (const contentType of ['application/json', 'this is not; a media type', undefined]) {
    const headers: Record<string, string> = contentType === undefined ? {} : { 'content-type': contentType };
    const res = await request(jobUrl(s, 'cat', await token(s, 'cat'), [catBody]), { method: 'PUT', body: input, headers });
    t.equal(res.statusCode, 200, `content-type ${contentType}`);
    t.equal(res.headers.connection, 'close');
    t.equal(res.headers['content-type'], 'application/octet-stream');
    const out = Buffer.from(await res.body.arrayBuffer());
    t.equal(out.length, input.length);
    t.equal(sha(out), sha(input));
  }
  t.equal(s.counters.jobs.cat, 3);
});

t.test('body mode: a small success is committed at the end', async (t) => {
  const s = await start(t);
  const r = await call('PUT', jobUrl(s, 'cat', await token(s, 'cat'), [sh('printf small', { stdout: true })]));
  t.equal(r.status, 200);
  t.equal(r.text, 'small');
});

t.test('body mode: a failure with small output answers 500 with the receipt JSON', async (t) => {
  const s = await start(t);
  const r = await call('PUT', jobUrl(s, 'cat', await token(s, 'cat'), [sh('echo partial; echo broken >&2; exit 2', { stdout: true })]));
  t.equal(r.status, 500);
  t.equal(r.headers.connection, 'close');
  const receipt = r.json() as Receipt;
  t.equal(receipt.ok, false);
  t.equal(receipt.error?.code, 'command_failed');
  t.equal(receipt.exit_code, 2);
  t.equal(receipt.stdout_prefix, 'partial\n');
  t.equal(receipt.stderr_line, 'broken');
  t.equal(s.counters.requests.job[500], 1);
});

t.test('body mode: a failure after the commit truncates the chunked response', async (t) => {
  const s = await start(t);
  const put = streamingPut(jobUrl(s, 'cat', await token(s, 'cat'), [sh('head -c 10000 /dev/zero; exit 1', { stdout: true })]));
  put.req.end();
  const b = await put.body;
  t.equal(b.status, 200, 'committed: the status was already sent');
  t.equal(b.complete, false, 'the client sees an incomplete body, not a clean end');
  t.ok(b.data.length <= 10000);
});

t.test('a client that goes away stops its job and frees the slot', async (t) => {
  const s = await start(t);
  const ended = new Promise<Receipt>((resolve) => s.onJobEnd((e) => resolve(e.receipt)));
  const put = streamingPut(jobUrl(s, 'solo', await token(s, 'solo'), [sh('head -c 5000 /dev/zero; exec sleep 30', { stdout: true })]));
  put.req.end();
  const res = await put.response; // committed: the job is running
  t.equal(res.statusCode, 200);
  res.destroy();
  put.req.destroy();
  const receipt = await ended;
  t.equal(receipt.stopped, true);
  t.equal(receipt.error?.code, 'stopped');
  t.equal(s.counters.running.solo, 0);
  t.equal((await call('GET', `${s.url}/token/solo`)).status, 200);
});

t.test('no /broker: a websocket upgrade gets 404', async (t) => {
  const s = await start(t);
  const ws = new WebSocket(`${s.url.replace('http:', 'ws:')}/broker`);
  const status = await new Promise<number | string>((resolve) => {
    ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
    ws.on('open', () => resolve('open'));
    ws.on('error', (e) => resolve(`error: ${e.message}`));
  });
  t.equal(status, 404);
  ws.terminate();
});

t.test('never more than `processes` jobs at once per waitgroup', async (t) => {
  t.test('two long jobs hold both slots of the waitgroup, for every service in it', async (t) => {
    const s = await start(t);
    const chunk = Buffer.alloc(5000, 0x61);
    const a = streamingPut(jobUrl(s, 'cat', await token(s, 'cat'), [catBody]));
    const b = streamingPut(jobUrl(s, 'cat', await token(s, 'cat'), [catBody]));
    a.req.write(chunk);
    b.req.write(chunk);
    // Over 4000 bytes went through cat: both responses are committed, both jobs are running.
    t.equal((await a.response).statusCode, 200);
    t.equal((await b.response).statusCode, 200);
    t.equal(s.counters.running.small, 2);
    t.equal((await call('GET', `${s.url}/token/cat`)).status, 503);
    t.equal((await call('GET', `${s.url}/token/sh`)).status, 503, 'service sh shares the waitgroup');
    t.equal((await call('GET', `${s.url}/token/solo`)).status, 200, 'another waitgroup is not affected');
    a.req.end(chunk);
    const aBody = await a.body;
    t.equal(aBody.complete, true);
    t.equal(aBody.data.length, 10000);
    t.equal((await call('GET', `${s.url}/token/cat`)).status, 200, 'a slot is free once a job ended');
    b.req.end();
    t.equal((await b.body).data.length, 5000);
    t.equal(s.counters.maxRunning.small, 2);
    t.equal(s.counters.running.small, 0);
  });

  t.test('many clients racing for two slots', async (t) => {
    const s = await start(t);
    let completions = 0;
    let waiting: (() => void)[] = [];
    const nextCompletion = (): Promise<void> => new Promise((resolve) => waiting.push(resolve));
    const completed = (): void => {
      completions++;
      const w = waiting;
      waiting = [];
      for (const wake of w) wake();
    };
    let busy = 0;
    const receipts: Receipt[] = [];
    async function worker(jobs: number): Promise<void> {
      for (let i = 0; i < jobs; ) {
        const seen = completions;
        const a = await call('GET', `${s.url}/token/sh`);
        if (a.status === 503) {
          busy++;
          // Retry when a job ended (at once if one ended while we asked).
          if (completions === seen) await nextCompletion();
          continue;
        }
        const r = await call('PUT', jobUrl(s, 'sh', a.json().token, [sh('exit 0')]));
        receipts.push(r.json());
        i++;
        completed();
      }
    }
    await Promise.all(Array.from({ length: 6 }, () => worker(4)));
    t.equal(receipts.length, 24);
    t.ok(receipts.every((r) => r.ok));
    t.equal(s.counters.jobs.sh, 24);
    t.ok((s.counters.maxRunning.small ?? 0) <= 2, `max running ${s.counters.maxRunning.small}`);
    t.ok((s.counters.maxHeld.small ?? 0) <= 2, `max held ${s.counters.maxHeld.small}`);
    t.equal(s.counters.requests.token[503] ?? 0, busy);
    t.equal(s.counters.running.small, 0);
    t.comment(`503 answers: ${busy}, max running ${s.counters.maxRunning.small}`);
  });
});
