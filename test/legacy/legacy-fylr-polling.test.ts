import { PassThrough, Readable } from 'node:stream';
import t from 'tap';
import { type Clock, ManualClock, systemClock } from '../../src/clock.js';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { acquireAndRun, type AcquireResult, legacyError, parseLegacyAddress } from '../../legacy/fylr/polling-client.js';
import { echoJob, noopJob, sleepJob, startExec } from './legacy-fylr-helpers.js';

/**
 * Occupies the only `slow` slot of `url` with a long `sleep` job; resolves once its PUT is out.
 * The job ends (killed or failed) when its execserver closes at teardown.
 */
async function holdSlowSlot(url: string): Promise<{ result: Promise<AcquireResult> }> {
  const counters = new LegacyCounters();
  let running!: () => void;
  const sent = new Promise<void>((r) => (running = r));
  const result = acquireAndRun(sleepJob(60), { addresses: [url], connectTimeoutSec: 5, clock: systemClock, counters, onRunning: () => running() });
  await sent;
  return { result };
}

t.test('parseLegacyAddress: a /job/<service> path limits the address', async (t) => {
  t.same(parseLegacyAddress('http://exec:8083'), { address: 'http://exec:8083', base: 'http://exec:8083', onlyService: null });
  t.same(parseLegacyAddress('http://exec:8083/job/convert'), { address: 'http://exec:8083/job/convert', base: 'http://exec:8083', onlyService: 'convert' });
  t.same(parseLegacyAddress('http://exec:8083/prefix/job/convert/'), { address: 'http://exec:8083/prefix/job/convert/', base: 'http://exec:8083/prefix', onlyService: 'convert' });
  t.same(parseLegacyAddress('http://exec:8083/prefix/').base, 'http://exec:8083/prefix');
});

t.test('legacyError translates the old error bodies once', async (t) => {
  t.equal(legacyError(400, '{"Error": "Token not found", "Status": 400}').code, 'token_not_found');
  t.equal(legacyError(503, '{"Error": "All workers busy", "Status": 503}').code, 'all_workers_busy');
  t.equal(legacyError(404, '{"Error": "Unknown service \\"x\\"", "Status": 404}').code, 'unknown_service');
  t.equal(legacyError(400, '{"Error": "bad job", "Status": 400}').code, 'bad_request');
  t.equal(legacyError(502, 'bad gateway').code, 'backend_failed');
});

t.test('a free execserver runs the job: token, PUT, receipt', async (t) => {
  const exec = await startExec(t);
  const counters = new LegacyCounters();
  const r = await acquireAndRun(echoJob('hello old world'), { addresses: [exec.url], connectTimeoutSec: 5, clock: systemClock, counters });
  t.equal(r.kind, 'done');
  if (r.kind !== 'done') return;
  t.equal(r.status, 200);
  t.equal(r.receipt.ok, true);
  t.equal(r.receipt.stdout_prefix, 'hello old world\n');
  t.equal(r.target, exec.url, 'no service URL in the token answer: PUT to the address');
  const s = counters.snapshot();
  t.equal(s.token_requests.total, 1);
  t.same(s.token_requests.by_address[exec.url], { total: 1, by_status: { '200': 1 } });
  t.same(s.puts, { total: 1, by_status: { '200': 1 } });
  t.equal(s.token_not_found, 0);
});

t.test('body mode: stdin is the PUT body, stdout the response body', async (t) => {
  const exec = await startExec(t);
  const counters = new LegacyCounters();
  const job = { service: 'cat', commands: [{ prog: 'cat', args: [], stdin: { type: 'body' as const }, stdout: { type: 'body' as const } }] };
  const input = 'x'.repeat(10_000) + 'end';
  const out = new PassThrough();
  const chunks: Buffer[] = [];
  out.on('data', (c: Buffer) => chunks.push(c));
  const r = await acquireAndRun(job, { addresses: [exec.url], connectTimeoutSec: 5, clock: systemClock, counters, stdin: Readable.from([Buffer.from(input)]), stdout: out });
  t.equal(r.kind, 'done');
  t.equal(Buffer.concat(chunks).toString(), input, 'stdout is the input, streamed back');
  if (r.kind === 'done') {
    t.equal(r.receipt.ok, true);
    t.equal(r.receipt.output_bytes, input.length);
  }
  t.ok(out.writableEnded, 'stdout was ended');

  // A body-mode failure before the commit: 500 with the receipt JSON.
  const failing = { service: 'cat', commands: [{ prog: 'cat', args: [{ type: 'value' as const, value: '/nonexistent/file' }], stdout: { type: 'body' as const } }] };
  const f = await acquireAndRun(failing, { addresses: [exec.url], connectTimeoutSec: 5, clock: systemClock, counters, stdout: new PassThrough() });
  t.equal(f.kind, 'done');
  if (f.kind === 'done') {
    t.equal(f.status, 500);
    t.equal(f.receipt.ok, false);
    t.match(f.receipt.stderr_line, /nonexistent/);
  }
});

