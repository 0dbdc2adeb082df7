/**
 * The bench host: a child process (forked by host-client.ts) that runs the servers under test,
 * so that the servers and the clients driving them use separate cores and separate event loops.
 * It answers requests over the IPC channel:
 *
 *   start {kind: native | legacy | gateway | floor, config, holdMs}  -> {id, url}
 *   start {kind: relay, target}  -> {id, url}   (the bare TCP relay in front of `target`)
 *   counters {id}        -> requests and websocket frames seen by that server so far
 *   handoffs {id, reset} -> hand-off samples (TimingSource / FloorServer), ms
 *   stop {id}            -> closes it
 *
 * Counting, at the server: HTTP requests are counted on the listener's 'request' event (every
 * request, any route; websocket upgrades apart); websocket frames on the ws server's sockets:
 * 'message' events in, send() calls out. Ping/pong control frames are neither.
 *
 * Run with `--cpu-prof` in BENCH_HOST_EXEC_ARGV to profile the servers alone.
 */
import type { Server } from 'node:http';
import { PerformanceObserver } from 'node:perf_hooks';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { ServeConfig } from '../../src/config/types.js';
import { createExecserver } from '../../src/execserver/server.js';
import { createGateway } from '../../src/gateway/gateway.js';
import { LocalSlotSource } from '../../src/slots/local-slot-source.js';
import { systemClock } from '../../src/clock.js';
import type { WebSocket, WebSocketServer } from 'ws';
import { FloorServer } from './floor-server.js';
import { RelayFloor } from './relay-floor.js';
import { TimingSource } from './timing-source.js';

export type HostKind = 'native' | 'legacy' | 'gateway' | 'floor' | 'relay';

export interface HostCounters {
  http_requests: number;
  ws_upgrades: number;
  frames_in: number;
  frames_out: number;
  /** Jobs that started (native/floor: run() calls; legacy: redeemed PUTs; gateway: its broker's jobs). */
  jobs: number;
  /** Legacy execserver only: jobs without commands (a gateway giving a token back; no-op jobs). */
  empty_jobs: number;
  /** Legacy execserver only: its own per-route response counters. */
  legacy?: unknown;
}

export interface HostStatus {
  /** Parked wants over all waitgroups (broker servers). */
  parked: number;
  running: number;
  connections: number;
}

interface Hosted {
  url: string;
  status?(): HostStatus;
  counters(): HostCounters;
  handoffs(reset: boolean | undefined): number[];
  close(): Promise<void>;
}

interface Counts {
  http: number;
  upgrades: number;
  framesIn: number;
  framesOut: number;
  /** DONE frames sent: jobs finished through the broker. */
  dones: number;
}

function countHttp(server: Server, c: Counts): void {
  server.on('request', () => c.http++);
  server.on('upgrade', () => c.upgrades++);
}

function countFrames(wss: WebSocketServer, c: Counts): void {
  wss.on('connection', (ws: WebSocket) => {
    ws.on('message', () => c.framesIn++);
    const send = ws.send.bind(ws) as (...a: unknown[]) => void;
    (ws as unknown as { send: (...a: unknown[]) => void }).send = (...a: unknown[]) => {
      c.framesOut++;
      if (typeof a[0] === 'string' && a[0].startsWith('{"type":"DONE"')) c.dones++;
      send(...a);
    };
  });
}

async function startNative(config: ServeConfig, holdMs: number): Promise<Hosted> {
  const timing = new TimingSource(new LocalSlotSource(config, systemClock), holdMs);
  const server = await createExecserver({ config, source: timing });
  const c: Counts = { http: 0, upgrades: 0, framesIn: 0, framesOut: 0, dones: 0 };
  countHttp(server.app.server, c);
  // The ws server exists once the plugin is registered (createExecserver awaited it).
  countFrames((server.app as unknown as { websocketServer: WebSocketServer }).websocketServer, c);
  const url = await server.listen();
  return {
    url,
    counters: () => ({ http_requests: c.http, ws_upgrades: c.upgrades, frames_in: c.framesIn, frames_out: c.framesOut, jobs: timing.jobsRun, empty_jobs: 0 }),
    handoffs(reset) {
      const out = [...timing.samplesMs];
      if (reset !== undefined) timing.reset(reset);
      return out;
    },
    status: () => brokerStatus(server.broker),
    close: () => server.close(),
  };
}

function brokerStatus(broker: { status(): { waitgroups: Record<string, { parked: number; running: number }>; connections: unknown[] } }): HostStatus {
  const st = broker.status();
  const wgs = Object.values(st.waitgroups);
  return { parked: wgs.reduce((n, w) => n + w.parked, 0), running: wgs.reduce((n, w) => n + w.running, 0), connections: st.connections.length };
}

async function startLegacy(config: ServeConfig): Promise<Hosted> {
  const { startLegacyExecserver } = await import('../../legacy/execserver/legacy-execserver.js');
  const server = await startLegacyExecserver(config, { log: false });
  const total = (m: Record<number, number>): number => Object.values(m).reduce((a, b) => a + b, 0);
  return {
    url: server.url,
    counters: () => {
      const k = server.counters;
      const requests = total(k.requests.token) + total(k.requests.job) + total(k.requests.healthz) + total(k.requests.other);
      return {
        http_requests: requests,
        ws_upgrades: 0,
        frames_in: 0,
        frames_out: 0,
        jobs: Object.values(k.jobs).reduce((a, b) => a + b, 0),
        empty_jobs: Object.values(k.emptyJobs).reduce((a, b) => a + b, 0),
        legacy: { requests: k.requests, tokensIssued: k.tokensIssued, tokensExpired: k.tokensExpired },
      };
    },
    handoffs: () => [],
    close: () => server.close(),
  };
}

