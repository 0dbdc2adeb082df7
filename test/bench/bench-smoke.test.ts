/**
 * Smoke test of the benchmark harness (bench/): one short run of two scenarios in quick mode (one
 * of them in a fresh process, as run-all runs every scenario), and
 * the report built from them. It checks the SHAPE of the results (fields present, numbers finite,
 * the SVG and the table render), never their values: benchmarks are not tests, and this machine's
 * speed is nobody's assertion.
 */
import t from 'tap';
import { buildSvg, evaluateGoals, printTables, type BenchResults } from '../../bench/run-all.js';
import { runBrokerInproc } from '../../bench/scenarios/broker-inproc.js';
import { brokerPoint } from '../../bench/scenarios/throughput.js';
import { singleGroup } from '../../bench/lib/configs.js';
import { BenchHost } from '../../bench/lib/host-client.js';
import { runInFreshProcess } from '../../bench/lib/scenario-process.js';
import type { ScenarioName } from '../../bench/scenarios/index.js';
import type { StreamingResult } from '../../bench/scenarios/streaming.js';

const o = { quick: true, reps: 1, log: () => undefined };

t.test('throughput point over a real bench host, and the in-process broker loop', async (t) => {
  const host = await BenchHost.start();
  t.teardown(() => host.close());
  const p = await brokerPoint(host, 'native', singleGroup('smoke', 8), 2, o, 'broker');
  t.equal(p.transport, 'broker');
  t.equal(p.connections, 2);
  t.equal(p.reps.length, 1);
  t.ok(Number.isFinite(p.jobs_per_sec) && p.jobs_per_sec >= 0, 'jobs/s is a number');

  const ip = await runBrokerInproc(o);
  for (const k of ['with_metrics', 'without_metrics'] as const) t.ok(Number.isFinite(ip[k].jobs_per_sec), `${k} jobs/s is a number`);
  for (const v of Object.values(ip.micro)) t.ok(Number.isFinite(v), 'micro cost is a number');

  const results: BenchResults = {
    started_at: new Date().toISOString(),
    duration_s: 1,
    quick: true,
    reps: 1,
    machine: { nproc: 2, cpu_model: 'x', node: process.version, kernel: 'x', loadavg_start: [0, 0, 0], loadavg_end: [0, 0, 0] },
    scenarios: { throughput: { slots: 8, points: [p], gateway_error: null, inproc: ip } },
    errors: {},
    goals: [],
  };
  results.goals = evaluateGoals(results.scenarios);
  t.equal(results.goals.length, 1, 'one goal has data: jobs/s');
  t.match(results.goals[0], { goal: String, measured: String, met: Boolean });
  t.match(buildSvg(results), /^<svg [^>]*>[\s\S]*<\/svg>\n$/, 'an SVG document');
  t.match(printTables(results), /throughput: no-op jobs\/s/);
});

t.test('a scenario runs in a fresh process and its result comes back whole; a failure comes back as an error', async (t) => {
  const r = await runInFreshProcess<StreamingResult>('streaming', { quick: true, reps: 1 });
  t.equal(r.bytes, 64 * 2 ** 20, 'quick mode reached the child through its environment');
  t.same(
    r.modes.map((m) => m.mode),
    ['direct', 'relay floor', 'gateway', 'native'],
  );
  for (const m of r.modes) t.equal(m.reps.length, 1, `${m.mode}: one repetition, as asked`);
  await t.rejects(runInFreshProcess('no-such-scenario' as ScenarioName, { quick: true, reps: 1 }), /unknown scenario "no-such-scenario"/);
});
