import { createHash } from 'node:crypto';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { ManualClock } from '../../src/clock.js';
import { execBudget, LocalSlots } from '../../src/fylr/dispatcher-admission.js';
import { ClaimKeeper } from '../../src/fylr/dispatcher-heartbeats.js';
import { runLocalTask } from '../../src/fylr/dispatcher-local-tasks.js';
import { DEFAULT_MAX_FAILURES, MAX_RETRY_BACKOFF_MS, RetryPolicy } from '../../src/fylr/dispatcher-retry.js';
import { failedReceipt, okReceipt } from '../../src/protocol/job.js';

t.test('execBudget: the claim share minus what is carried; nothing without an execserver', async (t) => {
  const c = (share: number, connected = true) => ({ admission: () => share, hasExecserver: () => connected });
  t.equal(execBudget(c(10), 0), 10);
  t.equal(execBudget(c(10), 7), 3);
  t.equal(execBudget(c(10), 12), 0, 'a share that shrank below what is carried claims nothing (and takes nothing away)');
  t.equal(execBudget(c(10, false), 0), 0, 'no execserver connected: nothing exec-bound');
  t.equal(execBudget(c(0), 0), 0);
  t.equal(execBudget(c(Number.NaN), 0), 0);
  t.equal(execBudget(c(2.9), 0), 2);
});

t.test('LocalSlots: sized from the CPUs, a quarter (at least one) kept for high priority', async (t) => {
  const d = new LocalSlots();
  t.equal(d.size, Math.max(2, availableParallelism()));
  t.equal(d.reserve, Math.max(1, Math.floor(d.size / 4)));
  const s = new LocalSlots({ size: 8 });
  t.equal(s.reserve, 2);
  t.same(s.budget(), { localBound: 8, localLow: 6 });
  for (let i = 0; i < 6; i++) s.take(false);
  t.same(s.budget(), { localBound: 2, localLow: 0 }, 'low work filled its part: only high may come');
  t.throws(() => s.take(false), /over-claimed/);
  s.take(true);
  s.take(true);
  t.same(s.budget(), { localBound: 0, localLow: 0 });
  t.throws(() => s.take(true), /over-claimed/);
  s.give(false);
  t.same(s.budget(), { localBound: 1, localLow: 1 }, 'a freed low slot serves either');
  const h = new LocalSlots({ size: 4, reserve: 1 });
  for (let i = 0; i < 4; i++) h.take(true);
  h.give(true);
  t.same(h.budget(), { localBound: 1, localLow: 1 }, 'high work may use the low part too');
  t.throws(() => new LocalSlots({ size: 0 }), RangeError);
  t.throws(() => new LocalSlots({ size: 2, reserve: 2 }), RangeError, 'the reserve must leave a slot for low work');
});

t.test('RetryPolicy: backoff doubling, a cap on failures, final errors end at once', async (t) => {
  const p = new RetryPolicy();
  t.equal(p.maxFailures, DEFAULT_MAX_FAILURES);
  const failed = failedReceipt('command_failed', 'exit 1');
  t.same(p.decide(0, failed), { kind: 'retry', afterMs: 10_000 });
  t.same(p.decide(1, failed), { kind: 'retry', afterMs: 20_000 });
  t.same(p.decide(2, failed), { kind: 'fail', reason: 'max_failures' });
  t.same(p.decide(0, failedReceipt('command_not_allowed', 'no')), { kind: 'fail', reason: 'final_error' });
  t.same(p.decide(0, failedReceipt('invalid_job', 'no')), { kind: 'fail', reason: 'final_error' });
  t.same(p.decide(0, { ...failedReceipt('stopped', 'conn closed'), stopped: true }), { kind: 'retry', afterMs: 10_000 });
  const long = new RetryPolicy({ maxFailures: 40, backoffMs: 1000 });
  t.equal((long.decide(30, failed) as { afterMs: number }).afterMs, MAX_RETRY_BACKOFF_MS, 'backoff is capped');
  t.same(new RetryPolicy({ maxFailures: 1 }).decide(0, failed), { kind: 'fail', reason: 'max_failures' });
  t.throws(() => new RetryPolicy({ maxFailures: 0 }), RangeError);
  t.ok(okReceipt().ok);
});

t.test('ClaimKeeper: the stale threshold must be at least two heartbeats', async (t) => {
  const base = {
    pool: { query: async () => ({ rows: [] }) } as never,
    owner: 'hb:x',
    clock: new ManualClock(),
    maxFailures: 3,
    carried: () => [],
    onLost: () => undefined,
    onSwept: () => undefined,
    onError: () => undefined,
    onQuery: () => undefined,
  };
  t.throws(() => new ClaimKeeper({ ...base, heartbeatIntervalMs: 600, staleAfterMs: 1000 }), /at least twice/);
  t.throws(() => new ClaimKeeper({ ...base, heartbeatIntervalMs: 0 }), RangeError);
  const k = new ClaimKeeper({ ...base, heartbeatIntervalMs: 200, staleAfterMs: 1000 });
  t.same([k.heartbeatIntervalMs, k.staleAfterMs, k.sweepIntervalMs], [200, 1000, 200]);
  const d = new ClaimKeeper(base);
  t.same([d.heartbeatIntervalMs, d.staleAfterMs], [5000, 30_000], 'config-free defaults');
});

t.test('local tasks: checksum of data, of a file, of the payload; sync/copy_move hold their slot', async (t) => {
  const clock = new ManualClock();
  const sha = (s: string | Buffer) => createHash('sha256').update(s).digest('hex');
  const r1 = await runLocalTask('checksum', { data: 'hello' }, clock);
  t.ok(r1.ok);
  t.equal(r1.stdout_prefix, sha('hello'));
  const dir = await mkdtemp(join(tmpdir(), 'sg-checksum-'));
  const file = join(dir, 'f.bin');
  const content = Buffer.alloc(300_000, 7);
  await writeFile(file, content);
  t.equal((await runLocalTask('checksum', { file }, clock)).stdout_prefix, sha(content));
  const payload = { service: 'checksum', commands: [] };
  t.equal((await runLocalTask('checksum', payload, clock)).stdout_prefix, sha(JSON.stringify(payload)));
  const missing = await runLocalTask('checksum', { file: join(dir, 'nope') }, clock);
  t.notOk(missing.ok);
  t.equal(missing.error?.code, 'command_failed');
  t.match(missing.error?.message, /ENOENT/);

  let ended = false;
  const held = runLocalTask('sync', { hold_ms: 5000 }, clock).then((r) => {
    ended = true;
    return r;
  });
  await new Promise((r) => setImmediate(r));
  clock.advance(4999);
  await new Promise((r) => setImmediate(r));
  t.notOk(ended, 'still holding its slot');
  clock.advance(1);
  const r = await held;
  t.ok(r.ok);
  t.equal(r.duration_ms, 5000);
  t.ok((await runLocalTask('copy_move', {}, clock)).ok, 'no hold_ms: done at once');
  const ac = new AbortController();
  const aborted = runLocalTask('copy_move', { hold_ms: 60_000 }, clock, ac.signal);
  ac.abort();
  t.ok((await aborted).ok, 'a stop ends the hold');
  t.equal((await runLocalTask('convert', {}, clock)).error?.code, 'invalid_job');
});
