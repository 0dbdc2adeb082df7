/**
 * The typed client of ONE legacy backend (an old execserver, or a balancer in front of several):
 * `GET /token/{service}`, `PUT /job/{service}?job=...` and the give-back. The legacy error bodies
 * (`{"Error": "Token not found", "Status": 400}`) are translated here, once, into SlotgateErrors
 * with codes of src/errors.ts; nothing else in the gateway reads legacy error text.
 *
 * node:http, one connection per request, as the old fylr did: an old execserver answers
 * `Connection: close` to everything, so a keep-alive pool only ever held sockets about to close
 * (undici turned each such close into an error object with a stack trace, ~1 % of the gateway's
 * time at 1,000 jobs/s), and the body-mode stdin and stdout stream straight between the pipes
 * and the backend with no PassThrough or wasm parser in between (bench/README.md).
 */
import http from 'node:http';
import https from 'node:https';
import type { Readable } from 'node:stream';
import { batchedPerTurn } from '../batched-per-turn.js';
import { SlotgateError } from '../errors.js';
import { translateLegacyError } from '../protocol/legacy-wire.js';
import { isPlainObject, type JobSpec } from '../protocol/job.js';

/**
 * How long a token request or a give-back may go without progress (connecting, or waiting for
 * answer bytes) before it counts as failed; a job's PUT is bounded like that only while it connects.
 */
export const TOKEN_REQUEST_TIMEOUT_MS = 5000;

export type TokenAnswer =
  /** `serviceUrl`: the `service` field of the answer (tokenResponseSendServerIP), if any. */
  | { kind: 'token'; token: string; serviceUrl: string | null }
  | { kind: 'busy' };

/** A backend's answer: the status and the body as a stream (stdout of a body-mode job). */
export interface BackendAnswer {
  statusCode: number;
  body: Readable;
}

/** A legacy error answer as a typed error. */
export function legacyErrorOf(status: number, body: string, backend: string): SlotgateError {
  return translateLegacyError(status, body, `backend ${backend}`);
}

function unreachable(backend: string, what: string, e: unknown): SlotgateError {
  const err = e as NodeJS.ErrnoException;
  return new SlotgateError('backend_failed', `backend ${backend}: ${what} failed: ${err?.code ?? err?.message ?? String(e)}`, { cause: e });
}

/** The query of a legacy PUT: the job JSON with the token, URL-encoded. */
export function jobPath(service: string, job: JobSpec): string {
  return `/job/${encodeURIComponent(service)}?job=${encodeURIComponent(JSON.stringify(job))}`;
}

/** The whole of a (small) answer body as text. */
export async function readText(body: Readable): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of body as AsyncIterable<Buffer>) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

interface SendOptions {
  /** The request body, streamed (body-mode stdin); absent: an empty body. */
  body?: Readable;
  signal?: AbortSignal;
  /** The whole exchange is bounded by TOKEN_REQUEST_TIMEOUT_MS of no progress; else only the connect. */
  short: boolean;
}

/**
 * One request. Resolves with the answer once its head arrived; a failure before that rejects
 * (the caller wraps it), a failure after it errors the answer's stream.
 */
