/**
 * Runs one job (PROTOCOL.md §3) and produces its receipt (§4). Shared by the native execserver,
 * the legacy execserver and the gateway's tests.
 *
 *   look up every prog (command_not_allowed: nothing runs)
 *   -> fresh temp dir -> download file_in -> for each command: spawn its own process group,
 *      stdin from the StdinSource (first stdin-body command), body stdout through BodyOutput
 *      (the 4000-byte commit rule), upload its file_out after it succeeded
 *   -> success: finish the body stream and wait for the peer; failure: abort a committed stream
 *   -> remove the temp dir -> receipt
 *
 * The first failure decides the receipt (`fail()`); it also stops whatever is running. The job
 * timeout and the AbortSignal are failures like any other (timed_out, stopped). runJob never
 * rejects.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { Clock } from '../clock.js';
import type { CommandConfig } from '../config/types.js';
import { type ErrorCode, SlotgateError, isErrorCode } from '../errors.js';
import {
  type CommandResult,
  type JobCommand,
  type JobSpec,
  type Receipt,
  type ReceiptError,
  STDOUT_PREFIX_BYTES,
  failedReceipt,
  okReceipt,
} from '../protocol/job.js';
import { downloadFile, uploadFile } from './job-files.js';
import { commandEnv, envValues } from './job-env.js';
import { Redactor } from './job-redact.js';
import { BodyOutput, type StdoutSink } from './output-body.js';
import { PrefixCapture, TailCapture, decodeUtf8Prefix } from './output-capture.js';
import { DEFAULT_KILL_GRACE_MS, ProcessGroup } from './process-group.js';

export type { StdoutSink } from './output-body.js';

export interface StdinSource {
  /** Opened once, lazily, for the first command with stdin {type:'body'}. */
  open(): Promise<NodeJS.ReadableStream | Readable>;
}

export interface RunOptions {
  /** ONLY the commands configured for the job's service (the caller filters by services[svc].commands). */
  commands: Record<string, CommandConfig>;
  clock: Clock;
  /** Cancels the job: the process group is stopped, the receipt says stopped, error.code 'stopped'. */
  signal?: AbortSignal;
  /** Absent: commands with stdin body get an empty stdin. */
  stdin?: StdinSource;
  /** Absent: body stdout only goes into the receipt's stdout_prefix. */
  stdout?: StdoutSink;
  /** When job.timeout_sec is absent. */
  defaultTimeoutSec: number;
  /** SIGTERM, then SIGKILL after this long (default 2000). */
  killGraceMs?: number;
  /** Where job temp dirs are made (default os.tmpdir()). */
  tmpRoot?: string;
}

/** Bytes of each command's stderr kept for `stderr_line`. */
export const STDERR_TAIL_BYTES = 8192;

function errorOf(e: unknown, fallback: ErrorCode): { code: ErrorCode; message: string } {
  if (e instanceof SlotgateError) return { code: e.code, message: e.message };
  const err = e as { code?: unknown; message?: unknown };
  const code = isErrorCode(err?.code) ? err.code : fallback;
  return { code, message: typeof err?.message === 'string' ? err.message : String(e) };
}

type Stream = NodeJS.ReadableStream | Readable;

function isFinished(s: Stream): boolean {
  const r = s as Partial<Readable>;
  return r.readableEnded === true || r.destroyed === true;
}

/**
 * Input left unread when the job ends is read and dropped, not destroyed: the source may be an
 * HTTP request whose socket must still carry the response (a legacy PUT /job).
 */
function drainStream(s: Stream): void {
  s.on('error', () => {});
  s.resume();
}

class JobRun {
  readonly #job: JobSpec;
  readonly #opts: RunOptions;
  readonly #clock: Clock;
  readonly #startedAt: number;
  readonly #redactor: Redactor;
  readonly #halt = new AbortController();
  readonly #hasBodyStdout: boolean;
  readonly #prefix = new PrefixCapture(STDOUT_PREFIX_BYTES);
  readonly #body: BodyOutput;
  #failure: { code: ErrorCode; message: string } | null = null;
  #timedOut = false;
  #stopped = false;
  #current: ProcessGroup | null = null;
  #results: CommandResult[] = [];
  #lastExit: number | null = null;
  #lastStderr: TailCapture | null = null;
  #outputBytes = 0;
  #stdinOpened = false;
  #stdinStream: Stream | null = null;

  constructor(job: JobSpec, opts: RunOptions) {
    this.#job = job;
    this.#opts = opts;
    this.#clock = opts.clock;
    this.#startedAt = opts.clock.now();
    this.#redactor = new Redactor(envValues(opts.commands));
    this.#hasBodyStdout = job.commands.some((c) => c.stdout?.type === 'body');
    this.#body = new BodyOutput(opts.stdout, (err) => this.#fail(err.code, err.message));
  }

