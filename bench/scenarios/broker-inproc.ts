/**
 * The broker's own cost per job, without sockets: a Broker over LocalSlotSource, driven in this
 * process through an in-memory BrokerTransport (no ws framing, no syscalls, no second process).
 * The same loop as the throughput scenario (64 slots, 256 jobs outstanding on one connection,
 * OFFER -> JOB, DONE -> WANT), frames handed over once per event-loop turn. Reported as jobs/s
 * and µs of CPU per job, with the execserver's Prometheus metrics as the observer (as
 * `createExecserver` wires it) and with no observer, to separate the metrics' share.
 * Plus micro-costs of single steps the profile pointed at (ns per call).
 */
import { randomBytes } from 'node:crypto';
import { systemClock } from '../../src/clock.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import { Broker, newOfferToken } from '../../src/execserver/broker.js';
import { ExecserverMetrics } from '../../src/execserver/metrics.js';
import { LocalSlotSource } from '../../src/slots/local-slot-source.js';
import { singleGroup } from '../lib/configs.js';
import { type BenchOptions, dur } from '../lib/options.js';
import { median } from '../lib/stats.js';

export interface InprocResult {
  with_metrics: { jobs_per_sec: number; us_per_job: number; reps: number[] };
  without_metrics: { jobs_per_sec: number; us_per_job: number; reps: number[] };
  /** ns per call */
  micro: { offer_token_ns: number; pooled_token_ns: number; hello_signature_ns: number; abort_controller_ns: number };
}

async function loop(withMetrics: boolean, ms: number): Promise<number> {
  const config = parseServeConfig(singleGroup('inproc', 64));
  const source = new LocalSlotSource(config, systemClock);
  const metrics = new ExecserverMetrics();
  const broker = new Broker({ config, source, clock: systemClock, ...(withMetrics ? { observer: metrics } : {}) });
  if (withMetrics) metrics.attach(broker);
  const inbox: string[] = [];
  const session = broker.open({ send: (t) => void inbox.push(t), close: () => undefined, terminate: () => undefined, ping: () => undefined });
  let seq = 0;
  const want = (): void => session.receive(`{"type":"WANT","job_id":"j${++seq}","service":"noop","priority":0}`, false);
  for (let i = 0; i < 256; i++) want();
  let done = 0;
  const end = performance.now() + ms;
  const t0 = performance.now();
  while (performance.now() < end) {
    const batch = inbox.splice(0);
    for (const text of batch) {
      const m = JSON.parse(text) as { type: string; job_id: string; token: string };
      if (m.type === 'OFFER') session.receive(`{"type":"JOB","job_id":"${m.job_id}","token":"${m.token}","job":{"service":"noop","commands":[]}}`, false);
      else if (m.type === 'DONE') {
        done++;
        want();
      }
    }
    await new Promise((resolve) => setImmediate(resolve));
  }
  const s = (performance.now() - t0) / 1000;
  session.closed('end');
  broker.closeAll();
  return done / s;
}

function nsPerCall(n: number, fn: () => unknown): number {
  let sink = 0;
  for (let i = 0; i < 1000; i++) sink += fn() === undefined ? 0 : 1;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) sink += fn() === undefined ? 0 : 1;
  const ns = Number(process.hrtime.bigint() - t0) / n;
  if (sink < 0) console.log(sink);
  return ns;
}

export async function runBrokerInproc(o: BenchOptions): Promise<InprocResult> {
  const ms = dur(o, 1000, 400);
  const a: number[] = [];
  const b: number[] = [];
  await loop(true, 200);
  for (let r = 0; r < o.reps; r++) {
    a.push(await loop(true, ms));
    b.push(await loop(false, ms));
  }
  let pool = Buffer.alloc(0);
  let off = 0;
  const pooled = (): string => {
    if (off + 16 > pool.length) {
      pool = randomBytes(4096);
      off = 0;
    }
    off += 16;
    return pool.toString('base64url', off - 16, off);
  };
  const config = parseServeConfig(singleGroup('micro', 64));
  const broker = new Broker({ config, source: new LocalSlotSource(config, systemClock), clock: systemClock });
  const micro = {
    offer_token_ns: nsPerCall(100_000, newOfferToken),
    pooled_token_ns: nsPerCall(100_000, pooled),
    // What #slotAvailable pays on every freed slot through helloChanged(): a HELLO and its signature.
    hello_signature_ns: nsPerCall(100_000, () => JSON.stringify(broker.hello())),
    abort_controller_ns: nsPerCall(100_000, () => new AbortController().signal),
  };
  const res: InprocResult = {
    with_metrics: { jobs_per_sec: median(a), us_per_job: 1e6 / median(a), reps: a },
    without_metrics: { jobs_per_sec: median(b), us_per_job: 1e6 / median(b), reps: b },
    micro,
  };
  o.log(`broker in-process: ${Math.round(res.with_metrics.jobs_per_sec)} jobs/s with metrics, ${Math.round(res.without_metrics.jobs_per_sec)} without; token ${micro.offer_token_ns.toFixed(0)} ns (pooled ${micro.pooled_token_ns.toFixed(0)}), HELLO+signature ${micro.hello_signature_ns.toFixed(0)} ns, AbortController ${micro.abort_controller_ns.toFixed(0)} ns`);
  return res;
}
