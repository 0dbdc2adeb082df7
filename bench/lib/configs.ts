/**
 * Server configurations the scenarios use, as raw YAML-shaped objects (they cross the IPC
 * channel to the bench host and go through the real `parseServeConfig` there).
 */

export interface RawServeConfig {
  listen: string;
  name: string;
  waitgroups: Record<string, number>;
  commands?: Record<string, { prog: string; args?: string[]; env?: string[] }>;
  services: Record<string, { waitgroup: string; commands?: string[] }>;
  backends?: { url: string; waitgroups?: Record<string, number> }[];
  broker?: Record<string, number>;
  gateway?: Record<string, unknown>;
}

const COMMANDS = {
  sleep: { prog: 'sleep' },
  cat: { prog: 'cat' },
};

/** One waitgroup `wg` of `processes` slots serving `noop` (no-command jobs), `sleep` and `cat`. */
export function singleGroup(name: string, processes: number, broker: Record<string, number> = {}): RawServeConfig {
  return {
    listen: '127.0.0.1:0',
    name,
    waitgroups: { wg: processes },
    commands: COMMANDS,
    services: {
      noop: { waitgroup: 'wg', commands: [] },
      sleep: { waitgroup: 'wg', commands: ['sleep'] },
      cat: { waitgroup: 'wg', commands: ['cat'] },
    },
    broker,
  };
}

/** `lanes` independent waitgroups of one slot each (lane i: waitgroup wg<i>, services noop<i>, sleep<i>). */
export function lanes(name: string, count: number): RawServeConfig {
  const waitgroups: Record<string, number> = {};
  const services: RawServeConfig['services'] = {};
  for (let i = 0; i < count; i++) {
    waitgroups[`wg${i}`] = 1;
    services[`noop${i}`] = { waitgroup: `wg${i}`, commands: [] };
    services[`sleep${i}`] = { waitgroup: `wg${i}`, commands: ['sleep'] };
  }
  return { listen: '127.0.0.1:0', name, waitgroups, commands: COMMANDS, services };
}

/** A gateway in front of `backends`, with the same waitgroups and services as `like`. */
export function gatewayFor(like: RawServeConfig, backends: string[], name = 'gateway'): RawServeConfig {
  const services: RawServeConfig['services'] = {};
  for (const [svc, def] of Object.entries(like.services)) services[svc] = { waitgroup: def.waitgroup };
  return {
    listen: '127.0.0.1:0',
    name,
    waitgroups: like.waitgroups,
    services,
    backends: backends.map((url) => ({ url })),
    broker: { offer_timeout_ms: 5000 },
    gateway: { secret: 'bench-secret-bench-secret-bench-secret' },
  };
}
