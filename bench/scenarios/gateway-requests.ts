/**
 * Backend requests per job under contention: a legacy execserver of 4 slots, jobs that run
 * `sleep 0.2` (so at most 20 jobs/s), and 32 jobs always waiting for a slot.
 * - polling: 32 old clients (legacy/fylr/polling-client.ts) loop acquireAndRun on the backend;
 * - gateway: a gateway in front of it; 4 raw ws peers keep 8 such jobs each outstanding.
 * Counted at the backend over a window: every HTTP request it answered (GET /token 200 and 503,
 * PUT /job, the gateway's token give-backs) per job with commands that ran; and the jobs/s that
 * ran (how full the 4 slots were kept). Servers run in two bench hosts (backend, gateway).
 */
import type { JobSpec } from '../../src/protocol/job.js';
import { gatewayFor, singleGroup } from '../lib/configs.js';
import { BenchHost, type HostedServer } from '../lib/host-client.js';
import { type BenchOptions, dur } from '../lib/options.js';
import { median, sleep } from '../lib/stats.js';
import { connectPeers, drainAndClosePeers } from '../lib/ws-peer.js';
import { startPollingClients } from './throughput.js';

export const CONTENTION_SLOTS = 4;
export const CONTENTION_WAITING = 32;
export const CONTENTION_JOB_SEC = 0.2;

export interface ContentionPoint {
  transport: 'polling' | 'gateway';
  reps: { requests_per_job: number; jobs_per_sec: number }[];
  /** Over the backend's whole life (start to settled after the clients stopped). */
  requests_per_job: number;
  /** Median over the windows (requests in flight at the edges included). */
  requests_per_job_window: number;
  jobs_per_sec: number;
}

export interface ContentionResult {
  slots: number;
  waiting: number;
  job_sec: number;
  points: ContentionPoint[];
}

const SLEEP_JOB: JobSpec = { service: 'sleep', commands: [{ prog: 'sleep', args: [{ type: 'value', value: String(CONTENTION_JOB_SEC) }] }] };

async function measure(host: BenchHost, backend: HostedServer, o: BenchOptions): Promise<ContentionPoint['reps']> {
  await sleep(dur(o, 1500, 1200));
  const reps: ContentionPoint['reps'] = [];
  for (let r = 0; r < o.reps; r++) {
    const a = await host.counters(backend);
    const t0 = performance.now();
    await sleep(dur(o, 3000, 2000));
    const b = await host.counters(backend);
    const jobs = b.jobs - b.empty_jobs - (a.jobs - a.empty_jobs);
    reps.push({ requests_per_job: jobs > 0 ? (b.http_requests - a.http_requests) / jobs : Number.NaN, jobs_per_sec: (jobs * 1000) / (performance.now() - t0) });
  }
  return reps;
}

async function lifetime(host: BenchHost, backend: HostedServer): Promise<number> {
  await sleep(CONTENTION_JOB_SEC * 1000 + 500);
  const c = await host.counters(backend);
  return c.http_requests / (c.jobs - c.empty_jobs);
}

function summarize(transport: ContentionPoint['transport'], reps: ContentionPoint['reps'], life: number, o: BenchOptions): ContentionPoint {
  const p = { transport, reps, requests_per_job: life, requests_per_job_window: median(reps.map((r) => r.requests_per_job)), jobs_per_sec: median(reps.map((r) => r.jobs_per_sec)) };
  o.log(`contention ${transport}: ${p.requests_per_job.toFixed(2)} backend requests/job (windows ${p.requests_per_job_window.toFixed(2)}), ${p.jobs_per_sec.toFixed(1)} jobs/s`);
  return p;
}

export async function runGatewayRequests(o: BenchOptions): Promise<ContentionResult> {
  const backendHost = await BenchHost.start();
  const gatewayHost = await BenchHost.start();
  const points: ContentionPoint[] = [];
  const like = singleGroup('contention-backend', CONTENTION_SLOTS);
  try {
    {
      const backend = await backendHost.start('legacy', like);
      const old = startPollingClients([backend.url], CONTENTION_WAITING, SLEEP_JOB);
      const reps = await measure(backendHost, backend, o);
      await old.stop();
      points.push(summarize('polling', reps, await lifetime(backendHost, backend), o));
      await backendHost.stopServer(backend);
    }
    {
      const backend = await backendHost.start('legacy', like);
      const gateway = await gatewayHost.start('gateway', gatewayFor(like, [backend.url]));
      let running = true;
      const peers = await connectPeers(gateway.url, 4, {
        onOffer: (p, jobId, token) => p.accept(jobId, token, SLEEP_JOB as unknown as Record<string, unknown>),
        onDone: (p) => {
          if (running) p.want('sleep');
        },
      });
      for (const p of peers) for (let i = 0; i < CONTENTION_WAITING / peers.length; i++) p.want('sleep');
      const reps = await measure(backendHost, backend, o);
      running = false;
      // Stop asking: the jobs running finish, and the gateway gives back what it still holds.
      await drainAndClosePeers(peers);
      points.push(summarize('gateway', reps, await lifetime(backendHost, backend), o));
      await gatewayHost.stopServer(gateway);
      await backendHost.stopServer(backend);
    }
  } finally {
    await gatewayHost.close();
    await backendHost.close();
  }
  return { slots: CONTENTION_SLOTS, waiting: CONTENTION_WAITING, job_sec: CONTENTION_JOB_SEC, points };
}
