/**
 * Body-mode streaming throughput: one `cat` job (stdin and stdout as bodies) moving SIZE bytes
 * through, three ways, each in its own bench host process for the servers:
 * - direct: the old client's PUT /job to a legacy execserver (request body = stdin, response
 *   body = stdout; legacy/fylr/polling-client.ts acquireAndRun);
 * - relay floor: the same PUT through a bare TCP relay (bench/lib/relay-floor.ts) in the front
 *   host, where the gateway sits: the floor for any process in the path, since every byte is
 *   read and written once more each way and nothing else is done;
 * - gateway: the new fylr client (src/fylr/exec-client.ts ExecClient + PipeServer on a listener
 *   in this process) over /broker to a gateway in front of that legacy execserver: the gateway
 *   GETs the in-pipe into its PUT to the backend and PUTs the backend's answer to the out-pipe;
 * - native: the same new client against a native execserver: it GETs the in-pipe into cat's
 *   stdin and PUTs cat's stdout to the out-pipe.
 * MB/s = SIZE / (from acquire to the receipt with every output byte received), 1 MB = 10^6 B.
 * The source generates 64 KiB chunks with backpressure; the sink counts and drops them.
 * CPU s/GB: user+system CPU of this process, both bench hosts and their finished children (cat),
 * per 10^9 bytes: what the path costs the machine (on 2 cores, 2 / that is a ceiling for MB/s).
 */
import { Readable, Writable } from 'node:stream';
import Fastify from 'fastify';
import { systemClock } from '../../src/clock.js';
import { parseFylrConfig } from '../../src/config/load-config.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import { PipeServer } from '../../src/fylr/pipe-server.js';
import type { JobSpec } from '../../src/protocol/job.js';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { acquireAndRun } from '../../legacy/fylr/polling-client.js';
import { gatewayFor, singleGroup } from '../lib/configs.js';
import { BenchHost } from '../lib/host-client.js';
import type { BenchOptions } from '../lib/options.js';
import { cpuOf } from '../lib/proc.js';
import { median } from '../lib/stats.js';

export interface StreamingMode {
  mode: 'direct' | 'relay floor' | 'gateway' | 'native';
  reps: number[];
  mb_per_sec: number;
  /** CPU seconds per GB moved, summed over every process of the path (this one, the bench hosts, cat). */
  cpu_s_per_gb: number;
  /** The same per process: the fylr side (this process: source, sink, pipe server or old client), the backend host (legacy execserver + cat), the front host (gateway, or native execserver + cat). */
  cpu_s_per_gb_by_process: { fylr_side: number; backend_host: number; front_host: number };
  error: string | null;
}

export interface StreamingResult {
  bytes: number;
  size_note: string;
  modes: StreamingMode[];
  /** gateway / direct */
  gateway_vs_direct: number;
  /** relay floor / direct: what one more process in the path costs at the least */
  relay_vs_direct: number;
  native_vs_direct: number;
}

const CAT_JOB: JobSpec = { service: 'cat', commands: [{ prog: 'cat', args: [], stdin: { type: 'body' }, stdout: { type: 'body' } }] };
const CHUNK = Buffer.alloc(64 * 1024, 'slotgate-bench ');

function source(bytes: number): Readable {
  let left = bytes;
  return new Readable({
    highWaterMark: 4 * CHUNK.length,
    read() {
      while (left > 0) {
        const n = Math.min(left, CHUNK.length);
        left -= n;
        if (!this.push(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n))) return;
      }
      this.push(null);
    },
  });
}

function sink(): { stream: Writable; bytes: () => number } {
  let n = 0;
  const stream = new Writable({
    highWaterMark: 4 * CHUNK.length,
    write(chunk: Buffer, _enc, cb) {
      n += chunk.length;
      cb();
    },
  });
  return { stream, bytes: () => n };
}

async function direct(url: string, bytes: number): Promise<number> {
  const out = sink();
  const t0 = performance.now();
  const r = await acquireAndRun(CAT_JOB, { addresses: [url], connectTimeoutSec: 60, clock: systemClock, counters: new LegacyCounters(), stdin: source(bytes), stdout: out.stream });
  const ms = performance.now() - t0;
  if (r.kind !== 'done' || !r.receipt.ok) throw new Error(`direct PUT failed: ${JSON.stringify(r.kind === 'done' ? r.receipt.error : r)}`);
  if (out.bytes() !== bytes) throw new Error(`direct PUT: ${out.bytes()} of ${bytes} bytes came back`);
  return (bytes / 1e6) / (ms / 1000);
}

