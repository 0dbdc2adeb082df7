/**
 * decode/encode for broker frames. No I/O. `decode` never throws: it returns a typed message or a
 * `ProtocolError` whose `code` is one of PROTOCOL.md §1 rule 5 and whose `field` names the
 * offending field. Unknown fields are ignored (dropped), for forward compatibility.
 */
import type { ErrorCode } from '../errors.js';
import { FieldProblem, isPlainObject, LIMITS, type Receipt, validateJob } from './job.js';
import {
  assertNever,
  EXEC_MESSAGE_TYPES,
  type ExecMessage,
  FYLR_MESSAGE_TYPES,
  type FylrMessage,
  type Message,
  type MessageType,
  type WaitgroupSnapshot,
} from './messages.js';

export class ProtocolError {
  constructor(
    readonly code: Extract<ErrorCode, 'bad_frame' | 'unknown_type' | 'invalid_field'>,
    readonly message: string,
    readonly field?: string,
    /** The job_id of the refused frame, when it had a readable one. */
    readonly jobId?: string,
  ) {}
}

export function isProtocolError(v: unknown): v is ProtocolError {
  return v instanceof ProtocolError;
}

type Obj = Record<string, unknown>;

/** Thrown inside the field readers only; caught in `decode` and turned into a ProtocolError. */
class Invalid {
  constructor(
    readonly field: string,
    readonly message: string,
  ) {}
}

function str(o: Obj, field: string, max: number, allowEmpty = false): string {
  const v = o[field];
  if (typeof v !== 'string') throw new Invalid(field, `${field} must be a string`);
  if (!allowEmpty && v.length === 0) throw new Invalid(field, `${field} must not be empty`);
  if (v.length > max) throw new Invalid(field, `${field} is longer than ${max} characters`);
  return v;
}

function int(o: Obj, field: string, min = Number.MIN_SAFE_INTEGER): number {
  const v = o[field];
  if (typeof v !== 'number' || !Number.isSafeInteger(v)) throw new Invalid(field, `${field} must be a safe integer`);
  if (v < min) throw new Invalid(field, `${field} must be >= ${min}`);
  return v;
}

function nonNegative(o: Obj, field: string): number {
  const v = o[field];
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new Invalid(field, `${field} must be a non-negative number`);
  return v;
}

function bool(o: Obj, field: string): boolean {
  const v = o[field];
  if (typeof v !== 'boolean') throw new Invalid(field, `${field} must be a boolean`);
  return v;
}

function obj(o: Obj, field: string): Obj {
  const v = o[field];
  if (!isPlainObject(v)) throw new Invalid(field, `${field} must be an object`);
  return v;
}

const jobId = (o: Obj): string => str(o, 'job_id', LIMITS.jobIdChars);
const token = (o: Obj): string => str(o, 'token', 1024);

// Service and waitgroup names are peer data: the maps are built with Object.fromEntries, which
// defines own properties, so a name such as "__proto__" stays a key instead of replacing the
// map's prototype (an assignment `out[name] = v` would do that, and lose the entry).

function waitgroups(o: Obj): Record<string, WaitgroupSnapshot> {
  const raw = obj(o, 'waitgroups');
  const entries: [string, WaitgroupSnapshot][] = [];
  for (const [name, v] of Object.entries(raw)) {
    const field = `waitgroups.${name}`;
    if (!isPlainObject(v)) throw new Invalid(field, `${field} must be an object`);
    try {
      entries.push([name, { processes: int(v, 'processes', 0), running: int(v, 'running', 0), parked: int(v, 'parked', 0) }]);
    } catch (e) {
      if (e instanceof Invalid) throw new Invalid(`${field}.${e.field}`, `${field}.${e.message}`);
      throw e;
    }
  }
  return Object.fromEntries(entries);
}

function services(o: Obj): Record<string, string> {
  const raw = obj(o, 'services');
  const entries: [string, string][] = [];
  for (const [name, wg] of Object.entries(raw)) {
    if (typeof wg !== 'string') throw new Invalid(`services.${name}`, `services.${name} must name a waitgroup`);
    entries.push([name, wg]);
  }
  return Object.fromEntries(entries);
}

function receipt(o: Obj): Receipt {
  const r = obj(o, 'receipt');
  const prefix = (e: unknown): never => {
    if (e instanceof Invalid) throw new Invalid(`receipt.${e.field}`, `receipt.${e.message}`);
    throw e;
  };
  try {
    const exit = r.exit_code;
    if (exit !== null && (typeof exit !== 'number' || !Number.isSafeInteger(exit))) throw new Invalid('exit_code', 'exit_code must be an integer or null');
    const rawCommands = r.commands ?? [];
    if (!Array.isArray(rawCommands)) throw new Invalid('commands', 'commands must be an array');
    const commands = rawCommands.map((c, i) => {
      if (!isPlainObject(c)) throw new Invalid(`commands[${i}]`, `commands[${i}] must be an object`);
      const ce = c.exit_code;
      return {
        prog: typeof c.prog === 'string' ? c.prog : '',
        exit_code: typeof ce === 'number' && Number.isSafeInteger(ce) ? ce : null,
        duration_ms: typeof c.duration_ms === 'number' && Number.isFinite(c.duration_ms) ? c.duration_ms : 0,
      };
    });
    let error: Receipt['error'] = null;
    if (r.error !== null && r.error !== undefined) {
      const e = obj(r, 'error');
      try {
        error = { code: str(e, 'code', 100), message: typeof e.message === 'string' ? e.message : '' };
      } catch (inner) {
        if (inner instanceof Invalid) throw new Invalid(`error.${inner.field}`, `error.${inner.message}`);
        throw inner;
      }
    }
    return {
      ok: bool(r, 'ok'),
      exit_code: exit as number | null,
      duration_ms: nonNegative(r, 'duration_ms'),
      timed_out: r.timed_out === true,
      stopped: r.stopped === true,
      stderr_line: typeof r.stderr_line === 'string' ? r.stderr_line : '',
      stdout_prefix: typeof r.stdout_prefix === 'string' ? r.stdout_prefix : '',
      output_bytes: typeof r.output_bytes === 'number' && Number.isFinite(r.output_bytes) ? r.output_bytes : 0,
      commands,
      error,
    };
  } catch (e) {
    return prefix(e);
  }
}

