/**
 * Loads and validates YAML configuration (PROTOCOL.md §6). Everything that can be wrong is
 * reported as a ConfigError naming the dotted key, before anything starts listening.
 */
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { ConfigError } from './config-error.js';
import { DEFAULT_SERVE_CONFIG_YAML } from './default-config.js';
import * as r from './reader.js';
import {
  BROKER_DEFAULTS,
  type BackendConfig,
  type CommandConfig,
  type FylrConfig,
  LEGACY_TOKEN_TTL_MS,
  type ServeConfig,
  type ServiceConfig,
} from './types.js';

export function parseYamlText(text: string, source: string): unknown {
  try {
    return parseYaml(text);
  } catch (e) {
    throw new ConfigError(source, `is not valid YAML: ${(e as Error).message.split('\n')[0]}`);
  }
}

export function readConfigFile(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new ConfigError('--config', `cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  return parseYamlText(text, path);
}

function waitgroupMap(v: unknown, key: string, fallback?: Record<string, number>): Record<string, number> {
  const raw = r.mapping(v, key, fallback);
  const out: Record<string, number> = {};
  for (const [wg, n] of Object.entries(raw)) {
    out[r.name(wg, r.join(key, wg))] = r.integer(n, r.join(key, wg), { min: 0, max: 100_000 });
  }
  return out;
}

function envList(v: unknown, key: string): string[] {
  return r.list(v, key, []).map((e, i) => {
    const s = r.string(e, `${key}[${i}]`);
    if (!/^[A-Za-z_][A-Za-z0-9_]*=/.test(s)) throw new ConfigError(`${key}[${i}]`, 'must be KEY=VALUE');
    return s;
  });
}

function commandMap(v: unknown, key: string): Record<string, CommandConfig> {
  const raw = r.mapping(v, key, {});
  const out: Record<string, CommandConfig> = {};
  for (const [cmd, def] of Object.entries(raw)) {
    const k = r.join(key, r.name(cmd, r.join(key, cmd)));
    const d = r.mapping(def, k);
    r.rejectUnknownKeys(d, k, ['prog', 'args', 'env']);
    const prog = r.string(d.prog, `${k}.prog`);
    if (prog === '') throw new ConfigError(`${k}.prog`, 'must not be empty');
    out[cmd] = {
      prog,
      args: r.list(d.args, `${k}.args`, []).map((a, i) => (typeof a === 'number' ? String(a) : r.string(a, `${k}.args[${i}]`))),
      env: envList(d.env, `${k}.env`),
    };
  }
  return out;
}

function serviceMap(
  v: unknown,
  key: string,
  waitgroups: Record<string, number>,
  commands: Record<string, CommandConfig> | null,
): Record<string, ServiceConfig> {
  const raw = r.mapping(v, key);
  const out: Record<string, ServiceConfig> = {};
  for (const [svc, def] of Object.entries(raw)) {
    const k = r.join(key, r.name(svc, r.join(key, svc)));
    const d = r.mapping(def, k);
    r.rejectUnknownKeys(d, k, ['waitgroup', 'commands']);
    const wg = r.string(d.waitgroup, `${k}.waitgroup`);
    if (!Object.hasOwn(waitgroups, wg)) {
      throw new ConfigError(`${k}.waitgroup`, `names no waitgroup (have: ${Object.keys(waitgroups).join(', ') || 'none'})`);
    }
    const cmds = r.list(d.commands, `${k}.commands`, []).map((c, i) => r.string(c, `${k}.commands[${i}]`));
    if (commands !== null) {
      cmds.forEach((c, i) => {
        if (!Object.hasOwn(commands, c)) throw new ConfigError(`${k}.commands[${i}]`, `names no entry of commands: ${JSON.stringify(c)}`);
      });
    }
    out[svc] = { waitgroup: wg, commands: cmds };
  }
  return out;
}

function backendList(v: unknown, key: string): BackendConfig[] {
  return r.list(v, key, []).map((b, i) => {
    const k = `${key}[${i}]`;
    const d = typeof b === 'string' ? { url: b } : r.mapping(b, k);
    r.rejectUnknownKeys(d, k, ['url', 'waitgroups']);
    const backend: BackendConfig = { url: r.httpUrl(d.url, `${k}.url`) };
    if (d.waitgroups !== undefined) backend.waitgroups = waitgroupMap(d.waitgroups, `${k}.waitgroups`);
    return backend;
  });
}

const SERVE_KEYS = [
  'listen', 'name', 'waitgroups', 'commands', 'services', 'backends', 'broker', 'gateway',
  'tokenResponseSendServerIP', 'default_timeout_sec',
] as const;

/** Validates a parsed `slotgate serve` / `legacy-execserver` configuration. */
export function parseServeConfig(raw: unknown, overrides: { listen?: string } = {}): ServeConfig {
  const root = r.mapping(raw ?? {}, '(root)', {});
  r.rejectUnknownKeys(root, '', SERVE_KEYS);
  const backends = backendList(root.backends, 'backends');
  const waitgroups = waitgroupMap(root.waitgroups, 'waitgroups');
  backends.forEach((b, i) => {
    for (const wg of Object.keys(b.waitgroups ?? {})) {
      if (!Object.hasOwn(waitgroups, wg)) throw new ConfigError(`backends[${i}].waitgroups.${wg}`, 'names no top-level waitgroup');
    }
  });
  // A gateway relays jobs to its backends, which run their own commands.
  const commands = backends.length > 0 ? {} : commandMap(root.commands, 'commands');
  const services = serviceMap(root.services, 'services', waitgroups, backends.length > 0 ? null : commands);

  const brokerRaw = r.mapping(root.broker, 'broker', {});
  r.rejectUnknownKeys(brokerRaw, 'broker', Object.keys(BROKER_DEFAULTS));
  const broker = {
    offer_timeout_ms: r.integer(brokerRaw.offer_timeout_ms, 'broker.offer_timeout_ms', { min: 1, max: 3_600_000, fallback: BROKER_DEFAULTS.offer_timeout_ms }),
    ping_interval_ms: r.integer(brokerRaw.ping_interval_ms, 'broker.ping_interval_ms', { min: 10, max: 3_600_000, fallback: BROKER_DEFAULTS.ping_interval_ms }),
    max_wants_per_connection: r.integer(brokerRaw.max_wants_per_connection, 'broker.max_wants_per_connection', { min: 1, fallback: BROKER_DEFAULTS.max_wants_per_connection }),
    max_payload_bytes: r.integer(brokerRaw.max_payload_bytes, 'broker.max_payload_bytes', { min: 1024, max: 1 << 30, fallback: BROKER_DEFAULTS.max_payload_bytes }),
  };
  if (backends.length > 0 && broker.offer_timeout_ms >= LEGACY_TOKEN_TTL_MS) {
    // The offered slot is a legacy token: the offer must lapse before the token does.
    throw new ConfigError('broker.offer_timeout_ms', `must be below the legacy token lifetime of ${LEGACY_TOKEN_TTL_MS} ms on a gateway`);
  }

  const gwRaw = r.mapping(root.gateway, 'gateway', {});
  r.rejectUnknownKeys(gwRaw, 'gateway', ['secret', 'advertised_url', 'poll_interval_ms']);
  const secret = r.string(gwRaw.secret, 'gateway.secret', '');
  const gateway = {
    secret,
    advertised_url: gwRaw.advertised_url === undefined || gwRaw.advertised_url === null ? null : r.httpUrl(gwRaw.advertised_url, 'gateway.advertised_url'),
    poll_interval_ms: r.integer(gwRaw.poll_interval_ms, 'gateway.poll_interval_ms', { min: 10, max: 600_000, fallback: 1000 }),
  };

  return {
    listen: r.listenAddress(overrides.listen ?? root.listen, overrides.listen !== undefined ? '--listen' : 'listen', '127.0.0.1:8083'),
    name: r.string(root.name, 'name', 'slotgate'),
    waitgroups,
    commands,
    services,
    backends,
    broker,
    gateway,
    tokenResponseSendServerIP: r.boolean(root.tokenResponseSendServerIP, 'tokenResponseSendServerIP', false),
    default_timeout_sec: r.integer(root.default_timeout_sec, 'default_timeout_sec', { min: 1, fallback: 3600 }),
  };
}

/** `slotgate serve --config FILE`, or the embedded default without one. */
export function loadServeConfig(path: string | undefined, overrides: { listen?: string } = {}): ServeConfig {
  const raw = path === undefined ? parseYamlText(DEFAULT_SERVE_CONFIG_YAML, '(embedded default)') : readConfigFile(path);
  return parseServeConfig(raw, overrides);
}

const FYLR_KEYS = ['listen', 'name', 'execserver', 'database'] as const;
const EXECSERVER_KEYS = [
  'addresses', 'connectTimeoutSec', 'callbackBackendInternalURL', 'callbackBackendOwnURL',
  'parallel', 'parallelHigh', 'reprobe_interval_ms', 'max_connections_per_address',
] as const;

/** Validates a `slotgate fylr` / `legacy-fylr` configuration. */
export function parseFylrConfig(raw: unknown, overrides: { listen?: string } = {}): FylrConfig {
  const root = r.mapping(raw ?? {}, '(root)', {});
  r.rejectUnknownKeys(root, '', FYLR_KEYS);
  const ex = r.mapping(root.execserver, 'execserver');
  r.rejectUnknownKeys(ex, 'execserver', EXECSERVER_KEYS);
  const addresses = r.list(ex.addresses, 'execserver.addresses').map((a, i) => r.httpUrl(a, `execserver.addresses[${i}]`));
  if (addresses.length === 0) throw new ConfigError('execserver.addresses', 'must list at least one execserver');
  const database = root.database === undefined || root.database === null ? null : r.string(root.database, 'database');
  if (database !== null && !/^postgres(ql)?:\/\//.test(database)) throw new ConfigError('database', 'must be a postgres:// URL');
  return {
    listen: r.listenAddress(overrides.listen ?? root.listen, overrides.listen !== undefined ? '--listen' : 'listen', '127.0.0.1:8081'),
    name: r.string(root.name, 'name', 'fylr'),
    execserver: {
      addresses,
      connectTimeoutSec: r.integer(ex.connectTimeoutSec, 'execserver.connectTimeoutSec', { min: 1, max: 86_400, fallback: 60 }),
      callbackBackendInternalURL: ex.callbackBackendInternalURL === undefined || ex.callbackBackendInternalURL === null ? null : r.httpUrl(ex.callbackBackendInternalURL, 'execserver.callbackBackendInternalURL'),
      callbackBackendOwnURL: ex.callbackBackendOwnURL === undefined || ex.callbackBackendOwnURL === null ? null : r.httpUrl(ex.callbackBackendOwnURL, 'execserver.callbackBackendOwnURL'),
      parallel: r.integer(ex.parallel, 'execserver.parallel', { min: 1, max: 10_000, fallback: 18 }),
      parallelHigh: r.integer(ex.parallelHigh, 'execserver.parallelHigh', { min: 0, max: 10_000, fallback: 10 }),
      reprobe_interval_ms: r.integer(ex.reprobe_interval_ms, 'execserver.reprobe_interval_ms', { min: 100, fallback: 60_000 }),
      max_connections_per_address: r.integer(ex.max_connections_per_address, 'execserver.max_connections_per_address', { min: 1, max: 64, fallback: 8 }),
    },
    database,
  };
}

/**
 * Keys of a fylr configuration that only `slotgate legacy-fylr` reads: the new fylr's dispatcher
 * sizes its claims from the execservers' free slots (docs/dispatcher.md). An operator who copied
 * an old `fylr.yml` hears so at start-up instead of expecting them to bound the work.
 */
export function legacyOnlyFylrKeys(raw: unknown): string[] {
  const ex = raw !== null && typeof raw === 'object' ? (raw as { execserver?: unknown }).execserver : undefined;
  if (ex === null || typeof ex !== 'object') return [];
  return (['parallel', 'parallelHigh'] as const).filter((k) => (ex as Record<string, unknown>)[k] !== undefined).map((k) => `execserver.${k}`);
}

export function loadFylrConfig(path: string, overrides: { listen?: string } = {}): FylrConfig {
  return parseFylrConfig(readConfigFile(path), overrides);
}
