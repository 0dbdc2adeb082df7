/**
 * A `slotgate <command> --config FILE` child process, started from bin/slotgate.js exactly as an
 * operator would, resolved once it printed its "listening" line; plus /proc readings of it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { stringify } from 'yaml';

const CLI = fileURLToPath(new URL('../../bin/slotgate.js', import.meta.url));

export interface ServeChild {
  child: ChildProcess;
  pid: number;
  url: string;
  stop(): Promise<void>;
}

export async function startServeChild(command: 'serve' | 'legacy-execserver', config: unknown): Promise<ServeChild> {
  const dir = mkdtempSync(join(tmpdir(), 'slotgate-bench-'));
  const file = join(dir, 'config.yml');
  writeFileSync(file, stringify(config));
  const child = spawn(process.execPath, [CLI, command, '--config', file], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  const exited = once(child, 'exit');
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        const j = JSON.parse(line) as { msg?: string; url?: string };
        if (j.msg === 'listening' && typeof j.url === 'string') resolve(j.url);
      } catch {
        /* not JSON */
      }
    });
    void exited.then(() => reject(new Error(`slotgate ${command} exited before listening: ${stderr}`)));
  });
  return {
    child,
    pid: child.pid as number,
    url,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGKILL');
      await exited;
    },
  };
}

/** A field of /proc/<pid>/status in bytes (VmRSS, VmHWM, ...). */
export function procStatusBytes(pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const text = readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(text);
  if (!m) throw new Error(`no ${field} in /proc/${pid}/status`);
  return Number(m[1]) * 1024;
}
