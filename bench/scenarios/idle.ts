/**
 * Idle cost: requests per second arriving at the execservers while N jobs wait over A addresses
 * and no slot is free (N = 10, 100, 1,000; A = 1, 3), and with nothing waiting.
 *
 * Every execserver runs in the bench host with one slot, held for the whole run by a `sleep`
 * job. Counted at each server over a window after a warm-up, summed over the A servers:
 * - polling: legacy execservers; N old clients in this process (legacy/fylr/polling-client.ts),
 *   each polling GET /token on all A addresses once per second. Counted: every HTTP request the
 *   legacy server answered (its own per-route counters).
 * - broker: native execservers; each waiting job parks one WANT at each of the A execservers
 *   (what the new fylr does), over 4 raw ws peer connections per address. Counted: HTTP requests
 *   plus websocket frames in both directions, ping/pong excluded (the default ping interval of
 *   10 s would add 0.2 control frames/s per connection; they carry no work).
 */
import { request } from 'undici';
import { singleGroup } from '../lib/configs.js';
import { BenchHost, type HostedServer } from '../lib/host-client.js';
import { type BenchOptions, dur } from '../lib/options.js';
import { median, sleep } from '../lib/stats.js';
import { closePeers, connectPeers, type BrokerPeer } from '../lib/ws-peer.js';
import { startPollingClients } from './throughput.js';

export const IDLE_WAITING = [0, 10, 100, 1_000] as const;
export const IDLE_ADDRESSES = [1, 3] as const;
const PEERS_PER_ADDRESS = 4;

export interface IdlePoint {
  transport: 'polling' | 'broker';
  waiting: number;
  addresses: number;
  reps: number[];
  requests_per_sec: number;
  /** polling only: the model N × A × 1/s. */
  expected_per_sec: number;
}

export interface IdleResult {
  window_ms: number;
  points: IdlePoint[];
}

const SLEEP_JOB = (service: string): Record<string, unknown> => ({ service, commands: [{ prog: 'sleep', args: [{ type: 'value', value: '3600' }] }] });

async function work(host: BenchHost, servers: HostedServer[]): Promise<number> {
  let n = 0;
  for (const s of servers) {
    const c = await host.counters(s);
    n += c.http_requests + c.frames_in + c.frames_out;
  }
  return n;
}

async function measure(host: BenchHost, servers: HostedServer[], o: BenchOptions): Promise<number[]> {
  await sleep(dur(o, 1500, 1200));
  const reps: number[] = [];
  for (let r = 0; r < o.reps; r++) {
    const a = await work(host, servers);
    const t0 = performance.now();
    await sleep(dur(o, 2000, 1000));
    const b = await work(host, servers);
    reps.push(((b - a) * 1000) / (performance.now() - t0));
  }
  return reps;
}

async function pollingPoint(host: BenchHost, waiting: number, addresses: number, o: BenchOptions): Promise<IdlePoint> {
  const servers: HostedServer[] = [];
  const holders: Promise<unknown>[] = [];
  for (let a = 0; a < addresses; a++) {
    const s = await host.start('legacy', singleGroup(`idle-legacy-${a}`, 1));
    servers.push(s);
    const t = (await (await request(`${s.url}/token/sleep`)).body.json()) as { token: string };
    const job = encodeURIComponent(JSON.stringify({ ...SLEEP_JOB('sleep'), token: t.token }));
    holders.push(request(`${s.url}/job/sleep?job=${job}`, { method: 'PUT', headersTimeout: 0, bodyTimeout: 0 }).then((r) => r.body.text()).catch(() => undefined));
  }
  const clients = startPollingClients(servers.map((s) => s.url), waiting);
  const reps = await measure(host, servers, o);
  await clients.stop();
  for (const s of servers) await host.stopServer(s);
  await Promise.allSettled(holders);
  const point: IdlePoint = { transport: 'polling', waiting, addresses, reps, requests_per_sec: median(reps), expected_per_sec: waiting * addresses };
  o.log(`idle polling N=${waiting} A=${addresses}: ${point.requests_per_sec.toFixed(1)} req/s (model ${waiting * addresses})`);
  return point;
}

async function brokerPoint(host: BenchHost, waiting: number, addresses: number, o: BenchOptions): Promise<IdlePoint> {
  const servers: HostedServer[] = [];
  const peers: BrokerPeer[][] = [];
  for (let a = 0; a < addresses; a++) {
    const s = await host.start('native', singleGroup(`idle-native-${a}`, 1));
    servers.push(s);
    const ps = await connectPeers(s.url, PEERS_PER_ADDRESS);
    peers.push(ps);
    // The holder: peer 0 runs `sleep 3600` in the only slot.
    const holder = ps[0]!;
    holder.handlers = { onOffer: (p, jobId, token) => p.accept(jobId, token, SLEEP_JOB('sleep')) };
    holder.want('sleep');
  }
  await sleep(100);
  // Then every waiting job parks one want at each execserver, over the other peers.
  for (let j = 0; j < waiting; j++) {
    for (let a = 0; a < addresses; a++) peers[a]![1 + (j % (PEERS_PER_ADDRESS - 1))]!.want('noop', 0, `job-${j}-a${a}`);
  }
  await sleep(100);
  let parked = 0;
  for (const s of servers) parked += (await host.status(s)).parked;
  const reps = await measure(host, servers, o);
  const errors = peers.flat().reduce((n, p) => n + p.errors, 0);
  if (parked !== waiting * addresses || errors > 0) o.log(`idle broker: ${parked} wants parked of ${waiting * addresses}, ${errors} ERROR frames`);
  for (const ps of peers) await closePeers(ps);
  for (const s of servers) await host.stopServer(s);
  const point: IdlePoint = { transport: 'broker', waiting, addresses, reps, requests_per_sec: median(reps), expected_per_sec: 0 };
  o.log(`idle broker N=${waiting} A=${addresses}: ${point.requests_per_sec.toFixed(1)} requests+frames/s`);
  return point;
}

export async function runIdle(o: BenchOptions): Promise<IdleResult> {
  const host = await BenchHost.start();
  const points: IdlePoint[] = [];
  try {
    for (const a of IDLE_ADDRESSES) {
      for (const n of IDLE_WAITING) {
        if (n === 0 && a !== 1) continue;
        points.push(await pollingPoint(host, n, a, o));
        points.push(await brokerPoint(host, n, a, o));
      }
    }
  } finally {
    await host.close();
  }
  return { window_ms: dur(o, 2000, 1000), points };
}
