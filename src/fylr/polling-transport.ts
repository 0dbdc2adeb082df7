/**
 * The legacy token transport (PROTOCOL.md §5) for addresses whose `/broker` upgrade answers 404:
 * `GET /token/{service}` once per retry tick until a slot or the deadline, then `PUT /job`.
 *
 * Why not legacy/fylr/polling-client.ts's `acquireAndRun`: it waits and runs in one call, with
 * the job known up front, over its own address list. The broker client splits the two (acquire,
 * then `lease.run(job)`), races polling addresses against broker offers for the same job, and
 * gives surplus tokens back at once. So the two steps live here, as thin functions; the address
 * parser and the translation of legacy error bodies are the old client's own (one place each).
 *
 * Giving a token back: the old API has no release call, but a job with no commands succeeds at
 * once on every kind of execserver (PROTOCOL.md §3) and frees the slot, instead of holding it for
 * the token's 10 s.
 */
import type { Readable, Writable } from 'node:stream';
import { Agent, type Dispatcher, request } from 'undici';
import { type Clock } from '../clock.js';
import { LEGACY_TOKEN_TTL_MS } from '../config/types.js';
import { isPlainObject, type JobSpec, okReceipt, type Receipt, failedReceipt, usesBody } from '../protocol/job.js';
import { isReceipt, receiptFromHeader, translateLegacyError as legacyError } from '../protocol/legacy-wire.js';
import type { RunIo, SlotLease } from './lease.js';
import { noSlotReceipt, stoppedReceipt } from './lease.js';

/** How long one token request may take before it counts as unanswered. */
export const TOKEN_REQUEST_TIMEOUT_MS = 10_000;
/** A token is redeemed only while it is this much younger than its 10 s lifetime. */
export const TOKEN_SAFETY_MARGIN_MS = 500;

export const pollingAgent: Dispatcher = new Agent({ connect: { timeout: TOKEN_REQUEST_TIMEOUT_MS } });

export type TokenOutcome =
  | { kind: 'token'; token: string; target: string }
  | { kind: 'busy' }
  | { kind: 'unknown_service'; message: string }
  | { kind: 'error'; message: string };

function trimUrl(u: string): string {
  return u.replace(/\/+$/, '');
}

/** One `GET /token/{service}` on `base`. Never throws. */
export async function requestToken(base: string, service: string, dispatcher: Dispatcher = pollingAgent): Promise<TokenOutcome> {
  let status: number;
  let text: string;
  try {
    const res = await request(`${base}/token/${encodeURIComponent(service)}`, {
      method: 'GET',
      dispatcher,
      headersTimeout: TOKEN_REQUEST_TIMEOUT_MS,
      bodyTimeout: TOKEN_REQUEST_TIMEOUT_MS,
    });
    status = res.statusCode;
    text = await res.body.text();
  } catch (e) {
    return { kind: 'error', message: (e as Error).message };
  }
  if (status === 200) {
    try {
      const j: unknown = JSON.parse(text);
      if (isPlainObject(j) && typeof j.token === 'string' && j.token !== '') {
        const target = typeof j.service === 'string' && /^https?:\/\//.test(j.service) ? trimUrl(j.service) : base;
        return { kind: 'token', token: j.token, target };
      }
    } catch {
      /* a 200 without a token is treated as busy, as the old client did */
    }
    return { kind: 'busy' };
  }
  if (status === 503) return { kind: 'busy' };
  if (status === 404) return { kind: 'unknown_service', message: legacyError(status, text).message };
  return { kind: 'error', message: `GET /token answered ${status}` };
}

function jobUrl(target: string, job: JobSpec, token: string): string {
  const { pipes: _pipes, ...rest } = job;
  const query = encodeURIComponent(JSON.stringify({ ...rest, token }));
  return `${target}/job/${encodeURIComponent(job.service)}?job=${query}`;
}

/** Frees a token's slot at once with an empty job. Fire and forget. */
export function giveBackToken(target: string, service: string, token: string, dispatcher: Dispatcher = pollingAgent): void {
  void request(jobUrl(target, { service, commands: [] }, token), { method: 'PUT', dispatcher, headersTimeout: TOKEN_REQUEST_TIMEOUT_MS, bodyTimeout: TOKEN_REQUEST_TIMEOUT_MS })
    .then((res) => res.body.dump())
    .catch(() => undefined);
}

/** Writes `src` into `dst` chunk by chunk (backpressure); ends `dst` on success. Returns bytes. */
async function streamInto(src: AsyncIterable<Buffer>, dst: Writable | undefined): Promise<number> {
  let bytes = 0;
  for await (const chunk of src) {
    bytes += chunk.length;
    if (dst !== undefined && !dst.write(chunk)) {
      await new Promise<void>((resolve, reject) => {
        const off = (): void => {
          dst.off('drain', onDrain);
          dst.off('close', onClose);
        };
        const onDrain = (): void => (off(), resolve());
        const onClose = (): void => (off(), reject(new Error('stdout closed')));
        dst.on('drain', onDrain);
        dst.on('close', onClose);
      });
    }
  }
  if (dst !== undefined) {
    await new Promise<void>((resolve, reject) => {
      dst.once('finish', resolve);
      dst.once('close', () => (dst.writableFinished ? resolve() : reject(new Error('stdout closed before it finished'))));
      dst.end();
    });
  }
  return bytes;
}

