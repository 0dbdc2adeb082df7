/**
 * The typed client of ONE legacy backend (an old execserver, or a balancer in front of several):
 * `GET /token/{service}`, `PUT /job/{service}?job=...` and the give-back. The legacy error bodies
 * (`{"Error": "Token not found", "Status": 400}`) are translated here, once, into SlotgateErrors
 * with codes of src/errors.ts; nothing else in the gateway reads legacy error text.
 */
import http from 'node:http';
import https from 'node:https';
import type { Readable } from 'node:stream';
import { Agent, type Dispatcher, request } from 'undici';
import { translateLegacyError } from '../protocol/legacy-wire.js';
import { SlotgateError } from '../errors.js';
import { isPlainObject, type JobSpec } from '../protocol/job.js';

/** How long a token request or a give-back may take before it counts as failed. */
export const TOKEN_REQUEST_TIMEOUT_MS = 5000;

export type TokenAnswer =
  /** `serviceUrl`: the `service` field of the answer (tokenResponseSendServerIP), if any. */
  | { kind: 'token'; token: string; serviceUrl: string | null }
  | { kind: 'busy' };

/** One dispatcher for all backends of a gateway: connection pools per origin, bounded connect time. */
export function backendDispatcher(): Agent {
  return new Agent({ connect: { timeout: TOKEN_REQUEST_TIMEOUT_MS }, keepAliveTimeout: 4000 });
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

export interface PutOptions {
  /** The request body (body-mode stdin); absent: an empty body. */
  body?: Readable;
  signal: AbortSignal;
}

/** A backend's answer to `PUT /job`: the status and the body as a stream (stdout in body mode). */
export interface PutAnswer {
  statusCode: number;
  body: Readable;
}

/** The whole of a (small) answer body as text. */
export async function readText(body: Readable): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of body as AsyncIterable<Buffer>) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

export class BackendClient {
  /** The configured URL, without a trailing slash. */
  readonly url: string;
  readonly #dispatcher: Dispatcher;

  constructor(url: string, dispatcher: Dispatcher) {
    this.url = url.replace(/\/+$/, '');
    this.#dispatcher = dispatcher;
  }

  /**
   * One `GET /token/{service}` at this backend (or at `base`, a replica of it). Throws a
   * SlotgateError for anything but a token or "busy".
   */
  async getToken(service: string, signal?: AbortSignal, base: string = this.url): Promise<TokenAnswer> {
    let status: number;
    let text: string;
    try {
      const res = await request(`${base}/token/${encodeURIComponent(service)}`, {
        method: 'GET',
        dispatcher: this.#dispatcher,
        headersTimeout: TOKEN_REQUEST_TIMEOUT_MS,
        bodyTimeout: TOKEN_REQUEST_TIMEOUT_MS,
        ...(signal ? { signal } : {}),
      });
      status = res.statusCode;
      text = await res.body.text();
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
   * caller reads the answer; transport failures throw a SlotgateError `backend_failed`.
   *
   * node:http rather than undici, for the same reason as src/slots/pipe-io.ts: the body-mode
   * stdin streams straight into the request and stdout straight out of the response, with no
   * PassThrough and no wasm parser in between (bench/README.md, streaming). One connection per
   * job, as the old fylr did: an old execserver answers `Connection: close` anyway. Only the
   * connect is bounded (TOKEN_REQUEST_TIMEOUT_MS); a job may run for hours and the relay keeps
   * its own deadline through `signal`.
   */
  putJob(target: string, service: string, job: JobSpec, opts: PutOptions): Promise<PutAnswer> {
    return new Promise<PutAnswer>((resolve, reject) => {
      let url: URL;
      try {
        url = new URL(`${target}${jobPath(service, job)}`);
      } catch (e) {
        reject(unreachable(target, 'PUT /job', e));
        return;
      }
      const client = url.protocol === 'https:' ? (https as unknown as typeof http) : http;
      const req = client.request(url, {
        method: 'PUT',
        agent: false,
        signal: opts.signal,
        headers: opts.body ? { 'content-type': 'application/octet-stream' } : {},
      });
      let answered = false;
      req.on('socket', (socket) => {
        if (!socket.connecting) return;
        socket.setTimeout(TOKEN_REQUEST_TIMEOUT_MS, () => req.destroy(new Error(`connect timed out after ${TOKEN_REQUEST_TIMEOUT_MS} ms`)));
        socket.once('connect', () => socket.setTimeout(0));
      });
      req.on('response', (res) => {
        answered = true;
        resolve({ statusCode: res.statusCode ?? 0, body: res });
      });
      // Before the answer a failure is the PUT's; after it, the answer's stream carries it.
      req.on('error', (e) => {
        if (!answered) reject(unreachable(target, 'PUT /job', e));
      });
      if (opts.body) {
        // Headers first, so the backend starts the job before stdin's first byte arrives.
        req.flushHeaders();
        // A backend may answer (a refusal) before it read the body: the rest is not sent.
        opts.body.pipe(req);
      } else {
        req.end();
      }
    });
  }

  /** Does `target` answer `GET /healthz` with 200? Never throws. */
  async alive(target: string): Promise<boolean> {
    try {
      const res = await request(`${target}/healthz`, {
        method: 'GET',
        dispatcher: this.#dispatcher,
        headersTimeout: TOKEN_REQUEST_TIMEOUT_MS,
        bodyTimeout: TOKEN_REQUEST_TIMEOUT_MS,
      });
      await res.body.dump();
      return res.statusCode === 200;
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
      const res = await request(`${target}${jobPath(service, { service, commands: [], token })}`, {
        method: 'PUT',
        dispatcher: this.#dispatcher,
        body: '',
        headersTimeout: TOKEN_REQUEST_TIMEOUT_MS,
        bodyTimeout: TOKEN_REQUEST_TIMEOUT_MS,
      });
      status = res.statusCode;
      text = await res.body.text();
    } catch (e) {
      throw unreachable(target, 'give-back PUT /job', e);
    }
    if (status !== 200) throw legacyErrorOf(status, text, target);
  }
}
