/**
 * Network tools for the failure matrix:
 *  - `startFreezableProxy`: a TCP forwarder whose existing connections can be frozen: bytes stop
 *    flowing both ways while both sockets stay open (a half-open connection, as after a NAT
 *    timeout or a dead peer without RST). Connections opened after the freeze pass normally.
 *  - `freePort`: a port nothing listens on, for a server that must come back on the same one.
 *  - `metricValue`: one sample of a Prometheus text exposition.
 */
import net from 'node:net';

export interface FreezableProxy {
  url: string;
  /** Connections accepted so far. */
  readonly accepted: number;
  /** Freezes every connection open now. */
  freeze(): number;
  close(): Promise<void>;
}

export async function startFreezableProxy(upstream: string): Promise<FreezableProxy> {
  const target = new URL(upstream);
  const pairs = new Set<{ a: net.Socket; b: net.Socket; frozen: boolean }>();
  let accepted = 0;
  const server = net.createServer((down) => {
    accepted++;
    const up = net.connect(Number(target.port), target.hostname);
    const pair = { a: down, b: up, frozen: false };
    pairs.add(pair);
    const forward = (from: net.Socket, to: net.Socket): void => {
      from.on('data', (chunk: Buffer) => {
        if (!pair.frozen) to.write(chunk);
      });
    };
    forward(down, up);
    forward(up, down);
    const end = (): void => {
      pairs.delete(pair);
      down.destroy();
      up.destroy();
    };
    for (const s of [down, up]) {
      s.on('error', end);
      s.on('close', () => {
        // A frozen connection stays half-open: the other side only learns by its own timeout.
        if (!pair.frozen) end();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    get accepted() {
      return accepted;
    },
    freeze() {
      let n = 0;
      for (const p of pairs) {
        if (!p.frozen) n++;
        p.frozen = true;
      }
      return n;
    },
    async close() {
      for (const p of pairs) {
        p.a.destroy();
        p.b.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** The sum of the samples of `name` whose labels include every one of `labels`. */
export function metricValue(text: string, name: string, labels: Record<string, string> = {}): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const m = /^[^{ ]+(?:\{([^}]*)\})? ([0-9.e+-]+)$/.exec(line);
    if (!m) continue;
    const have = Object.fromEntries([...(m[1] ?? '').matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => have[k] === v)) sum += Number(m[2]);
  }
  return sum;
}

export async function metricsOf(url: string): Promise<string> {
  return (await fetch(`${url}/metrics`)).text();
}