/** `PUT /job` with the token. Never throws: every outcome is a receipt. */
export async function putJob(target: string, job: JobSpec, token: string, io: RunIo, signal: AbortSignal, dispatcher: Dispatcher = pollingAgent): Promise<Receipt> {
  const body = usesBody(job);
  let res: Dispatcher.ResponseData;
  try {
    res = await request(jobUrl(target, job, token), {
      method: 'PUT',
      dispatcher,
      signal,
      body: body.stdin ? ((io.stdin as Readable | undefined) ?? '') : undefined,
      // A job may run for hours: no client-side limit on waiting for the answer.
      headersTimeout: 0,
      bodyTimeout: 0,
    });
  } catch (e) {
    io.stdout?.destroy();
    if (signal.aborted) return stoppedReceipt('cancelled while the PUT was out');
    return failedReceipt('backend_failed', `PUT ${target}: ${(e as Error).message}`);
  }
  if (res.statusCode === 200 && body.stdout) {
    let bytes: number;
    try {
      bytes = await streamInto(res.body, io.stdout);
    } catch (e) {
      io.stdout?.destroy();
      if (signal.aborted) return stoppedReceipt('cancelled while stdout was streaming');
      return failedReceipt('pipe_out_failed', `stdout from ${target} broke off: ${(e as Error).message}`);
    }
    return receiptFromHeader(res.headers) ?? { ...okReceipt(), output_bytes: bytes };
  }
  const text = await res.body.text().catch(() => '');
  if (body.stdout) io.stdout?.destroy();
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if ((res.statusCode === 200 || res.statusCode >= 500) && isReceipt(parsed)) return parsed;
  const err = legacyError(res.statusCode, text);
  return failedReceipt(err.code, err.message);
}

export interface PollingLeaseContext {
  clock: Clock;
  dispatcher: Dispatcher;
  /** Called once when the lease is over (run finished, released, or void). */
  finished(lease: PollingLease): void;
}

/** A legacy token, held until run() redeems it or release() gives it back. */
export class PollingLease implements SlotLease {
  readonly address: string;
  readonly transport = 'polling' as const;
  readonly jobId: string;
  readonly service: string;
  readonly target: string;
  readonly #token: string;
  readonly #grantedAt: number;
  readonly #ctx: PollingLeaseContext;
  #state: 'granted' | 'running' | 'over' = 'granted';
  #run: Promise<Receipt> | undefined;
  #abort = new AbortController();

  constructor(address: string, jobId: string, service: string, grant: { token: string; target: string }, ctx: PollingLeaseContext) {
    this.address = address;
    this.jobId = jobId;
    this.service = service;
    this.target = grant.target;
    this.#token = grant.token;
    this.#ctx = ctx;
    this.#grantedAt = ctx.clock.now();
  }

  run(job: JobSpec, io: RunIo = {}): Promise<Receipt> {
    if (this.#run) return this.#run;
    this.#run = this.#runOnce(job, io);
    return this.#run;
  }

  async #runOnce(job: JobSpec, io: RunIo): Promise<Receipt> {
    if (this.#state !== 'granted') return noSlotReceipt('the slot was released before run()');
    if (this.#ctx.clock.now() - this.#grantedAt >= LEGACY_TOKEN_TTL_MS - TOKEN_SAFETY_MARGIN_MS) {
      this.#over();
      return noSlotReceipt('the legacy token expired before run() (call run() at once after acquire)');
    }
    if (job.service !== this.service) {
      this.release();
      return failedReceipt('invalid_job', `job.service ${JSON.stringify(job.service)} is not the acquired service ${JSON.stringify(this.service)}`);
    }
    this.#state = 'running';
    try {
      return await putJob(this.target, job, this.#token, io, this.#abort.signal, this.#ctx.dispatcher);
    } finally {
      this.#over();
    }
  }

  /** Running: abort the PUT (the old server stops the job when its client goes). Not yet run: release. */
  cancel(): void {
    if (this.#state === 'running') this.#abort.abort();
    else this.release();
  }

  /** An unused token: free its slot now with an empty job. */
  release(): void {
    if (this.#state !== 'granted') return;
    giveBackToken(this.target, this.service, this.#token, this.#ctx.dispatcher);
    this.#over();
  }

  #over(): void {
    if (this.#state === 'over') return;
    this.#state = 'over';
    this.#ctx.finished(this);
  }
}
