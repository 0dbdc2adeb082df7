/**
 * Want-book micro-benchmark: 100k parked wants over 100 connections and 4 priority classes in one
 * waitgroup. Measures park/remove/grant throughput, position() latency and heap bytes per parked
 * want. Not a test: prints a table, and `runWantBookBench()` returns the numbers for run-all.
 *
 *   node --expose-gc --import tsx bench/want-book.bench.ts     (exact memory: forced GC)
 *   npx tsx bench/want-book.bench.ts                           (memory approximate, no GC)
 */
import { pathToFileURL } from 'node:url';
import { WantBook, type Want } from '../src/book/want-book.js';

export interface WantBookBenchOptions {
  wants?: number;
  connections?: number;
  priorities?: number;
  services?: number;
  positionSamples?: number;
  seed?: number;
}

export interface WantBookBenchResult {
  wants: number;
  connections: number;
  priorities: number;
  services: number;
  parkPerSec: number;
  removePerSec: number;
  /** next(waitgroup) until the book is empty. */
  grantsPerSec: number;
  /** next(waitgroup, service) with a random service each time, until empty. */
  serviceGrantsPerSec: number;
  positionMeanUs: number;
  positionP99Us: number;
  positionSamples: number;
  /** Heap growth from parking wants that already existed, per want: what the book itself costs. */
  bookBytesPerWant: number;
  /** Heap growth per want including creating the Want objects and their jobId strings. */
  totalBytesPerWant: number;
  /** 'gc': heapUsed after a forced global.gc(); 'no-gc': plain heapUsed, approximate. */
  memoryMethod: 'gc' | 'no-gc';
}

