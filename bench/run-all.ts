/**
 * `npm run bench`: every scenario, old and new side by side on the same workload in one run,
 * several repetitions each (medians), then a table on stdout, bench/results.json and
 * bench/results.svg. See bench/README.md for what each number means.
 *
 *   npm run bench                          the full run (< 10 min on 2 cores)
 *   BENCH_QUICK=1 npm run bench            a fast smoke run (1 repetition, short windows, 64 MiB)
 *   BENCH_ONLY=handoff,idle npm run bench  a subset (want-book, rss, handoff, throughput, idle,
 *                                          contention, streaming)
 *   BENCH_REPS=5, BENCH_OUT=DIR            repetitions; where results.json/.svg go (default bench/)
 *   BENCH_HOST_EXEC_ARGV="--cpu-prof --cpu-prof-dir=/tmp/prof"   profile the server processes
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { type BenchOptions, benchOptions } from './lib/options.js';
import { ratio } from './lib/stats.js';
import { runInFreshProcess } from './lib/scenario-process.js';
import { renderSvg, type Panel } from './lib/svg.js';
import { SCENARIOS, type ScenarioName } from './scenarios/index.js';
import { ms, num, table, times } from './lib/table.js';
import type { ContentionResult } from './scenarios/gateway-requests.js';
import type { HandoffResult } from './scenarios/handoff.js';
import type { IdleResult } from './scenarios/idle.js';
import type { RssResult } from './scenarios/rss.js';
import type { StreamingResult } from './scenarios/streaming.js';
import type { ThroughputResult } from './scenarios/throughput.js';
import type { WantBookScenarioResult } from './scenarios/want-book.js';

export { SCENARIOS, type ScenarioName } from './scenarios/index.js';

export interface Machine {
  nproc: number;
  cpu_model: string;
  node: string;
  kernel: string;
  loadavg_start: number[];
  loadavg_end: number[];
}

export interface Goal {
  goal: string;
  measured: string;
  met: boolean | null;
}

export interface BenchResults {
  started_at: string;
  duration_s: number;
  quick: boolean;
  reps: number;
  machine: Machine;
  scenarios: {
    want_book?: WantBookScenarioResult;
    rss?: RssResult;
    handoff?: HandoffResult;
    throughput?: ThroughputResult;
    idle?: IdleResult;
    contention?: ContentionResult;
    streaming?: StreamingResult;
  };
  errors: Record<string, string>;
  goals: Goal[];
}

function cpuModel(): string {
  try {
    const m = /^model name\s*:\s*(.+)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'));
    if (m) return (m[1] as string).trim();
  } catch {
    /* not Linux */
  }
  return cpus()[0]?.model ?? 'unknown';
}

function loads(): number[] {
  return loadavg().map((x) => Math.round(x * 100) / 100);
}

// ------------------------------------------------------------------ goals

