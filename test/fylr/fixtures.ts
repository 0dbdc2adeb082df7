/**
 * Shared pieces of the fylr-side tests: real native execservers on 127.0.0.1 port 0, a client
 * configuration, an observer that records what the client did (and lets a test wait for it),
 * a scriptable fake execserver for frame-exact cases, and a condition wait with a deadline.
 */
import { once } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyInstance } from 'fastify';
import { WebSocket, WebSocketServer } from 'ws';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { ExecserverClientConfig, ServeConfig } from '../../src/config/types.js';
import { createExecserver, type Execserver } from '../../src/execserver/server.js';
import type { ExecClientObserver } from '../../src/fylr/exec-client.js';
import { PipeServer } from '../../src/fylr/pipe-server.js';
import type { Clock } from '../../src/clock.js';
import type { ExecMessage, FylrMessage, HelloMessage } from '../../src/protocol/messages.js';
import type { JobSpec } from '../../src/protocol/job.js';
import type { SlotSource } from '../../src/slots/slot-source.js';

export interface Teardown {
  teardown(fn: () => unknown): void;
}

export interface ExecDef {
  name: string;
  /** waitgroup -> processes */
  waitgroups?: Record<string, number>;
  /** service -> waitgroup; every service may run `sleep` and `cat`. */
  services?: Record<string, string>;
  offerTimeoutMs?: number;
  listen?: string;
}

export function execConfig(def: ExecDef): ServeConfig {
  const waitgroups = def.waitgroups ?? { w: 1 };
  const services = def.services ?? { sleep: 'w' };
  return parseServeConfig({
    listen: def.listen ?? '127.0.0.1:0',
    name: def.name,
    waitgroups,
    commands: { sleep: { prog: 'sleep' }, cat: { prog: 'cat' } },
    services: Object.fromEntries(Object.entries(services).map(([svc, wg]) => [svc, { waitgroup: wg, commands: ['sleep', 'cat'] }])),
    broker: { offer_timeout_ms: def.offerTimeoutMs ?? 5000 },
  });
}

export interface RunningExec {
  exec: Execserver;
  url: string;
  port: number;
  config: ServeConfig;
  close(): Promise<void>;
}

/** Creates and starts an execserver on `config`, closed (once) at teardown. */
export async function listenExec(t: Teardown, config: ServeConfig, source?: SlotSource): Promise<Omit<RunningExec, 'config'>> {
  const exec = await createExecserver(source === undefined ? { config } : { config, source });
  const url = await exec.listen();
  const port = Number(new URL(url).port);
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> => (closed ??= exec.close());
  t.teardown(close);
  return { exec, url, port, close };
}

export async function startExec(t: Teardown, def: ExecDef): Promise<RunningExec> {
  const config = execConfig(def);
  return { ...(await listenExec(t, config)), config };
}

export function clientConfig(addresses: string[], over: Partial<ExecserverClientConfig> = {}): ExecserverClientConfig {
  return {
    addresses,
    connectTimeoutSec: 60,
    callbackBackendInternalURL: null,
    callbackBackendOwnURL: null,
    parallel: 18,
    parallelHigh: 10,
    reprobe_interval_ms: 60_000,
    max_connections_per_address: 8,
    ...over,
  };
}

/** A job that holds its slot until cancelled. */
export function sleepJob(service = 'sleep', seconds = 60): JobSpec {
  return { service, commands: [{ prog: 'sleep', args: [{ type: 'value', value: String(seconds) }] }] };
}

export function catJob(service = 'cat'): JobSpec {
  return { service, commands: [{ prog: 'cat', args: [], stdin: { type: 'body' }, stdout: { type: 'body' } }] };
}