/** A small deterministic PRNG (mulberry32), so that runs are comparable. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function shuffle<T>(xs: T[], rnd: () => number): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [xs[i], xs[j]] = [xs[j] as T, xs[i] as T];
  }
  return xs;
}

const WG = 'medium';

function makeWants(n: number, o: Required<WantBookBenchOptions>, rnd: () => number): Want[] {
  const out = new Array<Want>(n);
  for (let i = 0; i < n; i++) {
    out[i] = {
      jobId: `job-${i.toString(36)}-${Math.floor(rnd() * 1e9).toString(36)}`,
      connId: `conn-${i % o.connections}`,
      service: `svc-${Math.floor(rnd() * o.services)}`,
      waitgroup: WG,
      priority: Math.floor(rnd() * o.priorities),
    };
  }
  return out;
}

const gc = (globalThis as { gc?: () => void }).gc;

function heapUsed(): number {
  if (gc !== undefined) {
    gc();
    gc();
  }
  return process.memoryUsage().heapUsed;
}

function seconds(start: bigint): number {
  return Number(process.hrtime.bigint() - start) / 1e9;
}

export function runWantBookBench(options: WantBookBenchOptions = {}): WantBookBenchResult {
  const o: Required<WantBookBenchOptions> = {
    wants: 100_000,
    connections: 100,
    priorities: 4,
    services: 4,
    positionSamples: 5_000,
    seed: 42,
    ...options,
  };
  const rnd = prng(o.seed);
  let sink = 0;

  // Memory first, on a quiet heap.
  const h0 = heapUsed();
  const wants = makeWants(o.wants, o, rnd);
  const h1 = heapUsed();
  let book = new WantBook();
  for (const w of wants) book.park(w);
  const h2 = heapUsed();
  sink += book.size;

  // Warm up every path once on a small book, then measure on fresh full books.
  {
    const warm = new WantBook();
    const few = wants.slice(0, 5_000);
    for (const w of few) warm.park(w);
    for (const w of few.slice(0, 500)) sink += warm.position(w.jobId, w.connId)?.ahead ?? 0;
    for (const w of few.slice(0, 1_000)) warm.remove(w.jobId, w.connId);
    for (let i = 0; i < 1_000; i++) sink += warm.next(WG, `svc-${i % o.services}`) === undefined ? 0 : 1;
    while (warm.next(WG) !== undefined) sink++;
  }

  book = new WantBook();
  let t = process.hrtime.bigint();
  for (const w of wants) book.park(w);
  const parkS = seconds(t);

  const samples = shuffle(wants.slice(), rnd).slice(0, o.positionSamples);
  const us: number[] = [];
  for (const w of samples) {
    const s = process.hrtime.bigint();
    sink += book.position(w.jobId, w.connId)?.ahead ?? 0;
    us.push(Number(process.hrtime.bigint() - s) / 1e3);
  }
  us.sort((a, b) => a - b);

  t = process.hrtime.bigint();
  while (book.next(WG) !== undefined) sink++;
  const grantS = seconds(t);

  book = new WantBook();
  for (const w of wants) book.park(w);
  const order = shuffle(wants.slice(), rnd);
  t = process.hrtime.bigint();
  for (const w of order) sink += book.remove(w.jobId, w.connId) === undefined ? 0 : 1;
  const removeS = seconds(t);

  book = new WantBook();
  for (const w of wants) book.park(w);
  const services = Array.from({ length: 1024 }, () => `svc-${Math.floor(rnd() * o.services)}`);
  let taken = 0;
  t = process.hrtime.bigint();
  for (let i = 0; book.size > 0; i++) {
    if (book.next(WG, services[i & 1023] as string) !== undefined) taken++;
  }
  const serviceS = seconds(t);

  if (sink < 0) console.log(sink); // keep the work observable
  return {
    wants: o.wants,
    connections: o.connections,
    priorities: o.priorities,
    services: o.services,
    parkPerSec: o.wants / parkS,
    removePerSec: o.wants / removeS,
    grantsPerSec: o.wants / grantS,
    serviceGrantsPerSec: taken / serviceS,
    positionMeanUs: us.reduce((a, b) => a + b, 0) / us.length,
    positionP99Us: us[Math.min(us.length - 1, Math.floor(us.length * 0.99))] as number,
    positionSamples: us.length,
    bookBytesPerWant: (h2 - h1) / o.wants,
    totalBytesPerWant: (h2 - h0) / o.wants,
    memoryMethod: gc === undefined ? 'no-gc' : 'gc',
  };
}

function fmt(n: number): string {
  return n >= 100 ? Math.round(n).toLocaleString('en-US') : n.toFixed(2);
}

export function printWantBookBench(r: WantBookBenchResult): void {
  console.log(`want-book: ${r.wants.toLocaleString('en-US')} wants, ${r.connections} connections, ${r.priorities} priority classes, ${r.services} services, 1 waitgroup`);
  const rows: [string, string][] = [
    ['park', `${fmt(r.parkPerSec)} /s`],
    ['remove (random order)', `${fmt(r.removePerSec)} /s`],
    ['next(wg) grants', `${fmt(r.grantsPerSec)} /s`],
    ['next(wg, service) grants', `${fmt(r.serviceGrantsPerSec)} /s`],
    [`position() mean (${r.positionSamples} samples)`, `${fmt(r.positionMeanUs)} µs`],
    ['position() p99', `${fmt(r.positionP99Us)} µs`],
    ['heap per parked want (book only)', `${fmt(r.bookBytesPerWant)} B`],
    ['heap per parked want (with Want + jobId)', `${fmt(r.totalBytesPerWant)} B`],
    ['goal <= 1 KiB per parked want', r.totalBytesPerWant <= 1024 ? 'met' : 'MISSED'],
  ];
  const w = Math.max(...rows.map(([k]) => k.length));
  for (const [k, v] of rows) console.log(`  ${k.padEnd(w)}  ${v.padStart(14)}`);
  console.log(
    r.memoryMethod === 'gc'
      ? '  memory: process.memoryUsage().heapUsed after global.gc(), before/after parking 100k existing wants (book only) and before creating them (with Want)'
      : '  memory: APPROXIMATE, plain heapUsed without forced GC; run `node --expose-gc --import tsx bench/want-book.bench.ts` for exact numbers',
  );
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  printWantBookBench(runWantBookBench());
}