async function startGateway(config: ServeConfig): Promise<Hosted> {
  const server = await createGateway({ config });
  const c: Counts = { http: 0, upgrades: 0, framesIn: 0, framesOut: 0, dones: 0 };
  countHttp(server.app.server, c);
  countFrames((server.app as unknown as { websocketServer: WebSocketServer }).websocketServer, c);
  const url = await server.listen();
  return {
    url,
    counters: () => ({ http_requests: c.http, ws_upgrades: c.upgrades, frames_in: c.framesIn, frames_out: c.framesOut, jobs: c.dones, empty_jobs: 0 }),
    handoffs: () => [],
    status: () => brokerStatus(server.broker),
    close: () => server.close(),
  };
}

async function startFloor(config: ServeConfig, holdMs: number): Promise<Hosted> {
  const processes = Object.values(config.waitgroups).reduce((a, b) => a + b, 0);
  const { server, url } = await FloorServer.start(processes, holdMs);
  return {
    url,
    counters: () => ({ http_requests: 0, ws_upgrades: 0, frames_in: server.framesIn, frames_out: server.framesOut, jobs: server.jobsRun, empty_jobs: 0 }),
    handoffs(reset) {
      const out = [...server.samplesMs];
      if (reset !== undefined) server.reset(reset);
      return out;
    },
    close: () => server.close(),
  };
}

async function startRelay(target: string): Promise<Hosted> {
  const { relay, url } = await RelayFloor.start(target);
  return {
    url,
    counters: () => ({ http_requests: 0, ws_upgrades: relay.connections, frames_in: 0, frames_out: 0, jobs: 0, empty_jobs: 0 }),
    handoffs: () => [],
    close: () => relay.close(),
  };
}

/** GC pauses of this process (PerformanceObserver 'gc': no timers, so it adds no wake-ups). */
export interface GcStats {
  count: number;
  total_ms: number;
  max_ms: number;
  /** Pauses of 1 ms or more. */
  over_1ms: number;
}
let gc: GcStats = { count: 0, total_ms: 0, max_ms: 0, over_1ms: 0 };
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) {
    gc.count++;
    gc.total_ms += e.duration;
    gc.max_ms = Math.max(gc.max_ms, e.duration);
    if (e.duration >= 1) gc.over_1ms++;
  }
}).observe({ entryTypes: ['gc'] });

const servers = new Map<number, Hosted>();
let nextId = 1;

interface Request {
  id: number;
  op: 'start' | 'counters' | 'handoffs' | 'status' | 'stop' | 'memory' | 'gc';
  kind?: HostKind;
  config?: unknown;
  holdMs?: number;
  server?: number;
  reset?: boolean;
  /** kind relay: the backend it relays to. */
  target?: string;
}

function hosted(id: number | undefined): Hosted {
  const s = id === undefined ? undefined : servers.get(id);
  if (!s) throw new Error(`no server ${id}`);
  return s;
}

async function handle(req: Request): Promise<unknown> {
  switch (req.op) {
    case 'start': {
      if (req.kind === 'relay') {
        if (req.target === undefined) throw new Error('start relay: no target');
        const id = nextId++;
        servers.set(id, await startRelay(req.target));
        return { id, url: (servers.get(id) as Hosted).url };
      }
      const config = parseServeConfig(req.config);
      const holdMs = req.holdMs ?? 0;
      const s =
        req.kind === 'native' ? await startNative(config, holdMs)
        : req.kind === 'legacy' ? await startLegacy(config)
        : req.kind === 'gateway' ? await startGateway(config)
        : await startFloor(config, holdMs);
      const id = nextId++;
      servers.set(id, s);
      return { id, url: s.url };
    }
    case 'counters':
      return hosted(req.server).counters();
    case 'handoffs':
      return hosted(req.server).handoffs(req.reset);
    case 'status': {
      const s = hosted(req.server);
      if (!s.status) throw new Error('this server has no broker status');
      return s.status();
    }
    case 'stop': {
      const s = hosted(req.server);
      servers.delete(req.server as number);
      await s.close();
      return null;
    }
    case 'memory':
      return process.memoryUsage();
    case 'gc': {
      const out = gc;
      if (req.reset) gc = { count: 0, total_ms: 0, max_ms: 0, over_1ms: 0 };
      return out;
    }
    default:
      throw new Error(`unknown op ${String((req as { op: unknown }).op)}`);
  }
}

process.on('message', (req: Request) => {
  handle(req).then(
    (result) => process.send?.({ id: req.id, ok: true, result }),
    (e: unknown) => process.send?.({ id: req.id, ok: false, error: (e as Error)?.stack ?? String(e) }),
  );
});
process.on('disconnect', () => {
  void Promise.allSettled([...servers.values()].map((s) => s.close())).then(() => process.exit(0));
});
process.send?.({ id: 0, ok: true, result: 'ready' });