/** Resolves once `cond()` holds, checking every few ms; rejects after `timeoutMs` naming `what`. */
export async function waitFor(cond: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for: ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

export type RecordedEvent =
  | { kind: 'dialed'; address: string; purpose: string; at: number }
  | { kind: 'dialFailed'; address: string; purpose: string; failure: string }
  | { kind: 'connected'; address: string; instance: string; local: string | undefined }
  | { kind: 'duplicate'; address: string; instance: string }
  | { kind: 'disconnected'; address: string; instance: string; reason: string }
  | { kind: 'transport'; address: string; transport: string }
  | { kind: 'out'; address: string; instance: string; message: FylrMessage }
  | { kind: 'in'; address: string; instance: string; message: ExecMessage }
  | { kind: 'pong'; address: string; instance: string }
  | { kind: 'token'; address: string; outcome: string };

/** Records everything the client reports; `waitFor` resolves on the first matching event (past ones count). */
export class Recorder implements ExecClientObserver {
  readonly events: RecordedEvent[] = [];
  #waiters: { pred: (e: RecordedEvent) => boolean; resolve: (e: RecordedEvent) => void }[] = [];

  #push(e: RecordedEvent): void {
    this.events.push(e);
    for (const w of [...this.#waiters]) {
      if (w.pred(e)) {
        this.#waiters.splice(this.#waiters.indexOf(w), 1);
        w.resolve(e);
      }
    }
  }

  dialed(address: string, purpose: string, at: number): void {
    this.#push({ kind: 'dialed', address, purpose, at });
  }
  dialFailed(address: string, purpose: string, failure: { kind: string }): void {
    this.#push({ kind: 'dialFailed', address, purpose, failure: failure.kind });
  }
  connected(address: string, instance: string, local: string | undefined): void {
    this.#push({ kind: 'connected', address, instance, local });
  }
  duplicate(address: string, instance: string): void {
    this.#push({ kind: 'duplicate', address, instance });
  }
  disconnected(address: string, instance: string, reason: string): void {
    this.#push({ kind: 'disconnected', address, instance, reason });
  }
  transportChanged(address: string, transport: string): void {
    this.#push({ kind: 'transport', address, transport });
  }
  frameOut(address: string, instance: string, message: FylrMessage): void {
    this.#push({ kind: 'out', address, instance, message });
  }
  frameIn(address: string, instance: string, message: ExecMessage): void {
    this.#push({ kind: 'in', address, instance, message });
  }
  pong(address: string, instance: string): void {
    this.#push({ kind: 'pong', address, instance });
  }
  tokenAnswer(address: string, outcome: string): void {
    this.#push({ kind: 'token', address, outcome });
  }

  /** Frames sent, optionally of one type and to one instance. */
  sent(type?: FylrMessage['type'], instance?: string): FylrMessage[] {
    return this.events.flatMap((e) => (e.kind === 'out' && (type === undefined || e.message.type === type) && (instance === undefined || e.instance === instance) ? [e.message] : []));
  }

  dials(purpose?: string): { purpose: string; at: number }[] {
    return this.events.flatMap((e) => (e.kind === 'dialed' && (purpose === undefined || e.purpose === purpose) ? [{ purpose: e.purpose, at: e.at }] : []));
  }

  waitFor(pred: (e: RecordedEvent) => boolean, what: string, timeoutMs = 10_000, fromIndex = 0): Promise<RecordedEvent> {
    const past = this.events.slice(fromIndex).find(pred);
    if (past) return Promise.resolve(past);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters = this.#waiters.filter((w) => w.resolve !== done);
        reject(new Error(`timed out waiting for event: ${what}`));
      }, timeoutMs);
      const done = (e: RecordedEvent): void => {
        clearTimeout(timer);
        resolve(e);
      };
      this.#waiters.push({ pred, resolve: done });
    });
  }
}

/** A fylr HTTP listener with the pipe plugin, like the fylr process mounts it. */
export async function startPipeApp(t: Teardown, opts: { host?: string; clock?: Clock; ttlMs?: number } = {}): Promise<{ app: FastifyInstance; pipes: PipeServer; port: number; url: string }> {
  const pipes = new PipeServer({ ...(opts.clock ? { clock: opts.clock } : {}), ...(opts.ttlMs !== undefined ? { ttlMs: opts.ttlMs } : {}) });
  const app = Fastify({ logger: false, forceCloseConnections: true });
  await app.register(pipes.plugin);
  const host = opts.host ?? '127.0.0.1';
  await app.listen({ host, port: 0 });
  const port = (app.server.address() as AddressInfo).port;
  pipes.setPort(port);
  t.teardown(async () => {
    pipes.close();
    await app.close();
  });
  return { app, pipes, port, url: `http://${host.includes(':') ? `[${host}]` : host}:${port}` };
}