export function evaluateGoals(s: BenchResults['scenarios']): Goal[] {
  const goals: Goal[] = [];
  const idle = s.idle;
  if (idle) {
    const broker = idle.points.filter((p) => p.transport === 'broker');
    const worst = Math.max(...broker.map((p) => p.requests_per_sec));
    goals.push({ goal: '0 requests/s when idle (broker, every N and A)', measured: `max ${num(worst, 2)} requests+frames/s over ${broker.length} cases`, met: worst === 0 });
  }
  const h = s.handoff;
  if (h) {
    const at10k = h.broker.find((x) => x.wants === 10_000);
    if (at10k) {
      const m = at10k.median;
      goals.push({ goal: 'hand-off p50 < 0.5 ms and p99 < 2 ms at 10k parked wants', measured: `p50 ${ms(m.p50)}, p99 ${ms(m.p99)}`, met: m.p50 < 0.5 && m.p99 < 2 });
      const pm = h.polling.median;
      const rMean = ratio(pm.mean, m.mean);
      const rP50 = ratio(pm.p50, m.p50);
      goals.push({
        goal: '>= 300x lower hand-off latency than polling',
        measured: `mean ${ms(pm.mean)} vs ${ms(m.mean)} = ${times(rMean)}; p50 ${ms(pm.p50)} vs ${ms(m.p50)} = ${times(rP50)}`,
        met: Math.min(rMean, rP50) >= 300,
      });
    }
  }
  const t = s.throughput;
  if (t) {
    const broker = t.points.filter((p) => p.transport === 'broker');
    if (broker.length > 0) {
      const best = broker.reduce((a, b) => (b.jobs_per_sec > a.jobs_per_sec ? b : a));
      goals.push({
        goal: '>= 20,000 no-op jobs/s',
        measured: `${broker.map((p) => `${num(p.jobs_per_sec)} (${p.connections} conn)`).join(', ')}; best ${num(best.jobs_per_sec)}`,
        met: best.jobs_per_sec >= 20_000,
      });
    }
  }
  const gwRq: number[] = [];
  for (const p of t?.points ?? []) if (p.transport === 'gateway' && p.backend_requests_per_job !== null) gwRq.push(p.backend_requests_per_job);
  for (const p of s.contention?.points ?? []) if (p.transport === 'gateway') gwRq.push(p.requests_per_job);
  if (gwRq.length > 0) {
    const worst = Math.max(...gwRq);
    goals.push({ goal: '<= 2 backend requests per job through the gateway', measured: `max ${num(worst, 2)} over ${gwRq.length} cases`, met: worst <= 2.005 });
  }
  const st = s.streaming;
  if (st) {
    goals.push({
      goal: 'gateway streaming >= 80% of direct',
      measured: `${num(st.modes.find((m) => m.mode === 'gateway')?.mb_per_sec ?? Number.NaN)} vs ${num(st.modes.find((m) => m.mode === 'direct')?.mb_per_sec ?? Number.NaN)} MB/s = ${num(100 * st.gateway_vs_direct, 0)} % (${st.size_note}; a bare TCP relay in its place: ${num(100 * st.relay_vs_direct, 0)} %)`,
      met: Number.isNaN(st.gateway_vs_direct) ? null : st.gateway_vs_direct >= 0.8,
    });
  }
  const per: string[] = [];
  let worstPer = Number.NEGATIVE_INFINITY;
  if (s.want_book) {
    per.push(`want-book heap ${num(s.want_book.median.totalBytesPerWant)} B`);
    worstPer = Math.max(worstPer, s.want_book.median.totalBytesPerWant);
  }
  if (s.rss) {
    per.push(`execserver RSS ${num(s.rss.bytes_per_want)} B`);
    worstPer = Math.max(worstPer, s.rss.bytes_per_want);
  }
  if (per.length > 0) goals.push({ goal: '<= 1 KiB per parked want', measured: per.join('; '), met: worstPer <= 1024 });
  return goals;
}

// ------------------------------------------------------------------ report

