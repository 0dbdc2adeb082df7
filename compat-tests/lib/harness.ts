/**
 * The stage of one live compat scenario: a fresh file_queue schema, a witness file, the peers it
 * starts (in this process, or as `slotgate` children where a crash is the point), the jobs it
 * submits, and the checks every scenario ends with:
 *
 *   - every job done exactly once: each job appends its marker to the witness file at the
 *     execserver when it runs, so each marker must be there exactly once (and nothing else);
 *     the in-process execservers' own counters must agree;
 *   - no waitgroup ever over its processes (the execservers' high-water marks);
 *   - nothing left claimed in file_queue;
 *   - every item `done` with an ok receipt.
 *
 * `compatTest` wraps a tap subtest and appends its result for `npm run compat`.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Test } from 'tap';
import { request } from 'undici';
import type { ExecClientObserver, ExecClientOptions } from '../../src/fylr/exec-client.js';
import type { DispatcherTimings } from '../../src/fylr/fylr-process.js';
import type { CliProcess } from '../../test/helpers/spawn-cli.js';
import { type TestSchema, testSchema } from '../../test/helpers/db.js';
import { until } from '../../fixtures/lib/cleanup.js';
import {
  type ExecPeer,
  type FylrOptions,
  fylrRaw,
  type GatewayPeer,
  getJson,
  type LegacyExecPeer,
  type NativeExecPeer,
  type NewFylrPeer,
  type OldFylrPeer,
  type ServeOptions,
  serveRaw,
  spawnPeer,
  startGateway,
  startLegacyExec,
  startNativeExec,
  startNewFylr,
  startOldFylr,
  tmpDir,
} from '../../fixtures/lib/peers.js';
import { recordResult, type ScenarioMeta } from './results.js';

/** Short dispatcher timers for the new fylr (in-process options; env for children). */
export const FAST_TIMINGS: DispatcherTimings = {
  pollIntervalMs: 100,
  heartbeatIntervalMs: 200,
  staleAfterMs: 1500,
  sweepIntervalMs: 200,
  retry: { backoffMs: 100, maxFailures: 5 },
};

export const CLIENT_PING_MS = 500;

export interface Item {
  id: number;
  marker: string;
  priority: number;
  service: string;
}

export interface SubmitOptions {
  service?: 'mark' | 'slow' | 'solomark';
  priority?: number;
  /** slow / solomark: seconds the job sleeps before it writes its marker. */
  secs?: number;
}

interface RowCounts {
  state: string;
  n: number;
}

let witnessSeq = 0;

export class Stage {
  readonly t: Test;
  readonly db: TestSchema;
  readonly witness: string;
  readonly notes: string[] = [];
  readonly execs: ExecPeer[] = [];
  readonly legacyPeers: LegacyExecPeer[] = [];
  readonly oldFylrs: OldFylrPeer[] = [];
  readonly newFylrs: NewFylrPeer[] = [];
  readonly submitted: Item[] = [];
  /** Counted by the observers of in-process new fylrs. */
  readonly newFylrCounts = { frames: 0, http: 0 };
  #markers = 0;

  constructor(t: Test, db: TestSchema, name: string) {
    this.t = t;
    this.db = db;
    this.witness = join(tmpDir(), `witness-${name.replace(/[^a-z0-9-]/gi, '_')}-${process.pid}-${++witnessSeq}.txt`);
    writeFileSync(this.witness, '');
  }

  serve(o: ServeOptions = {}): ServeOptions {
    return { witness: this.witness, ...o };
  }

  // ------------------------------------------------------------------ peers in this process

  async legacy(o: ServeOptions = {}): Promise<LegacyExecPeer> {
    const p = await startLegacyExec(this.t, this.serve(o));
    this.execs.push(p);
    this.legacyPeers.push(p);
    return p;
  }

  async native(o: ServeOptions = {}): Promise<NativeExecPeer> {
    const p = await startNativeExec(this.t, this.serve(o));
    this.execs.push(p);
    return p;
  }

  async gateway(backends: string[], o: ServeOptions = {}): Promise<GatewayPeer> {
    const p = await startGateway(this.t, { ...this.serve(o), backends });
    this.execs.push(p);
    return p;
  }

  async oldFylr(addresses: string[], o: Partial<FylrOptions> & { pollIntervalMs?: number; requeueDelayMs?: number } = {}): Promise<OldFylrPeer> {
    const p = await startOldFylr(this.t, { addresses, schema: this.db.schema, connectTimeoutSec: 20, parallel: 4, parallelHigh: 1, ...o });
    this.oldFylrs.push(p);
    return p;
  }

