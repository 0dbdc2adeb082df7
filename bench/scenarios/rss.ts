/**
 * Process RSS of the execserver with 100,000 parked wants: a child `slotgate serve --config`
 * (one waitgroup of one slot, held by a `sleep` job so nothing is offered), 10 raw ws peers of
 * this process parking 10,000 wants each (the default max_wants_per_connection). VmRSS from
 * /proc/<pid>/status after the peers connected (baseline) and once /status counts every want
 * parked, after a 1 s settle; the child is not asked to collect garbage (it is an operator's
 * process), so the number includes whatever garbage parking left. Reference: a legacy execserver
 * child at rest (it keeps no per-waiting-job state; its cost is the polling requests).
 */
import { request } from 'undici';
import { singleGroup } from '../lib/configs.js';
import { type BenchOptions } from '../lib/options.js';
import { procStatusBytes, startServeChild } from '../lib/serve-child.js';
import { median, sleep } from '../lib/stats.js';
import { closePeers, connectPeers } from '../lib/ws-peer.js';

export const RSS_WANTS = 100_000;
const PEERS = 10;

export interface RssRep {
  baseline_bytes: number;
  loaded_bytes: number;
  hwm_bytes: number;
  parked: number;
  park_ms: number;
}

export interface RssResult {
  wants: number;
  peers: number;
  reps: RssRep[];
  baseline_bytes: number;
  loaded_bytes: number;
  bytes_per_want: number;
  legacy_rest_bytes: number;
}

async function parked(url: string): Promise<number> {
  const st = (await (await request(`${url}/status`)).body.json()) as { waitgroups: Record<string, { parked: number }> };
  return Object.values(st.waitgroups).reduce((n, w) => n + w.parked, 0);
}

async function rep(wants: number): Promise<RssRep> {
  const child = await startServeChild('serve', singleGroup('rss', 1));
  try {
    const peers = await connectPeers(child.url, PEERS);
    const holder = peers[0]!;
    holder.handlers = { onOffer: (p, jobId, token) => p.accept(jobId, token, { service: 'sleep', commands: [{ prog: 'sleep', args: [{ type: 'value', value: '3600' }] }] }) };
    holder.want('sleep');
    await sleep(300);
    const baseline = procStatusBytes(child.pid, 'VmRSS');
    const t0 = performance.now();
    const per = Math.ceil(wants / PEERS);
    for (let i = 0; i < wants; i++) peers[Math.floor(i / per)]!.want('noop', i % 4);
    let n = 0;
    for (let tries = 0; tries < 600 && n < wants; tries++) {
      await sleep(50);
      n = await parked(child.url);
    }
    const parkMs = performance.now() - t0;
    await sleep(1000);
    const loaded = procStatusBytes(child.pid, 'VmRSS');
    const hwm = procStatusBytes(child.pid, 'VmHWM');
    await closePeers(peers);
    return { baseline_bytes: baseline, loaded_bytes: loaded, hwm_bytes: hwm, parked: n, park_ms: parkMs };
  } finally {
    await child.stop();
  }
}

export async function runRss(o: BenchOptions): Promise<RssResult> {
  const reps: RssRep[] = [];
  for (let r = 0; r < o.reps; r++) {
    const x = await rep(RSS_WANTS);
    reps.push(x);
    o.log(`rss: ${x.parked} parked in ${Math.round(x.park_ms)} ms, VmRSS ${(x.baseline_bytes / 2 ** 20).toFixed(1)} -> ${(x.loaded_bytes / 2 ** 20).toFixed(1)} MiB`);
  }
  const legacy = await startServeChild('legacy-execserver', singleGroup('rss-legacy', 1));
  await sleep(300);
  const legacyRest = procStatusBytes(legacy.pid, 'VmRSS');
  await legacy.stop();
  const baseline = median(reps.map((r) => r.baseline_bytes));
  const loaded = median(reps.map((r) => r.loaded_bytes));
  return {
    wants: RSS_WANTS,
    peers: PEERS,
    reps,
    baseline_bytes: baseline,
    loaded_bytes: loaded,
    bytes_per_want: median(reps.map((r) => (r.loaded_bytes - r.baseline_bytes) / r.parked)),
    legacy_rest_bytes: legacyRest,
  };
}
