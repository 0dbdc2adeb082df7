/**
 * Forks the bench host (host.ts) and talks to it over IPC. One host per scenario, stopped at its
 * end, so one scenario's garbage does not slow the next.
 */
import { type ChildProcess, fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { RawServeConfig } from './configs.js';
import type { GcStats, HostCounters, HostKind, HostStatus } from './host.js';

const HOST = fileURLToPath(new URL('./host.ts', import.meta.url));

interface Reply {
  id: number;
  ok: boolean;
  result?: unknown;
  error?: string;
}

export interface HostedServer {
  id: number;
  url: string;
}

export class BenchHost {
  readonly #child: ChildProcess;
  readonly #pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  #next = 1;

  private constructor(child: ChildProcess) {
    this.#child = child;
    child.on('message', (m: Reply) => {
      const p = this.#pending.get(m.id);
      if (!p) return;
      this.#pending.delete(m.id);
      if (m.ok) p.resolve(m.result);
      else p.reject(new Error(`bench host: ${m.error}`));
    });
    child.on('exit', (code) => {
      for (const p of this.#pending.values()) p.reject(new Error(`bench host exited (${code})`));
      this.#pending.clear();
    });
  }

  get pid(): number {
    return this.#child.pid as number;
  }

  static async start(): Promise<BenchHost> {
    const extra = (process.env.BENCH_HOST_EXEC_ARGV ?? '').split(' ').filter((a) => a !== '');
    const child = fork(HOST, [], {
      // tsx for the TypeScript sources; --expose-gc is harmless there.
      execArgv: ['--import', 'tsx', ...extra],
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const host = new BenchHost(child);
    await new Promise<void>((resolve, reject) => {
      host.#pending.set(0, { resolve: () => resolve(), reject });
    });
    return host;
  }

  #call<T>(req: Record<string, unknown>): Promise<T> {
    const id = this.#next++;
    return new Promise<T>((resolve, reject) => {
      this.#pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.#child.send({ id, ...req });
    });
  }

  start(kind: HostKind, config: RawServeConfig, holdMs = 0): Promise<HostedServer> {
    return this.#call({ op: 'start', kind, config, holdMs });
  }

  /** A bare TCP relay (bench/lib/relay-floor.ts) in front of `target`. */
  startRelay(target: string): Promise<HostedServer> {
    return this.#call({ op: 'start', kind: 'relay', target });
  }

  counters(server: HostedServer): Promise<HostCounters> {
    return this.#call({ op: 'counters', server: server.id });
  }

  /** The samples so far; with `reset`, starts a new series (recording when reset is true). */
  handoffs(server: HostedServer, reset?: boolean): Promise<number[]> {
    return this.#call({ op: 'handoffs', server: server.id, ...(reset === undefined ? {} : { reset }) });
  }

  status(server: HostedServer): Promise<HostStatus> {
    return this.#call({ op: 'status', server: server.id });
  }

  /** GC pauses in the host since the last reset. */
  gc(reset = false): Promise<GcStats> {
    return this.#call({ op: 'gc', reset });
  }

  stopServer(server: HostedServer): Promise<void> {
    return this.#call({ op: 'stop', server: server.id });
  }

  async close(): Promise<void> {
    if (this.#child.exitCode !== null) return;
    const exited = new Promise<void>((resolve) => this.#child.once('exit', () => resolve()));
    this.#child.disconnect();
    const t = setTimeout(() => this.#child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(t);
  }
}
