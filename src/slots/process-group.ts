/**
 * One command as its own process group (spawned detached, so its pid is the group id), so that
 * stopping it reaches every process it started, not only the leader.
 *
 *   running --stop()--> SIGTERM to the group --killGraceMs--> SIGKILL to the group
 *      |                       |
 *      +---- leader exits -----+--> SIGKILL to what is left of the group, then `done` settles
 *                                   once stdout and stderr are closed
 *
 * Nothing of a command outlives it: when the leader exits (for any reason), processes it left
 * behind in its group are killed, so a stray background process can neither hold the job's
 * stdout open nor keep running after the job's temp dir is gone.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import type { Clock, TimerHandle } from '../clock.js';

export const DEFAULT_KILL_GRACE_MS = 2000;

export interface ProcessOutcome {
  /** null when the process was killed by a signal or never started. */
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  /** Set when the program could not be started at all. */
  spawnError: Error | null;
}

export interface SpawnGroupOptions {
  cwd: string;
  env: Record<string, string>;
  /** 'pipe': the caller writes stdin; 'ignore': /dev/null. */
  stdin: 'pipe' | 'ignore';
  clock: Clock;
  killGraceMs: number;
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // ESRCH: the group is already gone.
  }
}

export class ProcessGroup {
  readonly child: ChildProcess;
  readonly stdout: Readable;
  readonly stderr: Readable;
  /** null when stdin is 'ignore'. */
  readonly stdin: Writable | null;
  /** Settles (never rejects) when the leader has exited and stdout/stderr are closed. */
  readonly done: Promise<ProcessOutcome>;

  readonly #clock: Clock;
  readonly #killGraceMs: number;
  #exited = false;
  #stopping = false;
  #graceTimer: TimerHandle | undefined;

  constructor(file: string, args: string[], opts: SpawnGroupOptions) {
    this.#clock = opts.clock;
    this.#killGraceMs = opts.killGraceMs;
    this.child = spawn(file, args, {
      cwd: opts.cwd,
      env: opts.env,
      detached: true,
      stdio: [opts.stdin, 'pipe', 'pipe'],
    });
    this.stdout = this.child.stdout as Readable;
    this.stderr = this.child.stderr as Readable;
    this.stdin = this.child.stdin;
    let spawnError: Error | null = null;
    this.child.on('error', (e) => {
      if (this.child.pid === undefined) spawnError = e;
    });
    this.child.on('exit', () => {
      this.#exited = true;
      this.#clock.clearTimeout(this.#graceTimer);
      this.#graceTimer = undefined;
      this.#killLeftovers();
      if (this.#stopping) this.#releaseStdio();
    });
    this.done = new Promise((resolve) => {
      this.child.on('close', (code, signal) => {
        this.#clock.clearTimeout(this.#graceTimer);
        this.#graceTimer = undefined;
        resolve({ exitCode: spawnError === null ? code : null, signal, spawnError });
      });
    });
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** SIGTERM to the whole group; SIGKILL after the grace if the leader is still there. */
  stop(): void {
    if (this.#stopping) return;
    this.#stopping = true;
    const pid = this.child.pid;
    if (pid === undefined) return;
    if (this.#exited) {
      this.#killLeftovers();
      this.#releaseStdio();
      return;
    }
    signalGroup(pid, 'SIGTERM');
    this.#graceTimer = this.#clock.setTimeout(() => {
      this.#graceTimer = undefined;
      signalGroup(pid, 'SIGKILL');
    }, this.#killGraceMs);
  }

  #killLeftovers(): void {
    // The leader is reaped; its pid stays the group id while any member lives.
    if (this.child.pid !== undefined) signalGroup(this.child.pid, 'SIGKILL');
  }

  /** A process outside the group may still hold our pipes; a stopped job does not wait for it. */
  #releaseStdio(): void {
    this.stdout.destroy();
    this.stderr.destroy();
    this.stdin?.destroy();
  }
}