t.test('unknown service: a 404 fails the job (or skips that address)', async (t) => {
  const exec = await startExec(t);
  const counters = new LegacyCounters();
  const r = await acquireAndRun(noopJob('nope'), { addresses: [exec.url], connectTimeoutSec: 5, clock: systemClock, counters });
  t.equal(r.kind, 'failed');
  if (r.kind === 'failed') {
    t.equal(r.error.code, 'unknown_service');
    t.equal(r.status, 404);
  }
  const skip = await acquireAndRun(noopJob('nope'), { addresses: [exec.url], connectTimeoutSec: 5, clock: systemClock, counters, onUnknownService: 'skip-address' });
  t.equal(skip.kind, 'failed', 'every address skipped: failed');
  t.equal(counters.tokenRequests, 2);
});

t.test('a /job/<service> address is only polled for that service', async (t) => {
  const a = await startExec(t, { name: 'a' });
  const b = await startExec(t, { name: 'b' });
  const echoOnly = `${b.url}/job/echo`;
  const counters = new LegacyCounters();
  // cat: only a is eligible.
  const r = await acquireAndRun({ service: 'cat', commands: [] }, { addresses: [a.url, echoOnly], connectTimeoutSec: 5, clock: systemClock, counters });
  t.equal(r.kind, 'done');
  t.equal(counters.tokenRequestsTo(a.url), 1);
  t.equal(counters.tokenRequestsTo(echoOnly), 0, 'the echo-only address was not asked for cat');
  // No eligible address at all: failed without a request.
  const none = await acquireAndRun({ service: 'cat', commands: [] }, { addresses: [echoOnly], connectTimeoutSec: 5, clock: systemClock, counters });
  t.equal(none.kind, 'failed');
  if (none.kind === 'failed') t.equal(none.error.code, 'unknown_service');
  t.equal(counters.tokenRequests, 1);
  // echo: both are asked; the /job/echo address's base is used for the token.
  const e = await acquireAndRun({ service: 'echo', commands: [] }, { addresses: [a.url, echoOnly], connectTimeoutSec: 5, clock: systemClock, counters });
  t.equal(e.kind, 'done');
  await counters.until(() => counters.tokenRequests === 3);
  t.equal(counters.tokenRequestsTo(echoOnly), 1);
});

t.test('first token wins; the other round trip tokens are left to expire', async (t) => {
  const a = await startExec(t, { name: 'a', waitgroups: { fast: 1, slow: 1 } });
  const b = await startExec(t, { name: 'b', waitgroups: { fast: 1, slow: 1 } });
  const counters = new LegacyCounters();
  const r = await acquireAndRun(noopJob('echo'), { addresses: [a.url, b.url], connectTimeoutSec: 5, clock: systemClock, counters });
  t.equal(r.kind, 'done');
  await counters.until(() => counters.tokenRequests === 2);
  const s = counters.snapshot();
  t.equal(s.tokens_granted, 2, 'both free execservers granted a token');
  t.equal(s.tokens_abandoned, 1, 'one of them is never used');
  t.equal(s.puts.total, 1);
  t.equal(a.counters.tokensIssued + b.counters.tokensIssued, 2);
  t.equal(a.counters.tokensRedeemed + b.counters.tokensRedeemed, 1);
  // The abandoned token still holds the loser's only fast slot: a job for it alone finds it busy.
  const loser = r.kind === 'done' && r.target === a.url ? b.url : a.url;
  const clock = new ManualClock();
  const busyCounters = new LegacyCounters(clock);
  const busy = acquireAndRun(noopJob('echo'), { addresses: [loser], connectTimeoutSec: 1, clock, counters: busyCounters });
  // One round (503), then the deadline.
  await busyCounters.until(() => busyCounters.busyRounds === 1);
  t.same(busyCounters.snapshot().token_requests.by_status, { '503': 1 });
  clock.advance(1000);
  const br = await busy;
  t.same(br, { kind: 'requeue', reason: 'no_slot', rounds: 1 });
});

