/**
 * Shared pieces of the old-fylr tests: legacy execservers on port 0, a counting file server for
 * `file_in` inputs (counts executions independently of any server's own counters), job builders.
 */
import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { JobSpec } from '../../src/protocol/job.js';
import { type LegacyExecserver, startLegacyExecserver } from '../../legacy/execserver/legacy-execserver.js';

type Teardown = { teardown(fn: () => unknown): void };

export interface ExecOptions {
  name?: string;
  /** Defaults: fast 4, slow 1. */
  waitgroups?: Record<string, number>;
  tokenResponseSendServerIP?: boolean;
}

export type LegacyExec = LegacyExecserver;

/** A legacy execserver with services `echo`, `cat` (waitgroup fast), `sleep` (waitgroup slow). */
export async function startExec(t: Teardown, opts: ExecOptions = {}): Promise<LegacyExec> {
  const config = parseServeConfig({
    listen: '127.0.0.1:0',
    name: opts.name ?? 'old-exec',
    waitgroups: opts.waitgroups ?? { fast: 4, slow: 1 },
    commands: {
      echo: { prog: 'echo' },
      cat: { prog: 'cat' },
      sleep: { prog: 'sleep' },
    },
    services: {
      echo: { waitgroup: 'fast', commands: ['echo'] },
      cat: { waitgroup: 'fast', commands: ['cat'] },
      sleep: { waitgroup: 'slow', commands: ['sleep'] },
    },
    tokenResponseSendServerIP: opts.tokenResponseSendServerIP ?? false,
  });
  const exec = await startLegacyExecserver(config, { killGraceMs: 100 });
  t.teardown(() => exec.close());
  return exec;
}

export function noopJob(service: string): JobSpec {
  return { service, commands: [] };
}

export function sleepJob(seconds: number): JobSpec {
  return { service: 'sleep', timeout_sec: seconds + 30, commands: [{ prog: 'sleep', args: [{ type: 'value', value: String(seconds) }] }] };
}

export function echoJob(text: string): JobSpec {
  return { service: 'echo', commands: [{ prog: 'echo', args: [{ type: 'value', value: text }] }] };
}

/** `cat <file_in>`: every execution downloads `url` once. */
export function catFileJob(url: string): JobSpec {
  return { service: 'cat', commands: [{ prog: 'cat', args: [{ type: 'file_in', file: { url, name: 'in.txt' } }] }] };
}

export interface FileServer {
  url: string;
  /** GETs per path. */
  hits: Map<string, number>;
}

/** Serves `content of <path>` for every GET and counts the GETs per path. */
export async function startFileServer(t: Teardown): Promise<FileServer> {
  const hits = new Map<string, number>();
  const server = http.createServer((req, res) => {
    const path = req.url ?? '/';
    hits.set(path, (hits.get(path) ?? 0) + 1);
    res.setHeader('content-type', 'text/plain');
    res.end(`content of ${path}`);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(
    () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  );
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits };
}