export function printTables(r: BenchResults): string {
  const out: string[] = [];
  const m = r.machine;
  out.push(
    `slotgate bench ${r.quick ? '(QUICK: short windows, 1 repetition; smoke only)' : ''}\n` +
      `machine: ${m.nproc} cores, ${m.cpu_model}, Node ${m.node}, Linux ${m.kernel}; load average ${m.loadavg_start.join(' ')} at start, ${m.loadavg_end.join(' ')} at the end; ${r.reps} repetitions, medians; ${r.duration_s.toFixed(0)} s`,
  );
  const s = r.scenarios;
  if (s.handoff) {
    const h = s.handoff;
    const pm = h.polling.median;
    const rows = h.broker.map((b) => {
      const f = h.floor.find((x) => x.wants === b.wants);
      return [
        `${num(b.wants)} wants / ${h.connections} conn`,
        ms(pm.p50), ms(pm.p99),
        ms(b.median.p50), ms(b.median.p99), ms(b.median.mean),
        f ? ms(f.median.p50) : 'n/a', f ? ms(f.median.p99) : 'n/a',
        times(ratio(pm.p50, b.median.p50)), times(ratio(pm.mean, b.median.mean)),
      ];
    });
    const bb = h.back_to_back.median;
    rows.push([`${num(h.back_to_back.wants)} wants, back-to-back`, '', '', ms(bb.p50), ms(bb.p99), ms(bb.mean), '', '', '', '']);
    out.push(table(`hand-off latency: slot free -> next JOB at the execserver (polling: 1 waiting old client per slot, ${pm.n} samples, mean ${ms(pm.mean)}; broker: 1 slot, hold ${h.broker[0]?.hold_ms ?? 1} ms)`,
      ['case', 'poll p50', 'poll p99', 'broker p50', 'broker p99', 'broker mean', 'floor p50', 'floor p99', 'p50 ratio', 'mean ratio'], rows));
  }
  if (s.throughput) {
    const t = s.throughput;
    const conns = [...new Set(t.points.map((p) => p.connections))];
    const get = (tr: string, c: number) => t.points.find((p) => p.transport === tr && p.connections === c);
    out.push(table(`throughput: no-op jobs/s end to end, ${t.slots} slots${t.gateway_error ? ` (gateway: ${t.gateway_error})` : ''}`,
      ['connections', 'polling', 'broker', 'floor', 'gateway', 'broker/polling', 'broker/floor', 'gw/polling', 'backend req/job polling', 'backend req/job gw'],
      conns.map((c) => {
        const po = get('polling', c), br = get('broker', c), fl = get('floor', c), gw = get('gateway', c);
        return [String(c), num(po?.jobs_per_sec ?? NaN), num(br?.jobs_per_sec ?? NaN), num(fl?.jobs_per_sec ?? NaN), num(gw?.jobs_per_sec ?? NaN),
          times(ratio(br?.jobs_per_sec ?? NaN, po?.jobs_per_sec ?? NaN)), `${num(100 * (br?.jobs_per_sec ?? NaN) / (fl?.jobs_per_sec ?? NaN))} %`,
          times(ratio(gw?.jobs_per_sec ?? NaN, po?.jobs_per_sec ?? NaN)), num(po?.backend_requests_per_job ?? null, 2), num(gw?.backend_requests_per_job ?? null, 2)];
      })));
  }
  if (s.throughput?.inproc) {
    const ip = s.throughput.inproc;
    out.push(table('the broker alone, in-process, no sockets (64 slots, 256 outstanding)', ['measure', 'value'], [
      ['jobs/s with Prometheus metrics (as served)', `${num(ip.with_metrics.jobs_per_sec)} (${num(ip.with_metrics.us_per_job, 1)} µs/job)`],
      ['jobs/s with no observer', `${num(ip.without_metrics.jobs_per_sec)} (${num(ip.without_metrics.us_per_job, 1)} µs/job)`],
      ['newOfferToken() (randomBytes(16)) / pooled randomness', `${num(ip.micro.offer_token_ns)} / ${num(ip.micro.pooled_token_ns)} ns`],
      ['HELLO + JSON signature (helloChanged on every freed slot)', `${num(ip.micro.hello_signature_ns)} ns`],
      ['new AbortController() per job', `${num(ip.micro.abort_controller_ns)} ns`],
    ]));
  }
  if (s.idle) {
    const i = s.idle;
    const keys = [...new Set(i.points.map((p) => `${p.waiting}|${p.addresses}`))];
    out.push(table(`idle cost: requests/s at the execservers, no free slot (broker: HTTP requests + ws frames, ping/pong excluded; window ${i.window_ms} ms)`,
      ['waiting jobs x addresses', 'polling', 'model N×A', 'broker', 'ratio'],
      keys.map((k) => {
        const [n, a] = k.split('|').map(Number) as [number, number];
        const po = i.points.find((p) => p.transport === 'polling' && p.waiting === n && p.addresses === a);
        const br = i.points.find((p) => p.transport === 'broker' && p.waiting === n && p.addresses === a);
        return [`${n} x ${a}`, num(po?.requests_per_sec ?? NaN, 1), num(po?.expected_per_sec ?? NaN), num(br?.requests_per_sec ?? NaN, 1), times(ratio(po?.requests_per_sec ?? NaN, br?.requests_per_sec ?? NaN))];
      })));
  }
  if (s.contention) {
    const c = s.contention;
    out.push(table(`backend requests per job under contention (legacy backend, ${c.slots} slots, jobs of ${c.job_sec} s, ${c.waiting} waiting)`,
      ['transport', 'backend requests/job', 'jobs/s'], c.points.map((p) => [p.transport === 'polling' ? 'old fylr polling' : 'gateway (broker peers)', num(p.requests_per_job, 2), num(p.jobs_per_sec, 1)])));
  }
  if (s.streaming) {
    const st = s.streaming;
    const direct = st.modes.find((x) => x.mode === 'direct')?.mb_per_sec ?? NaN;
    out.push(table(`body-mode streaming through cat, ${num(st.bytes / 2 ** 20)} MiB (${st.size_note}); CPU s/GB: all processes of the path`, ['mode', 'MB/s', 'of direct', 'CPU s/GB', 'fylr side', 'backend', 'front', 'error'],
      st.modes.map((x) => [x.mode, num(x.mb_per_sec), `${num((100 * x.mb_per_sec) / direct)} %`, num(x.cpu_s_per_gb, 2),
        num(x.cpu_s_per_gb_by_process.fylr_side, 2), num(x.cpu_s_per_gb_by_process.backend_host, 2), num(x.cpu_s_per_gb_by_process.front_host, 2), x.error ?? ''])));
  }
  if (s.rss) {
    const x = s.rss;
    out.push(table(`execserver process RSS (slotgate serve child), ${num(x.wants)} parked wants over ${x.peers} connections`, ['measure', 'value'], [
      ['VmRSS, peers connected, no wants', `${num(x.baseline_bytes / 2 ** 20, 1)} MiB`],
      [`VmRSS, ${num(x.wants)} wants parked`, `${num(x.loaded_bytes / 2 ** 20, 1)} MiB`],
      ['per parked want', `${num(x.bytes_per_want)} B`],
      ['legacy execserver at rest (reference)', `${num(x.legacy_rest_bytes / 2 ** 20, 1)} MiB`],
    ]));
  }
  if (s.want_book) {
    const w = s.want_book.median;
    out.push(table(`want-book (${num(w.wants)} wants, ${w.connections} connections; bench/want-book.bench.ts)`, ['measure', 'value'], [
      ['park', `${num(w.parkPerSec)} /s`], ['remove (random order)', `${num(w.removePerSec)} /s`], ['next(wg) grants', `${num(w.grantsPerSec)} /s`],
      ['next(wg, service) grants', `${num(w.serviceGrantsPerSec)} /s`], ['position() mean / p99', `${num(w.positionMeanUs, 2)} / ${num(w.positionP99Us, 2)} µs`],
      ['heap per parked want (book only / with Want)', `${num(w.bookBytesPerWant)} / ${num(w.totalBytesPerWant)} B (${w.memoryMethod})`],
    ]));
  }
  out.push(table('goals', ['goal', 'measured', 'verdict'], r.goals.map((g) => [g.goal, g.measured, g.met === null ? 'n/a' : g.met ? 'met' : 'MISSED'])));
  for (const [k, v] of Object.entries(r.errors)) out.push(`\nscenario ${k} FAILED: ${v}`);
  return out.join('\n');
}

