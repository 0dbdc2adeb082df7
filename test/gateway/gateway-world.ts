/**
 * A gateway in front of real legacy execservers (legacy/execserver/), on real 127.0.0.1 sockets,
 * for the gateway tests. One world = N old execservers with the same services (each may have its
 * own waitgroup sizes) + one or more gateways listing them as backends.
 */
import { type LegacyExecserver, startLegacyExecserver } from '../../legacy/execserver/legacy-execserver.js';
import type { Clock } from '../../src/clock.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { ServeConfig } from '../../src/config/types.js';
import type { Execserver } from '../../src/execserver/server.js';
import { createGateway } from '../../src/gateway/gateway.js';

export interface Teardown {
  teardown(fn: () => unknown): void;
}

/** The commands of every legacy backend in these tests (the services of test/helpers/broker-peer.ts `jobs`). */
export const BACKEND_COMMANDS = {
  sleep: { prog: 'sleep' },
  echo: { prog: 'echo' },
  cat: { prog: 'cat' },
  // `fail N`: N bytes of "x\n"-ish output on stdout, then exit 3.
  fail: { prog: '/bin/sh', args: ['-c', 'head -c "$1" /dev/zero | tr "\\0" x; exit 3', 'fail'] },
  sh: { prog: '/bin/sh', args: ['-c'] },
};

/** Every service in waitgroup `w` unless a test says otherwise. */
export const SERVICES = {
  sleep: { waitgroup: 'w', commands: ['sleep'] },
  echo: { waitgroup: 'w', commands: ['echo'] },
  cat: { waitgroup: 'w', commands: ['cat'] },
  fail: { waitgroup: 'w', commands: ['fail'] },
  sh: { waitgroup: 'w', commands: ['sh'] },
  other: { waitgroup: 'w', commands: ['echo'] },
};

export const SECRET = 'test-secret-shared-by-replicas';

export interface BackendSpec {
  waitgroups?: Record<string, number>;
  tokenResponseSendServerIP?: boolean;
  clock?: Clock;
}

export function backendConfig(spec: BackendSpec, services: Record<string, unknown> = SERVICES): ServeConfig {
  return parseServeConfig({
    listen: '127.0.0.1:0',
    name: 'old-exec',
    waitgroups: spec.waitgroups ?? { w: 2 },
    commands: BACKEND_COMMANDS,
    services,
    tokenResponseSendServerIP: spec.tokenResponseSendServerIP ?? false,
  });
}

export async function startBackend(t: Teardown, spec: BackendSpec = {}, services?: Record<string, unknown>): Promise<LegacyExecserver> {
  const s = await startLegacyExecserver(backendConfig(spec, services), spec.clock ? { clock: spec.clock } : {});
  t.teardown(() => s.close());
  return s;
}

export interface GatewaySpec {
  backends: (string | { url: string; waitgroups?: Record<string, number> })[];
  waitgroups?: Record<string, number>;
  services?: Record<string, unknown>;
  gateway?: { secret?: string; advertised_url?: string; poll_interval_ms?: number };
  broker?: Record<string, number>;
  clock?: Clock;
}

export function gatewayConfig(spec: GatewaySpec): ServeConfig {
  return parseServeConfig({
    listen: '127.0.0.1:0',
    name: 'gw',
    waitgroups: spec.waitgroups ?? { w: 2 },
    services: spec.services ?? SERVICES,
    backends: spec.backends,
    gateway: { secret: SECRET, poll_interval_ms: 100, ...spec.gateway },
    broker: { offer_timeout_ms: 5000, ...spec.broker },
  });
}

export interface RunningGateway {
  server: Execserver;
  url: string;
}

export async function startGateway(t: Teardown, spec: GatewaySpec): Promise<RunningGateway> {
  const server = await createGateway({ config: gatewayConfig(spec), ...(spec.clock ? { clock: spec.clock } : {}) });
  const url = await server.listen();
  t.teardown(() => server.close());
  return { server, url };
}

/** Token requests a legacy backend answered so far (any status). */
export function tokenRequests(b: LegacyExecserver): number {
  return Object.values(b.counters.requests.token).reduce((a, n) => a + n, 0);
}

/** Every request a legacy backend answered so far (any route, any status). */
export function allRequests(b: LegacyExecserver): number {
  return Object.values(b.counters.requests).reduce((a, byStatus) => a + Object.values(byStatus).reduce((x, n) => x + n, 0), 0);
}

/** Lets pending I/O callbacks and microtasks run (a few event-loop turns), without waiting for time. */
export async function turns(n = 5): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}
