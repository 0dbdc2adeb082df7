/**
 * Hand-off latency: from a slot freeing at the execserver to the next job's JOB arriving there.
 *
 * Broker (native execserver, and the bare-ws floor): one slot, N parked wants (10, 1,000, 10,000)
 * spread round-robin over 50 peer connections in this process; the execserver runs in the bench
 * host. Each peer answers an OFFER at once with a no-command JOB and, on DONE, parks a new want,
 * so N stays constant. The host's TimingSource holds each slot `holdMs` before the no-op job runs
 * (so hand-offs are separate events), then timestamps: t_free when the job ended and the slot came
 * back (before the next OFFER and before the old job's DONE are sent), t_job when the broker
 * starts the next accepted JOB. hand-off = t_job - t_free, both on the execserver's clock.
 * A "back-to-back" row repeats 10,000 wants with no hold (the slot is never idle).
 *
 * Polling (legacy execserver + the old client, legacy/fylr/polling-client.ts): `lanes`
 * independent waitgroups of one slot, in this process. Per lane, in a loop: a holder takes the
 * slot (GET /token, then PUT of `sleep D`, D uniform in 0.2..1.2 s), one old client starts
 * waiting for the same waitgroup (its 1 s retry loop), t_free = the legacy server's onJobEnd for
 * the holder's job, t_job = the old client sends its PUT (onRunning; the PUT reaches the server
 * well under 1 ms later on loopback). This is what one waiting old client sees.
 */
import { loadavg } from 'node:os';
import { request } from 'undici';
import { parseServeConfig } from '../../src/config/load-config.js';
import { systemClock } from '../../src/clock.js';
import { acquireAndRun } from '../../legacy/fylr/polling-client.js';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { lanes as lanesConfig, singleGroup } from '../lib/configs.js';
import type { GcStats } from '../lib/host.js';
import { BenchHost } from '../lib/host-client.js';
import { type BenchOptions, dur } from '../lib/options.js';
import { schedstat } from '../lib/proc.js';
import { medianSummary, sleep, summarize, type Summary } from '../lib/stats.js';
import { closePeers, connectPeers } from '../lib/ws-peer.js';

export const HANDOFF_CONNECTIONS = 50;
export const HANDOFF_WANTS = [10, 1_000, 10_000] as const;

export interface HandoffSeries {
  transport: 'broker' | 'floor' | 'polling';
  wants: number;
  hold_ms: number;
  reps: Summary[];
  median: Summary;
  /** Samples of 2 ms or more, summed over the repetitions (what makes the p99). */
  over_2ms: number;
  /** GC pauses in the execserver process during the measurement windows, summed. */
  gc?: GcStats;
  /** 1-minute load average at the end of the series. */
  load1: number;
  /**
   * Run-queue delay of the execserver's JS thread (bench host) and of the peers' (this process),
   * ms per second of window: time they were ready to run while the 2 cores ran something else.
   */
  runqueue_wait_ms_per_s?: { execserver: number; peers: number };
}

export interface HandoffResult {
  connections: number;
  broker: HandoffSeries[];
  floor: HandoffSeries[];
  back_to_back: HandoffSeries;
  polling: HandoffSeries & { lanes: number; poll_interval_ms: number };
}

async function brokerSeries(host: BenchHost, kind: 'native' | 'floor', wants: number, holdMs: number, o: BenchOptions): Promise<HandoffSeries> {
  const server = await host.start(kind, singleGroup(`handoff-${kind}`, 1), holdMs);
  const peers = await connectPeers(server.url, HANDOFF_CONNECTIONS, { onDone: (p) => void p.want('noop') });
  for (let i = 0; i < wants; i++) peers[i % peers.length]!.want('noop');
  await sleep(dur(o, 700, 300));
  const reps: Summary[] = [];
  let over2 = 0;
  const gc: GcStats = { count: 0, total_ms: 0, max_ms: 0, over_1ms: 0 };
  let waitHost = 0;
  let waitSelf = 0;
  let windowMs = 0;
  for (let r = 0; r < o.reps; r++) {
    await host.handoffs(server, true);
    await host.gc(true);
    const h0 = schedstat(host.pid);
    const s0 = schedstat(process.pid);
    const t0 = performance.now();
    await sleep(dur(o, 1500, 500));
    const samples = await host.handoffs(server, false);
    windowMs += performance.now() - t0;
    waitHost += schedstat(host.pid).wait_ms - h0.wait_ms;
    waitSelf += schedstat(process.pid).wait_ms - s0.wait_ms;
    const g = await host.gc(true);
    gc.count += g.count;
    gc.total_ms += g.total_ms;
    gc.max_ms = Math.max(gc.max_ms, g.max_ms);
    gc.over_1ms += g.over_1ms;
    over2 += samples.filter((x) => x >= 2).length;
    reps.push(summarize(samples));
  }
  await closePeers(peers);
  await host.stopServer(server);
  const series: HandoffSeries = { transport: kind === 'native' ? 'broker' : 'floor', wants, hold_ms: holdMs, reps, median: medianSummary(reps), over_2ms: over2, gc, load1: loadavg()[0] as number,
    runqueue_wait_ms_per_s: { execserver: (1000 * waitHost) / windowMs, peers: (1000 * waitSelf) / windowMs },
  };
  o.log(`hand-off ${series.transport} ${wants} wants hold ${holdMs} ms: p50 ${series.median.p50.toFixed(3)} ms p99 ${series.median.p99.toFixed(3)} ms (${series.median.n} samples, ${over2} >= 2 ms; host GC ${gc.count} pauses, ${gc.over_1ms} >= 1 ms, max ${gc.max_ms.toFixed(1)} ms; run-queue wait ${series.runqueue_wait_ms_per_s?.execserver.toFixed(0)} ms/s execserver, ${series.runqueue_wait_ms_per_s?.peers.toFixed(0)} ms/s peers; load ${series.load1.toFixed(1)})`);
  return series;
}

