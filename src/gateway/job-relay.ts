/**
 * A broker JOB relayed to the legacy backend whose token it holds:
 *
 *   JOB ─► PUT {target}/job/{service}?job={job without pipes, with the backend's token}
 *            body     ◄── the fylr's in-pipe (GET pipes.in), streamed        (body-mode stdin)
 *          answer 200 ──► the fylr's out-pipe (PUT pipes.out) through the 4000-byte commit rule
 *                         (BodyOutput, as a local job's stdout)               (body-mode stdout)
 *          answer 200/5xx with a receipt JSON ──► that receipt
 *          a stdout stream cut short ──► `command_failed` if the backend still answers
 *                         /healthz (the old execserver breaks its answer off when a job fails after
 *                         its commit, and sends no receipt), `backend_failed` if it is gone
 *          anything else, a refused connection ──► error `backend_failed`
 *
 * Memory stays bounded: every byte flows stream to stream with backpressure; what is kept is the
 * receipt's stdout prefix (4000 bytes) and the commit buffer (4000 bytes).
 *
 * CANCEL (the JobIo signal) aborts the backend request: the old execserver stops a job whose
 * client hung up. The relay also keeps a deadline of its own (timeout_sec plus a grace) so that a
 * backend that never answers cannot hold a slot for ever. `relayJob` never rejects.
 */
import { Readable } from 'node:stream';
import type { Clock } from '../clock.js';
import { forEachChunk } from '../for-each-chunk.js';
import { type ErrorCode, SlotgateError } from '../errors.js';
import { decodeFromExec, isProtocolError } from '../protocol/codec.js';
import { failedReceipt, type JobSpec, okReceipt, type Receipt, STDOUT_PREFIX_BYTES, usesBody } from '../protocol/job.js';
import { BodyOutput } from '../slots/output-body.js';
import { PrefixCapture } from '../slots/output-capture.js';
import type { JobIo } from '../slots/slot-source.js';
import { type BackendClient, legacyErrorOf, readText } from './backend-client.js';

/** How long past the job's own timeout the relay waits for the backend's answer. */
export const RELAY_GRACE_MS = 30_000;

export interface RelayTarget {
  client: BackendClient;
  /** Base URL to PUT to: the backend, or the replica that issued the token. */
  target: string;
  /** The backend's token. */
  token: string;
}

export interface RelayOptions {
  clock: Clock;
  /** When the job names no timeout_sec. */
  defaultTimeoutSec: number;
  graceMs?: number;
}

export interface RelayResult {
  receipt: Receipt;
  /** The PUT was sent, so the token is spent; false: the caller still holds it (give it back). */
  tokenSpent: boolean;
}

type Why = 'stopped' | 'timeout' | 'stdin' | 'stdout';

/**
 * A receipt from a legacy answer, read by the codec's own lenient receipt reader (the one a DONE
 * frame goes through), so a backend's receipt reaches the fylr exactly as a native one would.
 */
export function parseReceipt(text: string): Receipt | null {
  let receipt: unknown;
  try {
    receipt = JSON.parse(text);
  } catch {
    return null;
  }
  const msg = decodeFromExec(JSON.stringify({ type: 'DONE', job_id: 'relay', receipt }));
  return !isProtocolError(msg) && msg.type === 'DONE' ? msg.receipt : null;
}

function toReadable(s: NodeJS.ReadableStream | Readable): Readable {
  return s instanceof Readable ? s : Readable.from(s as AsyncIterable<Buffer>);
}

function messageOf(e: unknown): string {
  return (e as Error)?.message ?? String(e);
}

/** The code a backend's refusal becomes in the receipt: its job JSON was wrong, or the backend failed. */
function refusalCode(e: SlotgateError): ErrorCode {
  return e.code === 'invalid_job' ? 'invalid_job' : 'backend_failed';
}

