/**
 * The environment a command runs in: a minimal one, never the server's own (which may hold
 * credentials), plus the command's configured `env` (PROTOCOL.md §3).
 */
import type { CommandConfig } from '../config/types.js';

export const MINIMAL_PATH = '/usr/local/bin:/usr/bin:/bin';

function splitEntry(entry: string): [string, string] | null {
  const eq = entry.indexOf('=');
  if (eq <= 0) return null;
  return [entry.slice(0, eq), entry.slice(eq + 1)];
}

/** PATH, HOME and TMPDIR (the job's temp dir), LANG, then the configured entries (they win). */
export function commandEnv(cmd: CommandConfig, tmpDir: string): Record<string, string> {
  const env: Record<string, string> = {
    PATH: MINIMAL_PATH,
    HOME: tmpDir,
    TMPDIR: tmpDir,
    LANG: 'C.UTF-8',
  };
  for (const entry of cmd.env) {
    const kv = splitEntry(entry);
    if (kv !== null) env[kv[0]] = kv[1];
  }
  return env;
}

/** The VALUE parts of every configured `env` entry of these commands. */
export function envValues(commands: Record<string, CommandConfig>): string[] {
  const out: string[] = [];
  for (const cmd of Object.values(commands)) {
    for (const entry of cmd.env) {
      const kv = splitEntry(entry);
      if (kv !== null) out.push(kv[1]);
    }
  }
  return out;
}
