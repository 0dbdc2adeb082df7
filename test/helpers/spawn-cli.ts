import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { readdirSync, readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export const CLI = fileURLToPath(new URL('../../bin/slotgate.js', import.meta.url));

export interface CliProcess {
  child: ChildProcess;
  /** The url of the "listening" line. */
  url: string;
  /** Every stdout line so far (JSON lines are the log). */
  lines: string[];
  stderr: () => string;
  /** Resolves with the exit code (or signal name). */
  exited: Promise<number | string>;
  /** Sends `signal` (default SIGTERM) to the process only; resolves once it exited. */
  kill(signal?: NodeJS.Signals): Promise<number | string>;
  /**
   * A crash, as when a pod dies: SIGKILLs the process and every process it started (job
   * processes run in process groups of their own and would outlive a plain `kill('SIGKILL')`).
   * Resolves once it exited.
   */
  crash(): Promise<number | string>;
}

/** The pids of every descendant of `pid` (from /proc), deepest last. */
function descendants(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      const list = children.get(ppid) ?? [];
      list.push(Number(entry));
      children.set(ppid, list);
    } catch {
      /* gone meanwhile */
    }
  }
  const out: number[] = [];
  const walk = (p: number): void => {
    for (const c of children.get(p) ?? []) {
      out.push(c);
      walk(c);
    }
  };
  walk(pid);
  return out;
}

function killQuietly(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    /* already gone */
  }
}

/**
 * Starts `slotgate ARGS...` and resolves once it printed its `"msg": "listening"` line. Rejects
 * with its stderr if it exits first. With `t`, a process still running at teardown is crashed
 * (`crash()`: with its job processes).
 */
export async function startCli(args: string[], opts: { env?: NodeJS.ProcessEnv; t?: { teardown(fn: () => unknown): void } } = {}): Promise<CliProcess> {
  const child = spawn(process.execPath, [CLI, ...args], { env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  const lines: string[] = [];
  const exited = once(child, 'exit').then(([code, signal]) => (code ?? signal) as number | string);
  const url = await new Promise<string>((resolve, reject) => {
    const rl = createInterface({ input: child.stdout! });
    rl.on('line', (line) => {
      lines.push(line);
      try {
        const j = JSON.parse(line) as { msg?: string; url?: string };
        if (j.msg === 'listening' && typeof j.url === 'string') resolve(j.url);
      } catch {
        /* not a JSON line */
      }
    });
    void exited.then((code) => reject(new Error(`slotgate ${args.join(' ')} exited (${code}) before listening:\n${stderr}`)));
  });
  const proc: CliProcess = {
    child,
    url,
    lines,
    stderr: () => stderr,
    exited,
    async kill(signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
    async crash() {
      const pid = child.pid;
      if (pid === undefined || child.exitCode !== null || child.signalCode !== null) return exited;
      // Stopped first, so that it cannot start another job while its children are collected.
      killQuietly(pid, 'SIGSTOP');
      for (const p of [pid, ...descendants(pid)]) killQuietly(p, 'SIGKILL');
      return exited;
    },
  };
  opts.t?.teardown(() => proc.crash());
  return proc;
}