export async function relayJob(t: RelayTarget, job: JobSpec, io: JobIo, opts: RelayOptions): Promise<RelayResult> {
  const clock = opts.clock;
  const startedAt = clock.now();
  const elapsed = (): number => Math.round(clock.now() - startedAt);
  const body = usesBody(job);

  let why: Why | null = null;
  let whyMessage = '';
  const abort = new AbortController();
  const stop = (reason: Why, message: string): void => {
    if (why !== null) return;
    why = reason;
    whyMessage = message;
    abort.abort(new SlotgateError(reason === 'stopped' ? 'stopped' : 'backend_failed', message));
  };
  /** What the failure `e` becomes, given why the relay stopped (if it did). */
  const failure = (e: unknown, extra: Partial<Receipt> = {}): Receipt => {
    const w = why as Why | null;
    const base =
      w === 'stopped'
        ? { ...failedReceipt('stopped', whyMessage, elapsed()), stopped: true }
        : w === 'stdin'
          ? failedReceipt('pipe_in_failed', whyMessage, elapsed())
          : w === 'stdout'
            ? failedReceipt('pipe_out_failed', whyMessage, elapsed())
            : w === 'timeout'
              ? failedReceipt('backend_failed', whyMessage, elapsed())
              : e instanceof SlotgateError
                ? failedReceipt(refusalCode(e), e.message, elapsed())
                : failedReceipt('backend_failed', `backend ${t.target}: ${messageOf(e)}`, elapsed());
    return { ...base, ...extra };
  };

  if (io.signal.aborted) return { receipt: { ...failedReceipt('stopped', 'job was cancelled before it started'), stopped: true }, tokenSpent: false };
  const onCancel = (): void => stop('stopped', 'job was cancelled');
  io.signal.addEventListener('abort', onCancel, { once: true });
  const deadlineMs = (job.timeout_sec ?? opts.defaultTimeoutSec) * 1000 + (opts.graceMs ?? RELAY_GRACE_MS);
  const timer = clock.setTimeout(() => stop('timeout', `backend ${t.target} did not answer within ${deadlineMs} ms`), deadlineMs);
  let stdin: Readable | undefined;
  try {
    if (body.stdin && io.stdin) {
      try {
        stdin = toReadable(await io.stdin.open());
      } catch (e) {
        if (why === null) stop('stdin', `opening stdin failed: ${messageOf(e)}`);
        return { receipt: failure(e), tokenSpent: false };
      }
      stdin.on('error', (e: Error) => stop('stdin', `reading stdin failed: ${e.message}`));
      if (why !== null) return { receipt: failure(null), tokenSpent: false };
    }
    // The backend gets the job as it would from an old fylr: no pipe URLs (their ids are credentials).
    const legacyJob: JobSpec = { service: job.service, commands: job.commands, token: t.token };
    if (job.timeout_sec !== undefined) legacyJob.timeout_sec = job.timeout_sec;

    let res;
    try {
      res = await t.client.putJob(t.target, job.service, legacyJob, { ...(stdin ? { body: stdin } : {}), signal: abort.signal });
    } catch (e) {
      return { receipt: failure(e), tokenSpent: true };
    }
    if (body.stdout && res.statusCode === 200) {
      const receipt = await streamStdout(res.body, io, stop, failure, elapsed);
      if (receipt.error?.code === 'backend_failed' && why === null && (await t.client.alive(t.target))) {
        const message = `the job failed on backend ${t.target} after its output was committed (an old execserver then breaks its answer off without a receipt)`;
        return { receipt: { ...receipt, error: { code: 'command_failed', message } }, tokenSpent: true };
      }
      return { receipt, tokenSpent: true };
    }

    let text: string;
    try {
      text = await readText(res.body);
    } catch (e) {
      return { receipt: failure(e), tokenSpent: true };
    }
    if (res.statusCode === 200 || res.statusCode >= 500) {
      const receipt = parseReceipt(text);
      if (receipt !== null) return { receipt, tokenSpent: true };
    }
    return { receipt: failure(legacyErrorOf(res.statusCode, text, t.target)), tokenSpent: true };
  } finally {
    clock.clearTimeout(timer);
    io.signal.removeEventListener('abort', onCancel);
    // Input the backend did not read is of no use any more; the pipe's server sees the end.
    if (stdin !== undefined && !stdin.readableEnded) {
      stdin.on('error', () => undefined);
      stdin.destroy();
    }
  }
}

/** A body-mode 200: the answer is stdout; it goes to the out-pipe through the commit rule. */
async function streamStdout(
  answer: Readable,
  io: JobIo,
  stop: (reason: Why, message: string) => void,
  failure: (e: unknown, extra?: Partial<Receipt>) => Receipt,
  elapsed: () => number,
): Promise<Receipt> {
  const out = new BodyOutput(io.stdout, (err) => stop('stdout', err.message));
  const prefix = new PrefixCapture(STDOUT_PREFIX_BYTES);
  let bytes = 0;
  const partial = (): Partial<Receipt> => ({ stdout_prefix: prefix.text(), output_bytes: bytes });
  try {
    await forEachChunk(answer, (chunk) => {
      bytes += chunk.length;
      prefix.push(chunk);
      return out.write(chunk);
    });
  } catch (e) {
    // The backend cut the stream (it failed after its own commit, or vanished), or the relay
    // stopped it (cancel, out-pipe broken, deadline): a committed out-pipe is aborted, never ended.
    const cause = e instanceof SlotgateError ? e : new SlotgateError('backend_failed', `backend broke off the stdout stream after ${bytes} bytes: ${messageOf(e)}`);
    const receipt = failure(cause, partial());
    out.fail(cause);
    answer.destroy();
    return receipt;
  }
  try {
    await out.finish();
  } catch (e) {
    stop('stdout', messageOf(e));
    return failure(e, partial());
  }
  return { ...okReceipt(elapsed()), ...partial() };
}
