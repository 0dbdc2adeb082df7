/**
 * Throughput: no-op jobs per second end to end on loopback, for 1, 10 and 100 client connections.
 *
 * Broker (native execserver, and the bare-ws floor) in the bench host, 64 slots; peers in this
 * process, each keeping ceil(256 / connections) jobs outstanding (WANT; on OFFER at once JOB with
 * no commands; on DONE a new WANT), so there are always more wants than slots and every freed slot
 * goes straight to a parked want. Four frames per job.
 *
 * Polling (legacy execserver in the bench host, 64 slots; old clients in this process): as many
 * concurrent old clients as connections, each looping acquireAndRun (GET /token, PUT /job, one
 * TCP connection per request as the old client did; a 503 sleeps until the next 1 s tick).
 *
 * jobs/s = jobs started at the server during the window / window, after a warm-up.
 */
import { setMaxListeners } from 'node:events';
import { systemClock } from '../../src/clock.js';
import type { JobSpec } from '../../src/protocol/job.js';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { acquireAndRun } from '../../legacy/fylr/polling-client.js';
import { gatewayFor, type RawServeConfig, singleGroup } from '../lib/configs.js';
import { BenchHost, type HostedServer } from '../lib/host-client.js';
import { type BenchOptions, dur } from '../lib/options.js';
import { median, sleep } from '../lib/stats.js';
import { type InprocResult, runBrokerInproc } from './broker-inproc.js';
import { type BrokerPeer, connectPeers, drainAndClosePeers } from '../lib/ws-peer.js';

export const THROUGHPUT_CONNECTIONS = [1, 10, 100] as const;
export const THROUGHPUT_SLOTS = 64;
export const THROUGHPUT_OUTSTANDING = 256;

export interface ThroughputPoint {
  transport: 'broker' | 'floor' | 'polling' | 'gateway' | 'polling-direct';
  connections: number;
  outstanding_per_connection: number;
  reps: number[];
  jobs_per_sec: number;
  /**
   * Requests at the legacy backend per job (polling: the legacy server itself; gateway: behind
   * it), over the point's whole life: from the servers' start to after the clients stopped and
   * everything settled (tokens given back), so nothing in flight at a window's edge skews it.
   */
  backend_requests_per_job: number | null;
  /** The same, median over the measurement windows (in-flight requests at the edges included). */
  backend_requests_per_job_window: number | null;
}

function point(transport: ThroughputPoint['transport'], connections: number, outstanding: number, w: Window[], lifetime: number | null): ThroughputPoint {
  const rq = w.map((x) => x.backendRequestsPerJob).filter((x): x is number => x !== null);
  return {
    transport,
    connections,
    outstanding_per_connection: outstanding,
    reps: w.map((x) => x.jobsPerSec),
    jobs_per_sec: median(w.map((x) => x.jobsPerSec)),
    backend_requests_per_job: lifetime,
    backend_requests_per_job_window: rq.length > 0 ? median(rq) : null,
  };
}

/** Backend requests per job over the servers' whole life, once everything settled. */
async function lifetimeRatio(host: BenchHost, server: HostedServer, backend: { host: BenchHost; server: HostedServer }): Promise<number | null> {
  await sleep(300);
  const jobs = (await host.counters(server)).jobs;
  const requests = (await backend.host.counters(backend.server)).http_requests;
  return jobs > 0 ? requests / jobs : null;
}

export interface ThroughputResult {
  slots: number;
  points: ThroughputPoint[];
  /** Set when the gateway points could not run (the component failed). */
  gateway_error: string | null;
  /** The broker alone, in one process, no sockets (broker-inproc.ts). */
  inproc: InprocResult | null;
}

/** A gateway (in `host`) in front of a legacy execserver of THROUGHPUT_SLOTS slots (in `backendHost`). */
export async function gatewayPoint(host: BenchHost, backendHost: BenchHost, connections: number, o: BenchOptions): Promise<ThroughputPoint> {
  const like = singleGroup('tp-backend', THROUGHPUT_SLOTS);
  const backend = await backendHost.start('legacy', like);
  try {
    return await brokerPoint(host, 'gateway', gatewayFor(like, [backend.url]), connections, o, 'gateway', { host: backendHost, server: backend });
  } finally {
    await backendHost.stopServer(backend);
  }
}

export interface Window {
  jobsPerSec: number;
  /** HTTP requests at `backend` per job finished at `server` (polling and gateway points). */
  backendRequestsPerJob: number | null;
}

/** jobs/s over windows, from the server's own job count; optionally the backend's requests per job. */
export async function measureJobs(host: BenchHost, server: HostedServer, o: BenchOptions, backend?: { host: BenchHost; server: HostedServer }): Promise<Window[]> {
  await sleep(dur(o, 600, 300));
  const reps: Window[] = [];
  for (let r = 0; r < o.reps; r++) {
    const a = await host.counters(server);
    const ba = backend ? await backend.host.counters(backend.server) : undefined;
    const t0 = performance.now();
    await sleep(dur(o, 1500, 600));
    const b = await host.counters(server);
    const bb = backend ? await backend.host.counters(backend.server) : undefined;
    const jobs = b.jobs - a.jobs;
    reps.push({
      jobsPerSec: (jobs * 1000) / (performance.now() - t0),
      backendRequestsPerJob: ba && bb && jobs > 0 ? (bb.http_requests - ba.http_requests) / jobs : null,
    });
  }
  return reps;
}

