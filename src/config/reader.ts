/**
 * Small path-aware readers for validating parsed YAML. Each throws a ConfigError naming the full
 * dotted key and what is wrong with it, so a bad configuration stops the start with one line.
 */
import { ConfigError } from './config-error.js';

export type Raw = Record<string, unknown>;

export function isRecord(v: unknown): v is Raw {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'string') return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}…` : v);
  if (typeof v === 'object') return 'a mapping';
  return String(v);
}

export function join(path: string, key: string): string {
  return path === '' ? key : `${path}.${key}`;
}

export function rejectUnknownKeys(raw: Raw, path: string, known: readonly string[]): void {
  for (const k of Object.keys(raw)) {
    if (!known.includes(k)) {
      throw new ConfigError(join(path, k), `unknown key (known here: ${known.join(', ')})`);
    }
  }
}

export function mapping(v: unknown, key: string, fallback?: Raw): Raw {
  if (v === undefined || v === null) {
    if (fallback !== undefined) return fallback;
    throw new ConfigError(key, 'is required (a mapping)');
  }
  if (!isRecord(v)) throw new ConfigError(key, `must be a mapping, got ${describe(v)}`);
  return v;
}

export function list(v: unknown, key: string, fallback?: unknown[]): unknown[] {
  if (v === undefined || v === null) {
    if (fallback !== undefined) return fallback;
    throw new ConfigError(key, 'is required (a list)');
  }
  if (!Array.isArray(v)) throw new ConfigError(key, `must be a list, got ${describe(v)}`);
  return v;
}

export function string(v: unknown, key: string, fallback?: string): string {
  if (v === undefined || v === null) {
    if (fallback !== undefined) return fallback;
    throw new ConfigError(key, 'is required (a string)');
  }
  if (typeof v !== 'string') throw new ConfigError(key, `must be a string, got ${describe(v)}`);
  return v;
}

export function optionalString(v: unknown, key: string): string | null {
  if (v === undefined || v === null || v === '') return null;
  return string(v, key);
}

export function integer(v: unknown, key: string, opts: { min?: number; max?: number; fallback?: number } = {}): number {
  if (v === undefined || v === null) {
    if (opts.fallback !== undefined) return opts.fallback;
    throw new ConfigError(key, 'is required (an integer)');
  }
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) throw new ConfigError(key, `must be an integer, got ${describe(v)}`);
  if (opts.min !== undefined && v < opts.min) throw new ConfigError(key, `must be at least ${opts.min}, got ${v}`);
  if (opts.max !== undefined && v > opts.max) throw new ConfigError(key, `must be at most ${opts.max}, got ${v}`);
  return v;
}

export function boolean(v: unknown, key: string, fallback: boolean): boolean {
  if (v === undefined || v === null) return fallback;
  if (typeof v !== 'boolean') throw new ConfigError(key, `must be true or false, got ${describe(v)}`);
  return v;
}

export function httpUrl(v: unknown, key: string): string {
  const s = string(v, key);
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    throw new ConfigError(key, `must be an http(s) URL, got ${describe(s)}`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new ConfigError(key, `must be an http(s) URL, got ${describe(s)}`);
  return s.replace(/\/+$/, '');
}

/** `HOST:PORT`, `[v6]:PORT`, or a bare port. Port 0 picks a free one. */
export function listenAddress(v: unknown, key: string, fallback: string): { host: string; port: number } {
  const s = v === undefined || v === null ? fallback : typeof v === 'number' ? String(v) : string(v, key);
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(s) ?? /^()()(\d+)$/.exec(s);
  if (!m) throw new ConfigError(key, `must be HOST:PORT, got ${describe(s)}`);
  const host = m[1] ?? m[2] ?? '';
  const port = Number(m[3]);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ConfigError(key, `port must be 0..65535, got ${m[3]}`);
  return { host: host === '' ? '127.0.0.1' : host, port };
}

/** Names used as map keys (waitgroups, services, commands) must be plain words. */
export function name(v: string, key: string): string {
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$/.test(v)) {
    throw new ConfigError(key, 'must be a name of letters, digits, "_", "-" or "." (at most 100)');
  }
  return v;
}