function send(method: 'GET' | 'PUT', url: string, opts: SendOptions): Promise<BackendAnswer> {
  return new Promise<BackendAnswer>((resolve, reject) => {
    let target: URL;
    try {
      target = new URL(url);
    } catch (e) {
      reject(e);
      return;
    }
    const client = target.protocol === 'https:' ? (https as unknown as typeof http) : http;
    const req = client.request(target, {
      method,
      agent: false,
      ...(opts.signal ? { signal: opts.signal } : {}),
      headers: opts.body ? { 'content-type': 'application/octet-stream' } : {},
    });
    let answered = false;
    const timedOut = (): void => {
      req.destroy(new Error(`no progress for ${TOKEN_REQUEST_TIMEOUT_MS} ms`));
    };
    req.on('socket', (socket) => {
      socket.setTimeout(TOKEN_REQUEST_TIMEOUT_MS, timedOut);
      // A job may run for hours without a byte of output; its relay keeps the deadline.
      if (!opts.short) socket.once('connect', () => socket.setTimeout(0));
    });
    req.on('response', (res) => {
      answered = true;
      resolve({ statusCode: res.statusCode ?? 0, body: res });
    });
    req.on('error', (e) => {
      if (!answered) reject(e);
    });
    if (opts.body) {
      // Headers first, so the backend starts the job before stdin's first byte arrives.
      req.flushHeaders();
      // A backend may answer (a refusal) before it read the body: the rest is not sent. The
      // pieces of one socket read of the body leave in one write (batched-per-turn.ts).
      const batch = batchedPerTurn(req);
      opts.body.on('data', batch);
      opts.body.pipe(req);
    } else {
      req.end();
    }
  });
}

/** A short exchange's status and whole body. */
async function exchange(method: 'GET' | 'PUT', url: string, signal?: AbortSignal): Promise<{ status: number; text: string }> {
  const res = await send(method, url, { short: true, ...(signal ? { signal } : {}) });
  return { status: res.statusCode, text: await readText(res.body) };
}

export interface PutOptions {
  /** The request body (body-mode stdin); absent: an empty body. */
  body?: Readable;
  signal: AbortSignal;
}

export class BackendClient {
  /** The configured URL, without a trailing slash. */
  readonly url: string;

  constructor(url: string) {
    this.url = url.replace(/\/+$/, '');
  }

  /**
   * One `GET /token/{service}` at this backend (or at `base`, a replica of it). Throws a
   * SlotgateError for anything but a token or "busy".
   */
  async getToken(service: string, signal?: AbortSignal, base: string = this.url): Promise<TokenAnswer> {
    let status: number;
    let text: string;
    try {
      ({ status, text } = await exchange('GET', `${base}/token/${encodeURIComponent(service)}`, signal));
    } catch (e) {
      throw unreachable(base, 'GET /token', e);
    }
    if (status === 503) return { kind: 'busy' };
    if (status !== 200) throw legacyErrorOf(status, text, base);
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    if (!isPlainObject(body) || typeof body.token !== 'string' || body.token === '') {
      throw new SlotgateError('backend_failed', `backend ${base}: GET /token answered 200 without a token`);
    }
    return { kind: 'token', token: body.token, serviceUrl: typeof body.service === 'string' && body.service !== '' ? body.service : null };
  }

  /**
   * `PUT /job/{service}?job=...` at `target` (this backend, or the replica its token named). The
   * caller reads the answer; transport failures throw a SlotgateError `backend_failed`. Only the
   * connect is bounded here; the relay keeps the job's deadline through `signal`.
   */
  async putJob(target: string, service: string, job: JobSpec, opts: PutOptions): Promise<BackendAnswer> {
    try {
      return await send('PUT', `${target}${jobPath(service, job)}`, { short: false, signal: opts.signal, ...(opts.body ? { body: opts.body } : {}) });
    } catch (e) {
      throw unreachable(target, 'PUT /job', e);
    }
  }

  /** Does `target` answer `GET /healthz` with 200? Never throws. */
  async alive(target: string): Promise<boolean> {
    try {
      return (await exchange('GET', `${target}/healthz`)).status === 200;
    } catch {
      return false;
    }
  }

  /**
   * Gives a token back at once by redeeming it with a job that has no commands (which every
   * execserver answers at once with an ok receipt), instead of holding the backend's slot until
   * the token lapses. Throws a SlotgateError when the backend did not take it back.
   */
  async giveBack(target: string, service: string, token: string): Promise<void> {
    let status: number;
    let text: string;
    try {
      ({ status, text } = await exchange('PUT', `${target}${jobPath(service, { service, commands: [], token })}`));
    } catch (e) {
      throw unreachable(target, 'give-back PUT /job', e);
    }
    if (status !== 200) throw legacyErrorOf(status, text, target);
  }
}
