import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
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
  kill(signal?: NodeJS.Signals): Promise<number | string>;
}

/**
 * Starts `slotgate ARGS...` and resolves once it printed its `"msg": "listening"` line. Rejects
 * with its stderr if it exits first.
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
  };
  opts.t?.teardown(() => proc.kill('SIGKILL'));
  return proc;
}
