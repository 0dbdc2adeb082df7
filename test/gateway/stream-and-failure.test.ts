/**
 * Streams and failures through the gateway: 1 GiB in body mode in bounded memory (the in-pipe,
 * the gateway, the old execserver running `cat`, the out-pipe: all in this process, so the RSS
 * bound covers every hop), and a backend killed mid-job (DONE with backend_failed, the other
 * backend keeps serving).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import type { GatewaySlotSource } from '../../src/gateway/gateway-slot-source.js';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { startPipeServer } from '../helpers/pipe-server.js';
import { startCli } from '../helpers/spawn-cli.js';
import { eventually } from '../helpers/wait.js';
import { SECRET, SERVICES, startBackend, startGateway, type Teardown, tokenRequests } from './gateway-world.js';

const GiB = 1 << 30;
const MiB = 1 << 20;
/** SLOTGATE_STREAM_BYTES shortens the stream for a quick local run; CI streams 1 GiB. */
const STREAM_BYTES = Number(process.env.SLOTGATE_STREAM_BYTES ?? GiB);

/** A `slotgate serve` configuration for a gateway in front of `backends`. */
function gatewaySpecYaml(backends: string[]): Record<string, unknown> {
  return { listen: '127.0.0.1:0', name: 'gw', waitgroups: { w: 1 }, services: SERVICES, backends, gateway: { secret: SECRET } };
}

/** A memory figure of /proc/PID/status, in KiB. */
function rssKiB(pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const m = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no ${field} for ${pid}`);
  return Number(m[1]);
}

/** Resets the process's peak RSS (VmHWM) to its current RSS (Linux: clear_refs 5); best effort. */
function resetPeak(pid: number): void {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, '5');
  } catch {
    // Without the reset the sampled VmRSS still bounds the peak.
  }
}

async function peer(t: Teardown, url: string): Promise<BrokerPeer> {
  const p = await BrokerPeer.connect(url, { timeoutMs: 120_000 });
  t.teardown(() => p.close());
  return p;
}

t.test('1 GiB body-mode stream through the gateway in bounded memory', async (t) => {
  // The gateway runs as `slotgate serve` in its own process, so its memory is measured alone
  // (and serve.ts's gateway wiring is exercised); the old execserver and the pipes run here.
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const dir = await mkdtemp(join(tmpdir(), 'slotgate-gw-'));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  const configFile = join(dir, 'gateway.yml');
  // JSON is YAML.
  await writeFile(configFile, JSON.stringify({ ...gatewaySpecYaml([a.url]) }));
  const gw = await startCli(['serve', '--config', configFile], { t });
  const pid = gw.child.pid as number;
  t.match(gw.lines[0], /"kind":"gateway"/, 'serve with backends: is a gateway');
  const pipes = await startPipeServer();
  t.teardown(() => pipes.close());
  const p = await peer(t, gw.url);

  // Warm up every path once, so the baseline holds the buffers a stream needs at all.
  const warm = await p.run('warm', jobs.cat({ in: pipes.source(16 * MiB).url, out: pipes.sink().url }));
  t.equal(warm.receipt.ok, true, JSON.stringify(warm.receipt.error));

  const baseline = rssKiB(pid, 'VmRSS');
  resetPeak(pid);
  let peak = baseline;
  const sampler = setInterval(() => {
    peak = Math.max(peak, rssKiB(pid, 'VmRSS'));
  }, 20);
  t.teardown(() => clearInterval(sampler));
  const src = pipes.source(STREAM_BYTES);
  const sink = pipes.sink();
  const started = Date.now();
  const done = await p.run('big', jobs.cat({ in: src.url, out: sink.url }));
  const ms = Date.now() - started;
  clearInterval(sampler);
  peak = Math.max(peak, rssKiB(pid, 'VmRSS'), rssKiB(pid, 'VmHWM'));

  t.equal(done.receipt.ok, true, JSON.stringify(done.receipt.error));
  const [sent, got] = await Promise.all([src.served, sink.received]);
  t.equal(sent.complete, true);
  t.equal(got.complete, true);
  t.equal(got.bytes, STREAM_BYTES);
  t.equal(got.sha256, sent.sha256, 'every byte arrived, in order');
  t.equal(done.receipt.output_bytes, STREAM_BYTES);
  const growthMiB = (peak - baseline) / 1024;
  t.comment(
    `${(STREAM_BYTES / MiB).toFixed(0)} MiB in ${ms} ms (${(STREAM_BYTES / MiB / (ms / 1000)).toFixed(0)} MiB/s); ` +
      `gateway RSS ${(baseline / 1024).toFixed(0)} MiB before, peak ${(peak / 1024).toFixed(0)} MiB (+${growthMiB.toFixed(1)} MiB)`,
  );
  t.ok(growthMiB < 100, `the gateway's RSS grew ${growthMiB.toFixed(1)} MiB (< 100 MiB) for ${(STREAM_BYTES / MiB).toFixed(0)} MiB streamed`);
});

t.test('a backend killed mid-job gives DONE with backend_failed; the other backend keeps serving', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const b = await startBackend(t, { waitgroups: { w: 1 } });
  const gw = await startGateway(t, { backends: [a.url, b.url], waitgroups: { w: 1 }, gateway: { poll_interval_ms: 50 } });
  const p = await peer(t, gw.url);
  await p.acquire('long', jobs.sleep(30));
  await eventually(() => (a.counters.running.w ?? 0) + (b.counters.running.w ?? 0) === 1, { what: 'the job to run on a backend' });
  const [victim, survivor] = a.counters.running.w === 1 ? [a, b] : [b, a];
  const victimUrl = victim.url;
  await victim.close();

  const done = await p.next('DONE', 'long');
  t.equal(done.receipt.ok, false);
  t.equal(done.receipt.error?.code, 'backend_failed');
  t.match(done.receipt.error?.message, victimUrl.replace(/^http:\/\//, ''), 'the message names the backend');

  // The survivor serves every following job; the dead backend is asked at the poll rate at most.
  for (let i = 0; i < 5; i++) {
    const d = await p.run(`after${i}`, jobs.echo(`after ${i}`));
    t.equal(d.receipt.ok, true, `job ${i} after the kill`);
  }
  t.equal(survivor.counters.jobs.echo, 5);
  const status = (gw.server.source as GatewaySlotSource).status();
  const dead = status.backends.find((s) => s.url === victimUrl);
  t.equal(dead?.jobs_failed, 1);
  t.match(dead?.last_error, /backend/);
  t.ok(tokenRequests(survivor) >= 5);
});

t.test('a backend that is down when the gateway starts: jobs run on the other one, the dead one is polled, not hammered', async (t) => {
  const a = await startBackend(t, { waitgroups: { w: 1 } });
  const dead = await startBackend(t, { waitgroups: { w: 1 } });
  const deadUrl = dead.url;
  await dead.close();
  const gw = await startGateway(t, { backends: [deadUrl, a.url], waitgroups: { w: 1 }, gateway: { poll_interval_ms: 60_000 } });
  const p = await peer(t, gw.url);
  for (let i = 0; i < 5; i++) {
    const d = await p.run(`j${i}`, jobs.echo(`${i}`));
    t.equal(d.receipt.ok, true);
  }
  const status = (gw.server.source as GatewaySlotSource).status();
  const down = status.backends.find((s) => s.url === deadUrl);
  t.equal(down?.token_requests.error, 1, 'asked once, then paused for the poll interval');
  t.same(a.counters.jobs, { echo: 5 });
});