/** Builds a message of a known type from a parsed object; throws Invalid. */
function build(type: MessageType, o: Obj): Message {
  switch (type) {
    case 'HELLO':
      return {
        type,
        protocol: int(o, 'protocol', 1),
        instance_id: str(o, 'instance_id', LIMITS.jobIdChars),
        name: str(o, 'name', 200, true),
        services: services(o),
        waitgroups: waitgroups(o),
        clients: int(o, 'clients', 0),
        draining: bool(o, 'draining'),
      };
    case 'WANT':
      return { type, job_id: jobId(o), service: str(o, 'service', LIMITS.serviceChars), priority: int(o, 'priority') };
    case 'UNWANT':
    case 'CANCEL':
    case 'QUERY':
      return { type, job_id: jobId(o) };
    case 'OFFER':
      return { type, job_id: jobId(o), token: token(o), expires_ms: nonNegative(o, 'expires_ms') };
    case 'JOB': {
      const id = jobId(o);
      const t = token(o);
      const job = validateJob(o.job, 'job');
      if (job instanceof FieldProblem) throw new Invalid(job.field, job.message);
      return { type, job_id: id, token: t, job };
    }
    case 'DECLINE':
      return { type, job_id: jobId(o), token: token(o) };
    case 'DONE':
      return { type, job_id: jobId(o), receipt: receipt(o) };
    case 'POSITION': {
      const m = {
        type,
        job_id: jobId(o),
        running: int(o, 'running', 0),
        ahead: int(o, 'ahead', 0),
        capacity: int(o, 'capacity', 0),
        parked: int(o, 'parked', 0),
      };
      const eta = o.eta_ms;
      if (eta !== null && (typeof eta !== 'number' || !Number.isFinite(eta) || eta < 0)) {
        throw new Invalid('eta_ms', 'eta_ms must be a non-negative number or null');
      }
      return { ...m, eta_ms: eta };
    }
    case 'ERROR': {
      // Any code a newer peer may send is accepted (forward compatibility); a reader treats a code
      // it does not know as a generic refusal.
      const code = str(o, 'code', 100);
      if (!/^[a-z][a-z0-9_]*$/.test(code)) throw new Invalid('code', 'code must be a snake_case word');
      const m: Message = { type, code, message: typeof o.message === 'string' ? o.message : '' };
      const id = readableJobId(o);
      if (id !== undefined) m.job_id = id;
      return m;
    }
    default:
      return assertNever(type);
  }
}

const ALL_TYPES: ReadonlySet<string> = new Set<string>([...FYLR_MESSAGE_TYPES, ...EXEC_MESSAGE_TYPES]);

function readableJobId(o: Obj): string | undefined {
  return typeof o.job_id === 'string' && o.job_id.length > 0 && o.job_id.length <= LIMITS.jobIdChars ? o.job_id : undefined;
}

/**
 * Decodes one text frame. `accept` restricts the types allowed (a server decodes with the fylr
 * types, a client with the exec types); any other known type is `unknown_type` too.
 */
export function decode(text: string, accept: ReadonlySet<string> = ALL_TYPES): Message | ProtocolError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return new ProtocolError('bad_frame', 'frame is not valid JSON');
  }
  if (!isPlainObject(parsed)) return new ProtocolError('bad_frame', 'frame must be a JSON object');
  const type = parsed.type;
  if (typeof type !== 'string') return new ProtocolError('invalid_field', 'type must be a string', 'type', readableJobId(parsed));
  // A type outside the protocol is unknown even if a caller's `accept` set names it.
  if (!ALL_TYPES.has(type) || !accept.has(type)) {
    return new ProtocolError('unknown_type', `unknown frame type ${JSON.stringify(type.slice(0, 50))}`, 'type', readableJobId(parsed));
  }
  try {
    return build(type as MessageType, parsed);
  } catch (e) {
    if (e instanceof Invalid) return new ProtocolError('invalid_field', e.message, e.field, readableJobId(parsed));
    return new ProtocolError('bad_frame', 'frame could not be decoded');
  }
}

const FYLR_TYPES: ReadonlySet<string> = new Set(FYLR_MESSAGE_TYPES);
const EXEC_TYPES: ReadonlySet<string> = new Set(EXEC_MESSAGE_TYPES);

/** What an execserver reads: only fylr→exec types. */
export function decodeFromFylr(text: string): FylrMessage | ProtocolError {
  return decode(text, FYLR_TYPES) as FylrMessage | ProtocolError;
}

/** What a fylr reads: only exec→fylr types. */
export function decodeFromExec(text: string): ExecMessage | ProtocolError {
  return decode(text, EXEC_TYPES) as ExecMessage | ProtocolError;
}

export function encode(message: Message): string {
  return JSON.stringify(message);
}
