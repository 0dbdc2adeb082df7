/**
 * The incident the gateway's sealed tokens retire: several replicas behind one balanced address,
 * old fylrs polling through it, GET /token and PUT /job landing on different replicas. First the
 * control (old execservers straight behind the balancer: "Token not found"), then two gateway
 * replicas behind the same balancer in front of two old execservers: 500 jobs, none lost.
 */
import t from 'tap';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { acquireAndRun, type AcquireResult } from '../../legacy/fylr/polling-client.js';
import { systemClock } from '../../src/clock.js';
import type { GatewaySlotSource } from '../../src/gateway/gateway-slot-source.js';
import type { JobSpec } from '../../src/protocol/job.js';
import { startBalancer } from '../helpers/balancer.js';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { startBackend, startGateway } from './gateway-world.js';

/** `total` jobs through `workers` old-fylr workers polling `address`; every result. */
async function oldFylrs(address: string, total: number, workers: number, counters: LegacyCounters, job: (i: number) => JobSpec): Promise<AcquireResult[]> {
  const results: AcquireResult[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (next < total) {
        const i = next++;
        results.push(await acquireAndRun(job(i), { addresses: [address], connectTimeoutSec: 60, clock: systemClock, counters, pollIntervalMs: 20 }));
      }
    }),
  );
  return results;
}

const work = (i: number): JobSpec => (i % 5 === 0 ? jobs.echo(`job-${i}`) : jobs.empty('echo'));

t.test('control: old execservers straight behind a balancer lose jobs to "Token not found"', async (t) => {
  const r1 = await startBackend(t, { waitgroups: { w: 4 } });
  const r2 = await startBackend(t, { waitgroups: { w: 4 } });
  const lb = await startBalancer([r1.url, r2.url]);
  t.teardown(() => lb.close());
  const counters = new LegacyCounters();
  // One client, requests in turn: GET /token lands on one replica, the PUT on the other.
  const results = await oldFylrs(lb.url, 4, 1, counters, work);
  t.ok(counters.tokenNotFoundCount > 0, `${counters.tokenNotFoundCount} of 4 jobs got Token not found`);
  t.ok(results.some((r) => r.kind === 'failed' && r.error.code === 'token_not_found'));
});

t.test('two gateway replicas behind the balancer, old fylrs through it, 500 jobs: 0 Token not found', async (t) => {
  const b1 = await startBackend(t, { waitgroups: { w: 4 } });
  const b2 = await startBackend(t, { waitgroups: { w: 4 } });
  const lb = await startBalancer([]);
  t.teardown(() => lb.close());
  const spec = { backends: [b1.url, b2.url], waitgroups: { w: 4 }, gateway: { advertised_url: lb.url } };
  const g1 = await startGateway(t, spec);
  const g2 = await startGateway(t, spec);
  lb.setTargets([g1.url, g2.url]);

  // New fylrs on the same gateways at the same time: their parked wants close the legacy gate
  // now and then, which old fylrs see as 503 and retry.
  const brokerJobs = (async () => {
    const p = await BrokerPeer.connect(g2.url);
    try {
      const done = await Promise.all(Array.from({ length: 40 }, (_, i) => p.run(`n${i}`, jobs.echo(`n${i}`))));
      return done.filter((d) => d.receipt.ok).length;
    } finally {
      await p.close();
    }
  })();

  const counters = new LegacyCounters();
  const started = Date.now();
  // Two old fylrs of 6 workers each (`parallel: 6`), through the one balanced address.
  const results = await oldFylrs(lb.url, 500, 12, counters, work);
  const snap = counters.snapshot();
  t.comment(`500 old-fylr jobs in ${Date.now() - started} ms: ${snap.token_requests.total} token requests (${snap.busy_rounds} busy rounds), ${snap.puts.total} PUTs`);
  t.equal(await brokerJobs, 40, 'every broker job done meanwhile');

  t.equal(counters.tokenNotFoundCount, 0, 'no Token not found');
  const failed = results.filter((r) => r.kind !== 'done');
  t.same(failed, [], 'every job has a receipt');
  t.equal(results.filter((r) => r.kind === 'done' && r.receipt.ok).length, 500);
  const ran = (b: typeof b1) => (b.counters.jobs.echo ?? 0);
  const givenBack = [g1, g2].reduce((n, g) => n + (g.server.source as GatewaySlotSource).status().backends.reduce((m, s) => m + s.tokens_given_back, 0), 0);
  t.equal(ran(b1) + ran(b2), 540 + givenBack, 'each job ran exactly once (500 old + 40 new, + the gateways\' give-backs)');
  t.ok(ran(b1) > 0 && ran(b2) > 0, 'on both backends');
  t.equal((b1.counters.requests.job[400] ?? 0) + (b2.counters.requests.job[400] ?? 0), 0, 'no backend refused a token');
  t.ok(b1.counters.maxRunning.w! <= 4 && b2.counters.maxRunning.w! <= 4, 'no backend over its slots');
  t.ok((lb.counts[g1.url] ?? 0) > 500 && (lb.counts[g2.url] ?? 0) > 500, 'both replicas served the old fylrs');
  const sealedBy = async (url: string) => (await (await fetch(`${url}/metrics`)).text()).match(/slotgate_legacy_jobs_total\{[^}]*status="200"[^}]*\} (\d+)/)?.[1];
  t.ok(Number(await sealedBy(g1.url)) > 0 && Number(await sealedBy(g2.url)) > 0, 'both replicas relayed PUTs');
});