// ---------------------------------------------------------------- a scriptable execserver

export interface FakeConn {
  ws: WebSocket;
  received: FylrMessage[];
  send(m: ExecMessage | Record<string, unknown>): void;
  /** Resolves with the first received frame (past ones count) matching `pred`. */
  next(pred: (m: FylrMessage) => boolean, what: string): Promise<FylrMessage>;
}

export interface FakeExec {
  url: string;
  conns: FakeConn[];
  /** Resolves with the n-th connection (0-based) once it exists. */
  conn(n: number): Promise<FakeConn>;
  close(): Promise<void>;
}

export function hello(over: Partial<HelloMessage> = {}): HelloMessage {
  return {
    type: 'HELLO',
    protocol: 1,
    instance_id: over.instance_id ?? 'fake-1',
    name: 'fake',
    services: { svc: 'w' },
    waitgroups: { w: { processes: 4, running: 0, parked: 0 } },
    clients: 1,
    draining: false,
    ...over,
  };
}

/** A websocket server at /broker that sends `helloFor(n)` to its n-th connection and records frames. */
export async function startFakeExec(t: Teardown, opts: { hello?: (n: number) => HelloMessage; autoPong?: boolean } = {}): Promise<FakeExec> {
  const server = http.createServer((_req, res) => res.writeHead(404).end());
  const wss = new WebSocketServer({ server, path: '/broker', autoPong: opts.autoPong ?? true });
  const conns: FakeConn[] = [];
  const connWaiters: (() => void)[] = [];
  wss.on('connection', (ws) => {
    const waiters: { pred: (m: FylrMessage) => boolean; resolve: (m: FylrMessage) => void }[] = [];
    const c: FakeConn = {
      ws,
      received: [],
      send: (m) => ws.send(JSON.stringify(m)),
      next: (pred, what) => {
        const past = c.received.find(pred);
        if (past) return Promise.resolve(past);
        return new Promise((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`fake execserver: timed out waiting for ${what}`)), 10_000);
          waiters.push({
            pred,
            resolve: (m) => {
              clearTimeout(timer);
              resolve(m);
            },
          });
        });
      },
    };
    ws.on('message', (data) => {
      const m = JSON.parse(String(data)) as FylrMessage;
      c.received.push(m);
      for (const w of [...waiters]) {
        if (w.pred(m)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(m);
        }
      }
    });
    ws.on('error', () => undefined);
    const n = conns.length;
    conns.push(c);
    ws.send(JSON.stringify(opts.hello ? opts.hello(n) : hello({ instance_id: `fake-${n}` })));
    for (const w of connWaiters.splice(0)) w();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> =>
    (closed ??= (async () => {
      for (const c of wss.clients) c.terminate();
      wss.close();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    })());
  t.teardown(close);
  return {
    url,
    conns,
    conn: async (n) => {
      while (conns.length <= n) await new Promise<void>((r) => connWaiters.push(r));
      return conns[n]!;
    },
    close,
  };
}

/** A raw broker client (counts as one more fylr on the execserver); resolves after its HELLO. */
export async function rawPeer(t: Teardown, url: string): Promise<{ ws: WebSocket; hello: HelloMessage; close(): Promise<void> }> {
  const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/broker`);
  const [data] = (await once(ws, 'message')) as [Buffer];
  const close = async (): Promise<void> => {
    if (ws.readyState === WebSocket.CLOSED) return;
    const closed = once(ws, 'close');
    ws.close();
    await closed;
  };
  t.teardown(close);
  return { ws, hello: JSON.parse(String(data)) as HelloMessage, close };
}