/** One lane of the polling measurement; pushes samples until `until`. */
async function pollingLane(url: string, lane: number, until: number, samples: number[], ends: Map<number, number>, counters: LegacyCounters): Promise<void> {
  const rnd = (): number => Math.random();
  while (performance.now() < until) {
    // The holder takes the free slot.
    const t = await request(`${url}/token/sleep${lane}`);
    const body = (await t.body.json()) as { token?: string };
    if (t.statusCode !== 200 || body.token === undefined) {
      await sleep(20);
      continue;
    }
    const seconds = (0.2 + rnd()).toFixed(3);
    const holder = { service: `sleep${lane}`, token: body.token, commands: [{ prog: 'sleep', args: [{ type: 'value', value: seconds }] }] };
    ends.delete(lane);
    const held = request(`${url}/job/sleep${lane}?job=${encodeURIComponent(JSON.stringify(holder))}`, { method: 'PUT', headersTimeout: 0, bodyTimeout: 0 }).then((r) => r.body.text());
    // One old client waits for the same waitgroup, in its 1 s retry loop.
    let tJob = Number.NaN;
    const res = await acquireAndRun(
      { service: `noop${lane}`, commands: [] },
      { addresses: [url], connectTimeoutSec: 30, clock: systemClock, counters, onRunning: () => (tJob = performance.now()) },
    );
    await held;
    const tFree = ends.get(lane);
    if (res.kind === 'done' && tFree !== undefined && tJob >= tFree) samples.push(tJob - tFree);
  }
}

async function pollingSeries(o: BenchOptions): Promise<HandoffResult['polling']> {
  const laneCount = 16;
  const { startLegacyExecserver } = await import('../../legacy/execserver/legacy-execserver.js');
  const server = await startLegacyExecserver(parseServeConfig(lanesConfig('legacy-handoff', laneCount)), { log: false });
  const ends = new Map<number, number>();
  server.onJobEnd((e) => {
    if (e.service.startsWith('sleep')) ends.set(Number(e.service.slice(5)), performance.now());
  });
  const counters = new LegacyCounters();
  const reps: Summary[] = [];
  let over2 = 0;
  try {
    for (let r = 0; r < o.reps; r++) {
      const samples: number[] = [];
      const until = performance.now() + dur(o, 4000, 2500);
      await Promise.all(Array.from({ length: laneCount }, (_, i) => pollingLane(server.url, i, until, samples, ends, counters)));
      reps.push(summarize(samples));
      over2 += samples.filter((x) => x >= 2).length;
    }
  } finally {
    await server.close();
  }
  const median = medianSummary(reps);
  o.log(`hand-off polling (1 waiting client per slot, ${laneCount} lanes): mean ${median.mean.toFixed(1)} ms p50 ${median.p50.toFixed(1)} ms p99 ${median.p99.toFixed(1)} ms (${median.n} samples)`);
  return { transport: 'polling', wants: 1, hold_ms: 0, reps, median, over_2ms: over2, load1: loadavg()[0] as number, lanes: laneCount, poll_interval_ms: 1000 };
}

export async function runHandoff(o: BenchOptions): Promise<HandoffResult> {
  const holdMs = 1;
  const host = await BenchHost.start();
  try {
    const broker: HandoffSeries[] = [];
    const floor: HandoffSeries[] = [];
    for (const n of HANDOFF_WANTS) broker.push(await brokerSeries(host, 'native', n, holdMs, o));
    const backToBack = await brokerSeries(host, 'native', 10_000, 0, o);
    for (const n of HANDOFF_WANTS) floor.push(await brokerSeries(host, 'floor', n, holdMs, o));
    const polling = await pollingSeries(o);
    return { connections: HANDOFF_CONNECTIONS, broker, floor, back_to_back: backToBack, polling };
  } finally {
    await host.close();
  }
}
