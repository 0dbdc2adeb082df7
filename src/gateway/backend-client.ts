/**
 * The typed client of ONE legacy backend (an old execserver, or a balancer in front of several):
 * `GET /token/{service}`, `PUT /job/{service}?job=...` and the give-back. The legacy error bodies
 * (`{"Error": "Token not found", "Status": 400}`) are translated here, once, into SlotgateErrors
 * with codes of src/errors.ts; nothing else in the gateway reads legacy error text.
 */
import { translateLegacyError } from '../protocol/legacy-wire.js';
import type { Readable } from 'node:stream';
import { Agent, type Dispatcher, request } from 'undici';
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
   */
  async putJob(target: string, service: string, job: JobSpec, opts: PutOptions): Promise<Dispatcher.ResponseData> {
    try {
      return await request(`${target}${jobPath(service, job)}`, {
        method: 'PUT',
        dispatcher: this.#dispatcher,
        body: opts.body ?? '',
        signal: opts.signal,
        headers: opts.body ? { 'content-type': 'application/octet-stream' } : {},
        // A job may run for hours; the relay keeps its own deadline.
        headersTimeout: 0,
        bodyTimeout: 0,
      });
    } catch (e) {
      if (e instanceof SlotgateError) throw e;
      throw unreachable(target, 'PUT /job', e);
    }
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