  /** An observer that counts what the client sends (frames, token requests, dials). */
  #observer(extra?: ExecClientObserver): ExecClientObserver {
    return {
      ...extra,
      frameOut: (...a) => {
        this.newFylrCounts.frames++;
        extra?.frameOut?.(...a);
      },
      tokenAnswer: (...a) => {
        this.newFylrCounts.http++;
        extra?.tokenAnswer?.(...a);
      },
      dialed: (...a) => {
        this.newFylrCounts.http++;
        extra?.dialed?.(...a);
      },
    };
  }

  async newFylr(
    addresses: string[],
    o: Partial<FylrOptions> & { timings?: DispatcherTimings; observer?: ExecClientObserver; pingIntervalMs?: number; client?: Omit<ExecClientOptions, 'clock' | 'pipes' | 'name' | 'observer'> } = {},
  ): Promise<NewFylrPeer> {
    const { timings, observer, pingIntervalMs, client, ...rest } = o;
    const p = await startNewFylr(this.t, {
      addresses,
      schema: this.db.schema,
      connectTimeoutSec: 20,
      ...rest,
      extra: { dispatcher: { ...FAST_TIMINGS, ...timings }, client: { pingIntervalMs: pingIntervalMs ?? CLIENT_PING_MS, ...client, observer: this.#observer(observer) } },
    });
    this.newFylrs.push(p);
    return p;
  }

  // ------------------------------------------------------------------ peers as child processes

  /** `slotgate serve` (native, or a gateway with `backends`) or `legacy-execserver` as a child. */
  async spawnExec(kind: 'native' | 'gateway' | 'legacy', name: string, o: ServeOptions = {}): Promise<CliProcess> {
    return spawnPeer(this.t, kind === 'legacy' ? 'legacy-execserver' : 'serve', name, serveRaw({ name, ...this.serve(o) }));
  }

  /** `slotgate fylr` as a child, with the fast dispatcher timings. */
  async spawnNewFylr(name: string, addresses: string[], o: Partial<FylrOptions> = {}, timings: DispatcherTimings = {}): Promise<CliProcess> {
    return spawnPeer(this.t, 'fylr', name, fylrRaw({ name, addresses, schema: this.db.schema, connectTimeoutSec: 20, ...o }), {
      SLOTGATE_DISPATCHER_TIMINGS: JSON.stringify({ ...FAST_TIMINGS, ...timings }),
    });
  }

  // ------------------------------------------------------------------ jobs

  /** Submits `n` jobs through a fylr's POST /items; each carries a marker of its own. */
  async submit(fylrUrl: string, n: number, o: SubmitOptions = {}): Promise<Item[]> {
    const service = o.service ?? 'mark';
    const priority = o.priority ?? 0;
    const items: Item[] = [];
    for (let i = 0; i < n; i++) {
      const marker = `m${++this.#markers}`;
      const args = [{ type: 'value', value: marker }];
      if (service !== 'mark') args.push({ type: 'value', value: String(o.secs ?? 0.2) });
      const job = { commands: [{ prog: service === 'mark' ? 'mark' : 'slowmark', args }] };
      const res = await request(`${fylrUrl}/items`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ action: service, priority, job }) });
      const text = await res.body.text();
      if (res.statusCode !== 201) throw new Error(`POST /items: ${res.statusCode} ${text}`);
      const item = { id: (JSON.parse(text) as { id: number }).id, marker, priority, service };
      items.push(item);
      this.submitted.push(item);
    }
    return items;
  }

  async states(items: Item[] = this.submitted): Promise<Record<string, number>> {
    const { rows } = await this.db.pool.query<RowCounts>(`SELECT state, count(*)::int AS n FROM file_queue WHERE id = ANY($1) GROUP BY state`, [items.map((i) => i.id)]);
    return Object.fromEntries(rows.map((r) => [r.state, r.n]));
  }

  /** Polls the database until every item is done or failed. */
  async waitDone(items: Item[] = this.submitted, timeoutMs = 60_000): Promise<void> {
    let last: Record<string, number> = {};
    try {
      await until(
        async () => {
          last = await this.states(items);
          return (last.done ?? 0) + (last.failed ?? 0) === items.length;
        },
        `${items.length} items done`,
        timeoutMs,
        50,
      );
    } catch (e) {
      throw new Error(`${(e as Error).message}; states now ${JSON.stringify(last)}`);
    }
  }

  /** How often each marker is in the witness file. */
  witnessed(): Map<string, number> {
    const counts = new Map<string, number>();
    for (const line of readFileSync(this.witness, 'utf8').split('\n')) {
      if (line === '') continue;
      counts.set(line, (counts.get(line) ?? 0) + 1);
    }
    return counts;
  }

  async claimedCount(): Promise<number> {
    const { rows } = await this.db.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM file_queue WHERE state = 'claimed'`);
    return rows[0]?.n ?? 0;
  }

  /**
   * The checks every scenario ends with (see the module comment). `inProcessExecutions`: the
   * in-process execservers ran exactly this many jobs with commands (default: every submitted
   * item; pass null when a crashed child ran some of them). `crashRerunsAllowed`: how many jobs
   * may have run twice because the execserver they ran on crashed after the job finished but
   * before its DONE left (the result died with it, so the retry is right); every other job must
   * still have run exactly once.
   */
  async verify(opts: { inProcessExecutions?: number | null; crashRerunsAllowed?: number } = {}): Promise<void> {
    const t = this.t;
    const items = this.submitted;
    const { rows } = await this.db.pool.query<{ id: string; state: string; ok: boolean | null }>(
      `SELECT id, state, (receipt->>'ok')::boolean AS ok FROM file_queue WHERE id = ANY($1)`,
      [items.map((i) => i.id)],
    );
    const notDone = rows.filter((r) => r.state !== 'done' || r.ok !== true).map((r) => `${r.id}:${r.state}:${r.ok}`);
    t.same(notDone, [], `all ${items.length} items done with an ok receipt`);

    const seen = this.witnessed();
    const reruns = items.filter((i) => seen.get(i.marker) === 2).map((i) => i.marker);
    const allowed = new Set(reruns.slice(0, opts.crashRerunsAllowed ?? 0));
    const wrong = items.filter((i) => seen.get(i.marker) !== 1 && !allowed.has(i.marker)).map((i) => `${i.marker}x${seen.get(i.marker) ?? 0}`);
    t.same(wrong, [], 'every job executed exactly once (witness file at the execservers)');
    if (allowed.size > 0) t.comment(`re-run after their execserver crashed between the job's end and its DONE: ${[...allowed].join(', ')}`);
    const foreign = [...seen.keys()].filter((m) => !items.some((i) => i.marker === m));
    t.same(foreign, [], 'and nothing else was executed');

    const expected = opts.inProcessExecutions === undefined ? items.length : opts.inProcessExecutions;
    if (expected !== null) {
      let counted = 0;
      for (const e of this.execs) counted += await e.executions();
      t.equal(counted, expected, "the execservers' own counters agree");
    }
    for (const e of this.execs) {
      for (const wg of ['w', 'one']) {
        const max = e.maxRunning(wg);
        if (max !== null) t.ok(max <= e.processes(wg), `${e.name}: waitgroup ${wg} never over its processes (max ${max} of ${e.processes(wg)})`);
      }
    }
    for (const l of this.legacyPeers) {
      for (const wg of ['w', 'one']) {
        const held = l.server.counters.maxHeld[wg] ?? 0;
        t.ok(held <= l.processes(wg), `${l.name}: slots held (tokens + running) in ${wg} never over its processes (max ${held})`);
      }
    }
    t.equal(await this.claimedCount(), 0, 'nothing left claimed in file_queue');
  }

  // ------------------------------------------------------------------ what was sent

  requests(): { http: number; frames: number } {
    let http = this.newFylrCounts.http;
    for (const f of this.oldFylrs) {
      const c = f.fylr.counters.snapshot();
      http += c.token_requests.total + c.puts.total;
    }
    return { http, frames: this.newFylrCounts.frames };
  }

  backendRequests(): number {
    let n = 0;
    for (const l of this.legacyPeers) for (const byStatus of Object.values(l.server.counters.requests)) n += Object.values(byStatus).reduce((a, b) => a + b, 0);
    return n;
  }
}