async function viaClient(client: ExecClient, bytes: number, n: number): Promise<number> {
  const out = sink();
  const t0 = performance.now();
  const a = await client.acquire({ jobId: `stream-${n}`, service: 'cat', priority: 0 });
  if (a.kind !== 'slot') throw new Error(`no slot: ${a.reason}`);
  const receipt = await a.lease.run(CAT_JOB, { stdin: source(bytes), stdout: out.stream });
  const ms = performance.now() - t0;
  if (!receipt.ok) throw new Error(`job failed: ${receipt.error?.code}: ${receipt.error?.message}`);
  if (out.bytes() !== bytes) throw new Error(`${out.bytes()} of ${bytes} bytes came back`);
  return (bytes / 1e6) / (ms / 1000);
}

async function newClient(url: string): Promise<{ client: ExecClient; close(): Promise<void> }> {
  const pipes = new PipeServer();
  const app = Fastify({ logger: false, forceCloseConnections: true });
  await app.register(pipes.plugin);
  await app.listen({ host: '127.0.0.1', port: 0 });
  const addr = app.server.address();
  if (addr === null || typeof addr === 'string') throw new Error('no port');
  pipes.setPort(addr.port);
  const config = parseFylrConfig({ execserver: { addresses: [url], connectTimeoutSec: 60 } }).execserver;
  const client = new ExecClient(config, { pipes, name: 'bench' });
  await client.start();
  return {
    client,
    async close() {
      await client.close();
      pipes.close();
      await app.close();
    },
  };
}

async function reps(o: BenchOptions, name: StreamingMode['mode'], bytes: number, pids: number[], fn: (i: number) => Promise<number>): Promise<StreamingMode> {
  const out: number[] = [];
  const cpu: number[] = [];
  const per: number[][] = [];
  const byProcess = (): StreamingMode['cpu_s_per_gb_by_process'] => ({
    fylr_side: median(per.map((x) => x[0] as number)),
    backend_host: median(per.map((x) => x[1] as number)),
    front_host: median(per.map((x) => x[2] as number)),
  });
  try {
    for (let r = 0; r < o.reps; r++) {
      const c0 = pids.map((p) => cpuOf([p]));
      out.push(await fn(r));
      const d = pids.map((p, i) => (cpuOf([p]) - (c0[i] as number)) / (bytes / 1e9));
      per.push(d);
      cpu.push(d.reduce((a, b) => a + b, 0));
    }
    const bp = byProcess();
    o.log(`streaming ${name}: ${out.map((x) => x.toFixed(0)).join(', ')} MB/s, ${median(cpu).toFixed(2)} CPU s/GB (fylr side ${bp.fylr_side.toFixed(2)}, backend ${bp.backend_host.toFixed(2)}, front ${bp.front_host.toFixed(2)})`);
    return { mode: name, reps: out, mb_per_sec: median(out), cpu_s_per_gb: median(cpu), cpu_s_per_gb_by_process: bp, error: null };
  } catch (e) {
    const error = (e as Error).message.split('\n')[0] ?? String(e);
    o.log(`streaming ${name}: FAILED ${error}`);
    return { mode: name, reps: out, mb_per_sec: out.length > 0 ? median(out) : Number.NaN, cpu_s_per_gb: median(cpu), cpu_s_per_gb_by_process: byProcess(), error };
  }
}

export async function runStreaming(o: BenchOptions, bytes = o.quick ? 64 * 2 ** 20 : 2 ** 30, sizeNote = o.quick ? 'quick mode: 64 MiB' : '1 GiB, as the issue asks'): Promise<StreamingResult> {
  const backendHost = await BenchHost.start();
  const frontHost = await BenchHost.start();
  const modes: StreamingMode[] = [];
  try {
    const like = singleGroup('stream-backend', 2);
    const backend = await backendHost.start('legacy', like);
    const pids = [process.pid, backendHost.pid, frontHost.pid];
    modes.push(await reps(o, 'direct', bytes, pids, () => direct(backend.url, bytes)));

    const relay = await frontHost.startRelay(backend.url);
    modes.push(await reps(o, 'relay floor', bytes, pids, () => direct(relay.url, bytes)));
    await frontHost.stopServer(relay);

    const gateway = await frontHost.start('gateway', gatewayFor(like, [backend.url]));
    const gc = await newClient(gateway.url);
    modes.push(await reps(o, 'gateway', bytes, pids, (i) => viaClient(gc.client, bytes, i)));
    await gc.close();
    await frontHost.stopServer(gateway);

    const native = await frontHost.start('native', singleGroup('stream-native', 2));
    const nc = await newClient(native.url);
    modes.push(await reps(o, 'native', bytes, pids, (i) => viaClient(nc.client, bytes, 100 + i)));
    await nc.close();
    await frontHost.stopServer(native);
    await backendHost.stopServer(backend);
  } finally {
    await frontHost.close();
    await backendHost.close();
  }
  const get = (m: StreamingMode['mode']): number => modes.find((x) => x.mode === m)?.mb_per_sec ?? Number.NaN;
  return { bytes, size_note: sizeNote, modes, gateway_vs_direct: get('gateway') / get('direct'), relay_vs_direct: get('relay floor') / get('direct'), native_vs_direct: get('native') / get('direct') };
}