const OLD = '#d62728';
const NEW = '#1f77b4';
const FLOOR = '#9aa7b1';
const GW = '#2ca02c';

export function buildSvg(r: BenchResults): string {
  const panels: Panel[] = [];
  const s = r.scenarios;
  if (s.handoff) {
    const h = s.handoff;
    panels.push({
      title: 'Hand-off latency, slot free -> next JOB at the execserver (p50 and p99)',
      unit: 'ms',
      log: true,
      series: [
        { name: 'polling p50', color: OLD }, { name: 'polling p99', color: '#f4a3a3' },
        { name: 'broker p50', color: NEW }, { name: 'broker p99', color: '#9ecae9' },
        { name: 'bare-ws floor p50', color: FLOOR },
      ],
      groups: h.broker.map((b) => ({
        label: `${b.wants.toLocaleString('en-US')} parked`,
        values: [h.polling.median.p50, h.polling.median.p99, b.median.p50, b.median.p99, h.floor.find((f) => f.wants === b.wants)?.median.p50 ?? NaN],
      })),
    });
  }
  if (s.idle) {
    const i = s.idle;
    const keys = [...new Set(i.points.map((p) => `${p.waiting}|${p.addresses}`))];
    panels.push({
      title: 'Idle cost: requests/s at the execservers while jobs wait, no free slot',
      unit: 'requests/s',
      log: true,
      series: [{ name: 'polling (old)', color: OLD }, { name: 'broker (new): 0 = nothing at all', color: NEW }],
      groups: keys.map((k) => {
        const [n, a] = k.split('|').map(Number) as [number, number];
        return {
          label: `N=${n}, A=${a}`,
          values: ['polling', 'broker'].map((tr) => i.points.find((p) => p.transport === tr && p.waiting === n && p.addresses === a)?.requests_per_sec ?? NaN),
        };
      }),
    });
  }
  if (s.throughput) {
    const t = s.throughput;
    const conns = [...new Set(t.points.map((p) => p.connections))];
    panels.push({
      title: `No-op jobs/s end to end (${t.slots} slots)`,
      unit: 'jobs/s',
      log: true,
      series: [{ name: 'polling (old)', color: OLD }, { name: 'broker', color: NEW }, { name: 'bare-ws floor', color: FLOOR }, { name: 'gateway -> legacy', color: GW }],
      groups: conns.map((c) => ({
        label: `${c} connection${c === 1 ? '' : 's'}`,
        values: ['polling', 'broker', 'floor', 'gateway'].map((tr) => t.points.find((p) => p.transport === tr && p.connections === c)?.jobs_per_sec ?? NaN),
      })),
    });
  }
  const m = r.machine;
  return renderSvg(
    'slotgate: old polling vs slot broker, measured side by side',
    `${r.started_at.slice(0, 16)}Z · ${m.nproc} cores ${m.cpu_model} · Node ${m.node} · load ${m.loadavg_start.join(' ')} -> ${m.loadavg_end.join(' ')}${r.quick ? ' · QUICK' : ''}`,
    panels,
  );
}

