/**
 * The job JSON (PROTOCOL.md §3) and the receipt (§4), with a validator for job JSON that arrives
 * from the network (a broker JOB frame, a legacy `?job=` query, a `POST /items` body).
 */

export interface FileRef {
  url: string;
  name: string;
}

export type JobArg =
  | { type: 'value'; value: string }
  | { type: 'file_in'; file: FileRef }
  | { type: 'file_out'; file: FileRef };

export interface StreamSpec {
  type: 'body';
}

export interface JobCommand {
  /** Names a command of the execserver's configuration, never a path. */
  prog: string;
  args: JobArg[];
  stdin?: StreamSpec;
  stdout?: StreamSpec;
}

export interface JobPipes {
  in?: string;
  out?: string;
}

export interface JobSpec {
  service: string;
  timeout_sec?: number;
  commands: JobCommand[];
  pipes?: JobPipes;
  /** Legacy transport only: the token a `PUT /job` redeems. */
  token?: string;
}

export interface CommandResult {
  prog: string;
  exit_code: number | null;
  duration_ms: number;
}

export interface ReceiptError {
  code: string;
  message: string;
}

export interface Receipt {
  ok: boolean;
  exit_code: number | null;
  duration_ms: number;
  timed_out: boolean;
  stopped: boolean;
  stderr_line: string;
  stdout_prefix: string;
  output_bytes: number;
  commands: CommandResult[];
  error: ReceiptError | null;
}

/** Bytes of stdout held back before a body-mode stream is committed (§2, §5). */
export const STDOUT_COMMIT_BYTES = 4000;
/** The receipt's `stdout_prefix` is at most this many bytes. */
export const STDOUT_PREFIX_BYTES = 4000;

export const LIMITS = {
  jobIdChars: 200,
  serviceChars: 100,
  progChars: 100,
  argChars: 64 * 1024,
  urlChars: 8 * 1024,
  fileNameChars: 255,
  commands: 64,
  argsPerCommand: 1024,
  timeoutSecMax: 7 * 24 * 3600,
} as const;

