/**
 * A test load balancer: what sits in front of execserver replicas in a customer's cluster
 * (a Kubernetes Service, an external LB), reduced to round-robin.
 *
 * Every HTTP request and every websocket upgrade picks the next target in turn, so two requests
 * of one client (GET /token, then PUT /job) usually land on different replicas — the incident.
 * A target that refuses the connection answers 502 (HTTP) or a 502 status line (upgrade).
 *
 * This is the only module of the tests that imports http-proxy (STACK.md: wrap it in one place).
 */
import http from 'node:http';
import type { Socket } from 'node:net';
import httpProxy from 'http-proxy';
import { listenLocal } from './listen-local.js';

export interface Balancer {
  /** `http://127.0.0.1:PORT`, no trailing slash. */
  url: string;
  /** Requests (HTTP and upgrades) sent to each target so far, by target URL. */
  counts: Record<string, number>;
  /** Replace the targets (add/remove replicas at run time); takes effect for the next request. */
  setTargets(targets: string[]): void;
  targets(): string[];
  close(): Promise<void>;
}

export interface BalancerOptions {
  mode: 'round-robin';
}

function normalise(target: string): string {
  return target.replace(/\/+$/, '');
}

export async function startBalancer(targets: string[], opts: BalancerOptions = { mode: 'round-robin' }): Promise<Balancer> {
  if (opts.mode !== 'round-robin') throw new Error(`unknown balancer mode ${String(opts.mode)}`);
  let list = targets.map(normalise);
  let next = 0;
  const counts: Record<string, number> = {};

  const pick = (): string | undefined => {
    if (list.length === 0) return undefined;
    const target = list[next % list.length]!;
    next = (next + 1) % list.length;
    counts[target] = (counts[target] ?? 0) + 1;
    return target;
  };

  // No keep-alive towards the targets: each proxied request is its own connection, like the
  // balancers in front of the old execservers (which send Connection: close anyway).
  const agent = new http.Agent({ keepAlive: false });
  const proxy = httpProxy.createProxyServer({ agent, ws: true, xfwd: true });
  // Without a listener http-proxy re-throws target errors; each call passes its own callback.
  proxy.on('error', () => undefined);

  const server = http.createServer((req, res) => {
    const target = pick();
    if (target === undefined) {
      res.writeHead(502, { 'content-type': 'text/plain', connection: 'close' }).end('no targets\n');
      return;
    }
    proxy.web(req, res, { target }, (err) => {
      if (!res.headersSent) {
        res.writeHead(502, { 'content-type': 'text/plain', connection: 'close' });
        res.end(`bad gateway: ${(err as NodeJS.ErrnoException).code ?? err.message}\n`);
      } else {
        res.destroy();
      }
    });
  });
  server.on('upgrade', (req: http.IncomingMessage, socket: Socket, head: Buffer) => {
    socket.on('error', () => undefined);
    const target = pick();
    const refuse = (): void => {
      if (socket.writable) socket.end('HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
      else socket.destroy();
    };
    if (target === undefined) return refuse();
    proxy.ws(req, socket, head, { target }, refuse);
  });

  const listener = await listenLocal(server);

  return {
    url: listener.url,
    counts,
    setTargets(ts) {
      list = ts.map(normalise);
      next = list.length === 0 ? 0 : next % list.length;
    },
    targets: () => [...list],
    async close() {
      const closed = listener.close();
      proxy.close();
      agent.destroy();
      await closed;
    },
  };
}
