/**
 * The "Token not found" incident class (seed "Problem", "Replicas behind one address"):
 * two old execserver replicas behind one round-robin balancer, an old fylr pointed at the
 * balancer. The token is instance-local, the old server says Connection: close, the balancer
 * picks a replica per request: the PUT often reaches the replica that did not issue the token.
 * `tokenResponseSendServerIP` (the PUT goes to the issuing replica's own address) patches it.
 */
import t from 'tap';
import { systemClock } from '../../src/clock.js';
import { parseFylrConfig } from '../../src/config/load-config.js';
import { enqueue, getItem } from '../../src/db/file-queue-store.js';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { startLegacyFylr } from '../../legacy/fylr/legacy-fylr-process.js';
import { acquireAndRun, type AcquireResult } from '../../legacy/fylr/polling-client.js';
import { startBalancer } from '../helpers/balancer.js';
import { testSchema } from '../helpers/db.js';
import { noopJob, startExec } from './legacy-fylr-helpers.js';

const JOBS = 40;

async function fleet(t: Tap, tokenResponseSendServerIP: boolean) {
  // Enough slots that no replica is ever busy, even with tokens left to expire.
  const opts = { waitgroups: { fast: 2 * JOBS, slow: 1 }, tokenResponseSendServerIP };
  const r1 = await startExec(t, { ...opts, name: 'replica-1' });
  const r2 = await startExec(t, { ...opts, name: 'replica-2' });
  const lb = await startBalancer([r1.url, r2.url], { mode: 'round-robin' });
  t.teardown(() => lb.close());
  return { r1, r2, lb };
}

type Tap = { teardown(fn: () => unknown): void };

/**
 * JOBS jobs in LANES concurrent lanes, each running its jobs one after another (as the old
 * worker pool does). A PUT misses its issuer when an even number of other requests passed the
 * balancer between it and its GET. In-process lanes of empty jobs run in near lockstep (the
 * GETs of all lanes, then their PUTs): with an odd number of lanes every PUT misses, with an
 * even number none would — the parity luck that made the damage look random in production.
 * Jitter gives a mixture; only a perfect run of odd gaps could give none.
 */
const LANES = 3;

async function runJobs(url: string, counters: LegacyCounters): Promise<AcquireResult[]> {
  const results: AcquireResult[] = [];
  await Promise.all(
    Array.from({ length: LANES }, async (_, lane) => {
      for (let i = lane; i < JOBS; i += LANES) {
        results.push(await acquireAndRun(noopJob('echo'), { addresses: [url], connectTimeoutSec: 10, clock: systemClock, counters }));
      }
    }),
  );
  return results;
}

t.test('behind a balancer, some PUTs get "Token not found"', async (t) => {
  const { r1, r2, lb } = await fleet(t, false);
  const counters = new LegacyCounters();
  const results = await runJobs(lb.url, counters);
  const notFound = results.filter((r) => r.kind === 'failed' && r.error.code === 'token_not_found').length;
  const done = results.filter((r) => r.kind === 'done').length;
  t.comment(`Token not found: ${notFound} of ${JOBS} jobs (done: ${done}); balancer: ${JSON.stringify(lb.counts)}`);
  t.ok(notFound > 0, 'some jobs failed with Token not found');
  t.equal(notFound + done, JOBS, 'every job either ran or hit Token not found');
  t.equal(counters.tokenNotFoundCount, notFound, 'each one counted');
  t.equal((r1.counters.requests.job[400] ?? 0) + (r2.counters.requests.job[400] ?? 0), notFound, 'the replicas answered as many 400s');
  t.equal((r1.counters.jobs.echo ?? 0) + (r2.counters.jobs.echo ?? 0), done, 'the others ran exactly once');
  // Tokens whose PUT went astray stay reserved on their issuer until they lapse.
  t.equal(r1.counters.tokensIssued + r2.counters.tokensIssued - (r1.counters.tokensRedeemed + r2.counters.tokensRedeemed), notFound);
  t.equal((lb.counts[r1.url] ?? 0) + (lb.counts[r2.url] ?? 0), 2 * JOBS, 'every GET and PUT went through the balancer');
});

t.test('with tokenResponseSendServerIP the PUT reaches the issuer: no "Token not found"', async (t) => {
  const { r1, r2, lb } = await fleet(t, true);
  const counters = new LegacyCounters();
  const results = await runJobs(lb.url, counters);
  const notFound = results.filter((r) => r.kind === 'failed' && r.error.code === 'token_not_found').length;
  t.comment(`Token not found with tokenResponseSendServerIP: ${notFound} of ${JOBS}`);
  t.equal(notFound, 0);
  t.equal(counters.tokenNotFoundCount, 0);
  t.ok(results.every((r) => r.kind === 'done' && r.receipt.ok), 'every job ran');
  t.ok(results.every((r) => r.kind === 'done' && (r.target === r1.url || r.target === r2.url)), 'each PUT went to a replica directly');
  t.equal((r1.counters.jobs.echo ?? 0) + (r2.counters.jobs.echo ?? 0), JOBS);
  t.ok((r1.counters.jobs.echo ?? 0) > 0 && (r2.counters.jobs.echo ?? 0) > 0, 'both replicas took jobs');
  t.equal((lb.counts[r1.url] ?? 0) + (lb.counts[r2.url] ?? 0), JOBS, 'only the GETs went through the balancer');
});

t.test('the old fylr process behind the balancer: items fail with token_not_found', async (t) => {
  const { lb } = await fleet(t, false);
  const { schema, pool } = await testSchema(t, 'incident');
  const ids: number[] = [];
  for (let i = 0; i < 20; i++) ids.push(await enqueue(pool, { action: 'echo', payload: { service: 'echo', commands: [] } }));
  const config = parseFylrConfig({
    listen: '127.0.0.1:0',
    name: 'old-fylr',
    execserver: { addresses: [lb.url], connectTimeoutSec: 10, parallel: 3, parallelHigh: 1 },
  });
  const fylr = await startLegacyFylr(config, { schema });
  t.teardown(() => fylr.close());
  await fylr.counters.until(() => {
    const r = fylr.counters.snapshot().results;
    return r.done + r.failed + r.requeue === ids.length;
  });
  const items = await Promise.all(ids.map((id) => getItem(pool, id)));
  const failed = items.filter((i) => i?.state === 'failed');
  const done = items.filter((i) => i?.state === 'done');
  t.comment(`old fylr behind the balancer: ${failed.length} of ${ids.length} items failed with Token not found`);
  t.ok(failed.length > 0, 'some items failed');
  t.equal(failed.length + done.length, ids.length);
  t.ok(
    failed.every((i) => (i?.receipt as { error?: { code?: string } } | null)?.error?.code === 'token_not_found'),
    'every failure is token_not_found',
  );
  t.equal(fylr.counters.tokenNotFoundCount, failed.length);
});