  /** The first failure decides the receipt and stops everything still running. */
  #fail(code: ErrorCode, message: string): void {
    if (this.#failure !== null) return;
    this.#failure = { code, message };
    if (code === 'timed_out') this.#timedOut = true;
    if (code === 'stopped') this.#stopped = true;
    this.#halt.abort(new SlotgateError(code, message));
    this.#current?.stop();
    this.#body.fail(new SlotgateError(code, message));
  }

  async run(): Promise<Receipt> {
    const job = this.#job;
    if (job.commands.length === 0) return okReceipt(0);
    const configs: CommandConfig[] = [];
    for (const cmd of job.commands) {
      const cfg = Object.hasOwn(this.#opts.commands, cmd.prog) ? this.#opts.commands[cmd.prog] : undefined;
      if (cfg === undefined) {
        return failedReceipt('command_not_allowed', `command ${JSON.stringify(cmd.prog)} is not configured for service ${JSON.stringify(job.service)}`);
      }
      configs.push(cfg);
    }
    const signal = this.#opts.signal;
    if (signal?.aborted) {
      return { ...failedReceipt('stopped', 'job was cancelled before it started'), stopped: true };
    }

    const timeoutSec = job.timeout_sec ?? this.#opts.defaultTimeoutSec;
    const timer = this.#clock.setTimeout(() => this.#fail('timed_out', `job ran over its timeout of ${timeoutSec} s`), timeoutSec * 1000);
    const onAbort = (): void => this.#fail('stopped', 'job was cancelled');
    signal?.addEventListener('abort', onAbort, { once: true });
    let tmp: string | null = null;
    try {
      tmp = await mkdtemp(join(this.#opts.tmpRoot ?? tmpdir(), 'slotgate-job-'));
      await this.#execute(tmp, configs);
    } catch (e) {
      const { code, message } = errorOf(e, 'internal');
      this.#fail(code, message);
    } finally {
      this.#clock.clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      if (this.#stdinStream !== null && !isFinished(this.#stdinStream)) drainStream(this.#stdinStream);
      if (tmp !== null) await rm(tmp, { recursive: true, force: true }).catch(() => {});
    }
    return this.#receipt();
  }

  async #execute(tmp: string, configs: CommandConfig[]): Promise<void> {
    const job = this.#job;
    for (const cmd of job.commands) {
      for (const arg of cmd.args) {
        if (arg.type !== 'file_in') continue;
        if (this.#failure !== null) return;
        await downloadFile(arg.file, join(tmp, arg.file.name), this.#halt.signal);
      }
    }
    for (let i = 0; i < job.commands.length; i++) {
      if (this.#failure !== null) return;
      const cmd = job.commands[i] as JobCommand;
      if (!(await this.#runCommand(cmd, configs[i] as CommandConfig, tmp))) return;
      for (const arg of cmd.args) {
        if (arg.type !== 'file_out') continue;
        if (this.#failure !== null) return;
        await uploadFile(arg.file, join(tmp, arg.file.name), this.#halt.signal);
      }
    }
    if (this.#failure === null) await this.#body.finish();
  }

  readonly #onSourceError = (e: Error): void => this.#fail('pipe_in_failed', `reading stdin failed: ${e.message}`);

  /** Opens the StdinSource, unless the job is halted first. */
  async #openStdin(source: StdinSource): Promise<Stream | null> {
    const halted = this.#halt.signal;
    return new Promise<Stream | null>((resolve, reject) => {
      const onHalt = (): void => resolve(null);
      halted.addEventListener('abort', onHalt, { once: true });
      source.open().then(
        (s) => {
          halted.removeEventListener('abort', onHalt);
          s.on('error', this.#onSourceError);
          if (halted.aborted) {
            drainStream(s);
            resolve(null);
          } else resolve(s);
        },
        (e: unknown) => {
          halted.removeEventListener('abort', onHalt);
          reject(e);
        },
      );
    });
  }

  /** Runs one command to its end. True when it succeeded. */
  async #runCommand(cmd: JobCommand, cfg: CommandConfig, tmp: string): Promise<boolean> {
    const args = [...cfg.args, ...cmd.args.map((a) => (a.type === 'value' ? a.value : join(tmp, a.file.name)))];
    let source: Stream | null = null;
    const wantsStdin = cmd.stdin?.type === 'body';
    if (wantsStdin && !this.#stdinOpened) {
      this.#stdinOpened = true;
      if (this.#opts.stdin !== undefined) {
        try {
          source = await this.#openStdin(this.#opts.stdin);
        } catch (e) {
          this.#fail('pipe_in_failed', `opening stdin failed: ${(e as Error)?.message ?? String(e)}`);
          return false;
        }
        if (source === null) return false;
        this.#stdinStream = source;
      }
    }

    const startedAt = this.#clock.now();
    const pg = new ProcessGroup(cfg.prog, args, {
      cwd: tmp,
      env: commandEnv(cfg, tmp),
      stdin: wantsStdin ? 'pipe' : 'ignore',
      clock: this.#clock,
      killGraceMs: this.#opts.killGraceMs ?? DEFAULT_KILL_GRACE_MS,
    });
    this.#current = pg;
    const tail = new TailCapture(STDERR_TAIL_BYTES);
    this.#lastStderr = tail;
    pg.stderr.on('data', (chunk: Buffer) => tail.push(chunk));

    if (pg.stdin !== null) {
      // EPIPE when the command closes its stdin before reading all of it: its exit code decides.
      pg.stdin.on('error', () => {});
      if (source !== null) {
        source.pipe(pg.stdin);
      } else {
        pg.stdin.end();
      }
    }
    const pumping = this.#pumpStdout(pg.stdout, cmd.stdout?.type === 'body');
    if (this.#failure !== null) pg.stop();

    const outcome = await pg.done;
    await pumping;
    this.#current = null;
    if (source !== null) {
      source.unpipe(pg.stdin as NodeJS.WritableStream);
      source.removeListener('error', this.#onSourceError);
      // Errors of an input nobody reads any more must not crash the process.
      source.on('error', () => {});
    }

    this.#results.push({ prog: cmd.prog, exit_code: outcome.exitCode, duration_ms: Math.round(this.#clock.now() - startedAt) });
    this.#lastExit = outcome.exitCode;
    if (outcome.spawnError !== null) {
      const reason = (outcome.spawnError as NodeJS.ErrnoException).code ?? outcome.spawnError.message;
      this.#fail('spawn_failed', `cannot start command ${JSON.stringify(cmd.prog)} (${cfg.prog}): ${reason}`);
      return false;
    }
    if (this.#failure !== null) return false;
    if (outcome.exitCode !== 0) {
      const how = outcome.signal !== null ? `was killed by ${outcome.signal}` : `exited with code ${outcome.exitCode}`;
      this.#fail('command_failed', `command ${JSON.stringify(cmd.prog)} ${how}`);
      return false;
    }
    return true;
  }

  /** Reads a command's stdout to its end; never throws. */
  async #pumpStdout(stdout: Readable, isBody: boolean): Promise<void> {
    const feedsPrefix = isBody || !this.#hasBodyStdout;
    let toBody = isBody;
    try {
      for await (const chunk of stdout as AsyncIterable<Buffer>) {
        this.#outputBytes += chunk.length;
        if (feedsPrefix) this.#prefix.push(chunk);
        if (!toBody) continue;
        if (this.#failure !== null) {
          toBody = false;
          continue;
        }
        try {
          await this.#body.write(chunk);
        } catch (e) {
          toBody = false;
          const { code, message } = errorOf(e, 'pipe_out_failed');
          this.#fail(code, message);
        }
      }
    } catch {
      // stdout destroyed while stopping: what was read is all there is.
    }
  }

  #receipt(): Receipt {
    const r = this.#redactor;
    const prefixText = this.#prefix.text();
    let stdoutPrefix = r.redactExcerpt(prefixText, { continuesAfter: this.#prefix.truncated });
    // Redaction may lengthen the text; the prefix stays within its byte limit.
    if (Buffer.byteLength(stdoutPrefix) > STDOUT_PREFIX_BYTES) stdoutPrefix = decodeUtf8Prefix(Buffer.from(stdoutPrefix), STDOUT_PREFIX_BYTES);
    const last = this.#lastStderr?.lastLine() ?? { line: '', cutAtStart: false };
    const stderrLine = r.redactExcerpt(last.line, { continuesBefore: last.cutAtStart });
    const error: ReceiptError | null = this.#failure === null ? null : { code: this.#failure.code, message: r.redact(this.#failure.message) };
    return {
      ok: this.#failure === null,
      exit_code: this.#lastExit,
      duration_ms: Math.round(this.#clock.now() - this.#startedAt),
      timed_out: this.#timedOut,
      stopped: this.#stopped,
      stderr_line: stderrLine,
      stdout_prefix: stdoutPrefix,
      output_bytes: this.#outputBytes,
      commands: this.#results,
      error,
    };
  }
}

/** Runs a job to its receipt. Never rejects: every failure is a receipt with ok: false. */
export async function runJob(job: JobSpec, opts: RunOptions): Promise<Receipt> {
  try {
    return await new JobRun(job, opts).run();
  } catch (e) {
    const message = new Redactor(envValues(opts.commands)).redact(`unexpected failure: ${(e as Error)?.message ?? String(e)}`);
    return failedReceipt('internal', message);
  }
}