/** Why a value from the network was refused: the offending field's path and a sentence. */
export class FieldProblem {
  constructor(
    readonly field: string,
    readonly message: string,
  ) {}
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function boundedString(v: unknown, field: string, max: number, allowEmpty = false): string | FieldProblem {
  if (typeof v !== 'string') return new FieldProblem(field, `${field} must be a string`);
  if (!allowEmpty && v.length === 0) return new FieldProblem(field, `${field} must not be empty`);
  if (v.length > max) return new FieldProblem(field, `${field} is longer than ${max} characters`);
  return v;
}

function isProblem(v: unknown): v is FieldProblem {
  return v instanceof FieldProblem;
}

function httpUrl(v: unknown, field: string): string | FieldProblem {
  const s = boundedString(v, field, LIMITS.urlChars);
  if (typeof s !== 'string') return s;
  let u: URL;
  try {
    u = new URL(s);
  } catch {
    return new FieldProblem(field, `${field} is not a URL`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') return new FieldProblem(field, `${field} must be an http(s) URL`);
  return s;
}

/** A file name is a single path segment: it lands in the job's temp dir and nowhere else. */
function fileName(v: unknown, field: string): string | FieldProblem {
  const s = boundedString(v, field, LIMITS.fileNameChars);
  if (typeof s !== 'string') return s;
  if (s === '.' || s === '..' || s.includes('/') || s.includes('\\') || s.includes('\0')) {
    return new FieldProblem(field, `${field} must be a plain file name`);
  }
  return s;
}

function fileRef(v: unknown, field: string): FileRef | FieldProblem {
  if (!isPlainObject(v)) return new FieldProblem(field, `${field} must be an object`);
  const url = httpUrl(v.url, `${field}.url`);
  if (typeof url !== 'string') return url;
  const name = fileName(v.name, `${field}.name`);
  if (typeof name !== 'string') return name;
  return { url, name };
}

function streamSpec(v: unknown, field: string): StreamSpec | undefined | FieldProblem {
  if (v === undefined || v === null) return undefined;
  if (!isPlainObject(v) || v.type !== 'body') return new FieldProblem(field, `${field} must be {"type": "body"}`);
  return { type: 'body' };
}

function jobArg(v: unknown, field: string): JobArg | FieldProblem {
  if (!isPlainObject(v)) return new FieldProblem(field, `${field} must be an object`);
  switch (v.type) {
    case 'value': {
      const value = boundedString(v.value, `${field}.value`, LIMITS.argChars, true);
      return typeof value === 'string' ? { type: 'value', value } : value;
    }
    case 'file_in':
    case 'file_out': {
      const file = fileRef(v.file, `${field}.file`);
      return isProblem(file) ? file : { type: v.type, file };
    }
    default:
      return new FieldProblem(`${field}.type`, `${field}.type must be "value", "file_in" or "file_out"`);
  }
}

function jobCommand(v: unknown, field: string): JobCommand | FieldProblem {
  if (!isPlainObject(v)) return new FieldProblem(field, `${field} must be an object`);
  const prog = boundedString(v.prog, `${field}.prog`, LIMITS.progChars);
  if (typeof prog !== 'string') return prog;
  const rawArgs = v.args ?? [];
  if (!Array.isArray(rawArgs)) return new FieldProblem(`${field}.args`, `${field}.args must be an array`);
  if (rawArgs.length > LIMITS.argsPerCommand) return new FieldProblem(`${field}.args`, `${field}.args has more than ${LIMITS.argsPerCommand} entries`);
  const args: JobArg[] = [];
  for (let i = 0; i < rawArgs.length; i++) {
    const a = jobArg(rawArgs[i], `${field}.args[${i}]`);
    if (isProblem(a)) return a;
    args.push(a);
  }
  const stdin = streamSpec(v.stdin, `${field}.stdin`);
  if (isProblem(stdin)) return stdin;
  const stdout = streamSpec(v.stdout, `${field}.stdout`);
  if (isProblem(stdout)) return stdout;
  const cmd: JobCommand = { prog, args };
  if (stdin) cmd.stdin = stdin;
  if (stdout) cmd.stdout = stdout;
  return cmd;
}

/**
 * Validates job JSON from the network. Unknown fields are dropped. Never throws.
 * `field` in the problem is a path such as `job.commands[0].args[2].file.url`.
 */
export function validateJob(v: unknown, prefix = 'job'): JobSpec | FieldProblem {
  if (!isPlainObject(v)) return new FieldProblem(prefix, `${prefix} must be an object`);
  const service = boundedString(v.service, `${prefix}.service`, LIMITS.serviceChars);
  if (typeof service !== 'string') return service;
  const job: JobSpec = { service, commands: [] };
  if (v.timeout_sec !== undefined && v.timeout_sec !== null) {
    const t = v.timeout_sec;
    if (typeof t !== 'number' || !Number.isFinite(t) || t <= 0 || t > LIMITS.timeoutSecMax) {
      return new FieldProblem(`${prefix}.timeout_sec`, `${prefix}.timeout_sec must be a positive number of seconds`);
    }
    job.timeout_sec = t;
  }
  const rawCommands = v.commands ?? [];
  if (!Array.isArray(rawCommands)) return new FieldProblem(`${prefix}.commands`, `${prefix}.commands must be an array`);
  if (rawCommands.length > LIMITS.commands) return new FieldProblem(`${prefix}.commands`, `${prefix}.commands has more than ${LIMITS.commands} entries`);
  for (let i = 0; i < rawCommands.length; i++) {
    const c = jobCommand(rawCommands[i], `${prefix}.commands[${i}]`);
    if (isProblem(c)) return c;
    job.commands.push(c);
  }
  if (v.pipes !== undefined && v.pipes !== null) {
    if (!isPlainObject(v.pipes)) return new FieldProblem(`${prefix}.pipes`, `${prefix}.pipes must be an object`);
    const pipes: JobPipes = {};
    for (const k of ['in', 'out'] as const) {
      if (v.pipes[k] === undefined || v.pipes[k] === null) continue;
      const u = httpUrl(v.pipes[k], `${prefix}.pipes.${k}`);
      if (typeof u !== 'string') return u;
      pipes[k] = u;
    }
    job.pipes = pipes;
  }
  if (v.token !== undefined && v.token !== null) {
    const token = boundedString(v.token, `${prefix}.token`, 1024);
    if (typeof token !== 'string') return token;
    job.token = token;
  }
  return job;
}

export function isFieldProblem(v: unknown): v is FieldProblem {
  return isProblem(v);
}

/** Does any command of the job read stdin or write stdout as a body? */
export function usesBody(job: JobSpec): { stdin: boolean; stdout: boolean } {
  return {
    stdin: job.commands.some((c) => c.stdin?.type === 'body'),
    stdout: job.commands.some((c) => c.stdout?.type === 'body'),
  };
}

export function okReceipt(durationMs = 0): Receipt {
  return {
    ok: true,
    exit_code: 0,
    duration_ms: durationMs,
    timed_out: false,
    stopped: false,
    stderr_line: '',
    stdout_prefix: '',
    output_bytes: 0,
    commands: [],
    error: null,
  };
}

export function failedReceipt(code: string, message: string, durationMs = 0): Receipt {
  return { ...okReceipt(durationMs), ok: false, exit_code: null, error: { code, message } };
}