t.test('polling storm: N waiting jobs × A busy addresses ≈ N×A token requests per second', async (t) => {
  const a = await startExec(t, { name: 'a', waitgroups: { fast: 1, slow: 1 } });
  const b = await startExec(t, { name: 'b', waitgroups: { fast: 1, slow: 1 } });
  await holdSlowSlot(a.url);
  await holdSlowSlot(b.url);

  const N = 20;
  const A = 2;
  const SECONDS = 3;
  const clock = new ManualClock();
  const counters = new LegacyCounters(clock);
  const jobs = Array.from({ length: N }, () =>
    acquireAndRun(sleepJob(1), { addresses: [a.url, b.url], connectTimeoutSec: SECONDS, clock, counters }),
  );
  for (let s = 1; s <= SECONDS; s++) {
    // Every job finished its round (all addresses busy) and sleeps until the next tick.
    await counters.until(() => counters.busyRounds >= N * s);
    t.equal(counters.tokenRequests, N * A * s, `after round ${s}`);
    clock.advance(1000);
  }
  const results = await Promise.all(jobs);
  t.ok(results.every((r) => r.kind === 'requeue' && r.reason === 'no_slot'), 'every job requeues at connectTimeoutSec');
  const snap = counters.snapshot();
  const perSecond = snap.token_requests.total / (snap.elapsed_ms / 1000);
  t.comment(`polling storm: ${snap.token_requests.total} token requests in ${snap.elapsed_ms} ms = ${perSecond} /s for N=${N} jobs × A=${A} addresses`);
  t.ok(snap.token_requests.total >= (N * A * SECONDS) / 2 && snap.token_requests.total <= N * A * SECONDS * 2, 'within a factor of 2 of N×A×seconds');
  t.equal(snap.elapsed_ms, SECONDS * 1000);
  t.equal(snap.token_requests.by_status['503'], snap.token_requests.total, 'every answer was 503 All workers busy');
  t.equal(snap.token_requests.by_address[a.url]?.total, N * SECONDS);
  t.equal(snap.token_requests.by_address[b.url]?.total, N * SECONDS);
  t.equal(snap.puts.total, 0);
  // The servers saw the same storm.
  t.equal(a.counters.requests.token[503], N * SECONDS, 'execserver a answered N×seconds 503s');
  t.equal(b.counters.requests.token[503], N * SECONDS, 'execserver b answered N×seconds 503s');
});

t.test('an aborted slot wait requeues at once', async (t) => {
  const a = await startExec(t, { name: 'a' });
  await holdSlowSlot(a.url);
  const clock = new ManualClock();
  const counters = new LegacyCounters(clock);
  const ac = new AbortController();
  const p = acquireAndRun(sleepJob(1), { addresses: [a.url], connectTimeoutSec: 60, clock, counters, signal: ac.signal });
  await counters.until(() => counters.busyRounds === 1);
  ac.abort();
  t.same(await p, { kind: 'requeue', reason: 'aborted', rounds: 1 });
});

t.test('a timer firing a fraction of a millisecond early does not buy another token round', async (t) => {
  const a = await startExec(t, { name: 'a', waitgroups: { fast: 1, slow: 1 } });
  await holdSlowSlot(a.url);
  // Every timer fires 0.4 ms before its due time (Node counts whole ms, the clock does not).
  let now = 0;
  const early: Clock = {
    now: () => now,
    setTimeout: (fn, ms) =>
      systemClock.setTimeout(() => {
        now += Math.max(0, ms - 0.4);
        fn();
      }, 0),
    clearTimeout: (h) => systemClock.clearTimeout(h),
  };
  const r = await acquireAndRun(sleepJob(1), { addresses: [a.url], connectTimeoutSec: 1, clock: early, counters: new LegacyCounters() });
  t.same(r, { kind: 'requeue', reason: 'no_slot', rounds: 1 });
});