/** Peers that keep `outstanding` no-op jobs each in flight until stopped. */
export async function startPumpingPeers(url: string, connections: number, outstanding: number): Promise<{ peers: BrokerPeer[]; stop(): Promise<void> }> {
  let running = true;
  const peers = await connectPeers(url, connections, {
    onDone: (p) => {
      if (running) p.want('noop');
    },
  });
  for (const p of peers) for (let i = 0; i < outstanding; i++) p.want('noop');
  return {
    peers,
    async stop() {
      running = false;
      await drainAndClosePeers(peers);
    },
  };
}

export async function brokerPoint(
  host: BenchHost,
  kind: 'native' | 'floor' | 'gateway',
  config: RawServeConfig,
  connections: number,
  o: BenchOptions,
  transport: ThroughputPoint['transport'],
  backend?: { host: BenchHost; server: HostedServer },
): Promise<ThroughputPoint> {
  const server = await host.start(kind, config);
  const outstanding = Math.max(1, Math.ceil(THROUGHPUT_OUTSTANDING / connections));
  const pumping = await startPumpingPeers(server.url, connections, outstanding);
  const w = await measureJobs(host, server, o, backend);
  await pumping.stop();
  const lifetime = backend ? await lifetimeRatio(host, server, backend) : null;
  const errors = pumping.peers.reduce((n, p) => n + p.errors, 0);
  await host.stopServer(server);
  const pt = point(transport, connections, outstanding, w, lifetime);
  const rq = pt.backend_requests_per_job === null ? '' : `, ${pt.backend_requests_per_job.toFixed(2)} backend requests/job`;
  o.log(`throughput ${transport} ${connections} conn: ${Math.round(pt.jobs_per_sec)} jobs/s${rq}${errors ? ` (${errors} ERROR frames: ${pumping.peers.find((p) => p.errors)?.lastError})` : ''}`);
  return pt;
}

/** `clients` old clients looping acquireAndRun against `addresses` until stopped. */
export function startPollingClients(addresses: string[], clients: number, job: JobSpec = { service: 'noop', commands: [] }): { counters: LegacyCounters; stop(): Promise<void> } {
  const counters = new LegacyCounters();
  const abort = new AbortController();
  setMaxListeners(0, abort.signal);
  const loops = Array.from({ length: clients }, async () => {
    while (!abort.signal.aborted) {
      await acquireAndRun(job, { addresses, connectTimeoutSec: 3600, clock: systemClock, counters, signal: abort.signal });
    }
  });
  return {
    counters,
    async stop() {
      abort.abort();
      await Promise.allSettled(loops);
    },
  };
}

export async function pollingPoint(host: BenchHost, connections: number, o: BenchOptions): Promise<ThroughputPoint> {
  const server = await host.start('legacy', singleGroup('tp-legacy', THROUGHPUT_SLOTS));
  const clients = startPollingClients([server.url], connections);
  const w = await measureJobs(host, server, o, { host, server });
  await clients.stop();
  const lifetime = await lifetimeRatio(host, server, { host, server });
  await host.stopServer(server);
  const pt = point('polling', connections, 1, w, lifetime);
  o.log(`throughput polling ${connections} clients: ${Math.round(pt.jobs_per_sec)} jobs/s, ${pt.backend_requests_per_job?.toFixed(2)} requests/job`);
  return pt;
}

export async function runThroughput(o: BenchOptions): Promise<ThroughputResult> {
  const host = await BenchHost.start();
  const backendHost = await BenchHost.start();
  const points: ThroughputPoint[] = [];
  let gatewayError: string | null = null;
  try {
    for (const c of THROUGHPUT_CONNECTIONS) {
      points.push(await pollingPoint(host, c, o));
      points.push(await brokerPoint(host, 'native', singleGroup('tp-native', THROUGHPUT_SLOTS), c, o, 'broker'));
      points.push(await brokerPoint(host, 'floor', singleGroup('tp-floor', THROUGHPUT_SLOTS), c, o, 'floor'));
      if (gatewayError === null) {
        try {
          points.push(await gatewayPoint(host, backendHost, c, o));
        } catch (e) {
          gatewayError = (e as Error).message.split('\n')[0] ?? String(e);
          o.log(`throughput gateway: ${gatewayError}`);
        }
      }
    }
  } finally {
    await host.close();
    await backendHost.close();
  }
  const inproc = await runBrokerInproc(o);
  return { slots: THROUGHPUT_SLOTS, points, gateway_error: gatewayError, inproc };
}