/** The transport a fylr's /status reports for an address. */
export async function transportOf(fylr: { status(): Promise<Record<string, unknown>> } | string, address: string): Promise<string | undefined> {
  const status = typeof fylr === 'string' ? await getJson(`${fylr}/status`) : await fylr.status();
  const list = (status.addresses ?? []) as { address: string; transport: string }[];
  return list.find((a) => a.address.replace(/\/+$/, '') === address.replace(/\/+$/, ''))?.transport;
}

/** A tap subtest that builds a Stage, and records its result for the report. */
export function compatTest(t: Test, meta: Omit<ScenarioMeta, 'title'> & { title: string }, fn: (s: Stage) => Promise<void>): void {
  t.test(meta.title, async (t) => {
    const db = await testSchema(t, meta.id.replace(/^[a-z]+:/, '').slice(0, 24));
    const stage = new Stage(t, db, meta.id);
    const started = Date.now();
    let duration = 0;
    t.teardown(() => {
      recordResult({
        ...meta,
        pass: t.passing(),
        jobs: stage.submitted.length,
        duration_ms: duration || Date.now() - started,
        requests: stage.requests(),
        backend_requests: stage.backendRequests(),
        notes: stage.notes,
      });
    });
    try {
      await fn(stage);
    } finally {
      duration = Date.now() - started;
    }
  });
}