// ------------------------------------------------------------------ main

export async function runAll(o: BenchOptions, only: ReadonlySet<ScenarioName> = new Set(SCENARIOS)): Promise<BenchResults> {
  const t0 = performance.now();
  const results: BenchResults = {
    started_at: new Date().toISOString(),
    duration_s: 0,
    quick: o.quick,
    reps: o.reps,
    machine: { nproc: cpus().length, cpu_model: cpuModel(), node: process.version, kernel: release(), loadavg_start: loads(), loadavg_end: [] },
    scenarios: {},
    errors: {},
    goals: [],
  };
  const step = async <T>(name: ScenarioName, fn: () => Promise<T> | T, set: (v: T) => void): Promise<void> => {
    if (!only.has(name)) return;
    const s = performance.now();
    process.stderr.write(`${name} ...\n`);
    try {
      set(await fn());
    } catch (e) {
      results.errors[name] = (e as Error)?.stack ?? String(e);
      process.stderr.write(`  ${name} FAILED: ${(e as Error)?.message}\n`);
    }
    process.stderr.write(`  ${name}: ${((performance.now() - s) / 1000).toFixed(1)} s (load ${loads().join(' ')})\n`);
  };
  // Each scenario in a fresh process of its own (bench/lib/scenario-process.ts).
  const fresh = <T>(name: ScenarioName): Promise<T> => runInFreshProcess<T>(name, o);
  await step('want-book', () => fresh<WantBookScenarioResult>('want-book'), (v) => (results.scenarios.want_book = v));
  await step('rss', () => fresh<RssResult>('rss'), (v) => (results.scenarios.rss = v));
  await step('handoff', () => fresh<HandoffResult>('handoff'), (v) => (results.scenarios.handoff = v));
  await step('throughput', () => fresh<ThroughputResult>('throughput'), (v) => (results.scenarios.throughput = v));
  await step('idle', () => fresh<IdleResult>('idle'), (v) => (results.scenarios.idle = v));
  await step('contention', () => fresh<ContentionResult>('contention'), (v) => (results.scenarios.contention = v));
  await step('streaming', () => fresh<StreamingResult>('streaming'), (v) => (results.scenarios.streaming = v));
  results.machine.loadavg_end = loads();
  results.duration_s = (performance.now() - t0) / 1000;
  results.goals = evaluateGoals(results.scenarios);
  return results;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const o = benchOptions();
  const onlyEnv = process.env.BENCH_ONLY;
  const only = new Set<ScenarioName>(onlyEnv ? (onlyEnv.split(',').map((x) => x.trim()) as ScenarioName[]) : SCENARIOS);
  for (const n of only) if (!SCENARIOS.includes(n)) throw new Error(`BENCH_ONLY: unknown scenario ${n} (have ${SCENARIOS.join(', ')})`);
  const results = await runAll(o, only);
  const dir = process.env.BENCH_OUT ?? fileURLToPath(new URL('.', import.meta.url));
  console.log(printTables(results));
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'results.json'), `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(join(dir, 'results.svg'), buildSvg(results));
  console.log(`\nwrote ${join(dir, 'results.json')} and ${join(dir, 'results.svg')}`);
  // Sockets of closed servers may linger in keep-alive pools; nothing is left to wait for.
  process.exit(Object.keys(results.errors).length > 0 ? 1 : 0);
}
