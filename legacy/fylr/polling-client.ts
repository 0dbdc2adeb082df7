/**
 * The OLD execserver client (PROTOCOL.md §5), flaws included, as the seed describes it:
 *
 *   every pollIntervalMs (1 s), until connectTimeoutSec:
 *     GET /token/{service} on EVERY eligible address at once
 *     first 200 wins ─────────────► PUT /job/{service}?job=<job JSON + token>
 *     (later 200s of the same round:  to the token's `service` URL if it names one
 *      tokens left to expire,         (tokenResponseSendServerIP), else to the address
 *      their slots held for 10 s)
 *     all busy ──► sleep until the next tick
 *   deadline ──► requeue (the worker pool sets start_after +1 min)
 *
 * The token is instance-local: behind a balancer the PUT can reach another replica than the one
 * that issued it → 400 "Token not found", a failed attempt (counted). A 404 from any address
 * fails the job (capability discovered by failure) unless `onUnknownService: 'skip-address'`.
 *
 * Each request is its own TCP connection (no keep-alive), as with the old client and the
 * `Connection: close` the old server sends; a balancer therefore re-balances every request.
 *
 * The new fylr's fallback (src/fylr/polling-transport.ts) shares only the wire's reading
 * (src/protocol/legacy-wire.ts): it splits acquiring from running, which `acquireAndRun` joins.
 */
import { isReceipt, type LegacyAddress, legacyErrorText, parseLegacyAddress, receiptFromHeader, translateLegacyError } from '../../src/protocol/legacy-wire.js';
import type { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Agent, type Dispatcher, request } from 'undici';
import type { Clock } from '../../src/clock.js';
import { SlotgateError } from '../../src/errors.js';
import { isPlainObject, type JobSpec, type Receipt, okReceipt, usesBody } from '../../src/protocol/job.js';
import type { LegacyCounters } from './counters.js';

export const POLL_INTERVAL_MS = 1000;
/** How long one token request may take before it counts as unanswered. */
export const TOKEN_REQUEST_TIMEOUT_MS = 10_000;

/** No keep-alive: one connection per request, closed after it. */
const legacyAgent = new Agent({ pipelining: 0, connect: { timeout: TOKEN_REQUEST_TIMEOUT_MS } });

export { type LegacyAddress, parseLegacyAddress } from '../../src/protocol/legacy-wire.js';

export interface AcquireOptions {
  addresses: readonly string[];
  connectTimeoutSec: number;
  clock: Clock;
  counters: LegacyCounters;
  /** Body mode: the PUT body (the commands' stdin). Without it a body-mode job sends an empty body. */
  stdin?: Readable;
  /** Body mode: receives the response body (stdout); ended on success, destroyed on a failure. */
  stdout?: Writable;
  /** Aborts the slot wait (→ requeue 'aborted'); a PUT already sent is not aborted. */
  signal?: AbortSignal;
  /** Default 1000 (the old client). */
  pollIntervalMs?: number;
  /** 'fail' (the old client, default): a 404 from any address fails the job. 'skip-address': drop that address. */
  onUnknownService?: 'fail' | 'skip-address';
  /** Called once the slot wait is over and the PUT is sent. */
  onRunning?: (target: string) => void;
  dispatcher?: Dispatcher;
}

export type AcquireResult =
  /** The execserver answered with a receipt (ok or not). `status` is the PUT's HTTP status. */
  | { kind: 'done'; receipt: Receipt; status: number; address: string; target: string }
  /** No slot before the deadline ('no_slot': start_after +1 min), or the wait was aborted. */
  | { kind: 'requeue'; reason: 'no_slot' | 'aborted'; rounds: number }
  /** The attempt failed without a receipt: token_not_found, unknown_service, backend_failed, bad_request. */
  | { kind: 'failed'; error: SlotgateError; status: number | null; address: string | null };

interface Grant {
  addr: LegacyAddress;
  token: string;
  /** The PUT target: the token's `service` URL, else the address. */
  target: string;
}

type RoundOutcome = { kind: 'grant'; grant: Grant } | { kind: 'busy' } | { kind: 'unknown'; addr: LegacyAddress; message: string };

/** Translates a legacy error answer (`{"Error": "...", "Status": N}`) into a typed error. */
export function legacyError(status: number, body: string): SlotgateError {
  return translateLegacyError(status, body, 'execserver');
}

function sleep(clock: Clock, ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const onAbort = (): void => {
      clock.clearTimeout(handle);
      resolve();
    };
    const handle = clock.setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function trimUrl(u: string): string {
  return u.replace(/\/+$/, '');
}

/**
 * One round: GET /token/{service} on every address at once. Resolves at the first 200 (the
 * others are still counted when they answer, and their tokens left to expire), at the first 404
 * when 404s fail the job, or when all answered busy.
 */
function tokenRound(addrs: readonly LegacyAddress[], service: string, opts: AcquireOptions, dispatcher: Dispatcher, skipped: Set<LegacyAddress>): Promise<RoundOutcome> {
  return new Promise((resolve) => {
    let decided = false;
    let pending = addrs.length;
    const decide = (o: RoundOutcome): void => {
      if (decided) return;
      decided = true;
      resolve(o);
    };
    const settled = (): void => {
      if (--pending === 0) decide({ kind: 'busy' });
    };
    for (const addr of addrs) {
      void (async () => {
        let status: number | 'error' = 'error';
        let text = '';
        try {
          const res = await request(`${addr.base}/token/${encodeURIComponent(service)}`, {
            method: 'GET',
            dispatcher,
            headersTimeout: TOKEN_REQUEST_TIMEOUT_MS,
            bodyTimeout: TOKEN_REQUEST_TIMEOUT_MS,
          });
          status = res.statusCode;
          text = await res.body.text();
        } catch {
          status = 'error';
        }
        opts.counters.tokenRequest(addr.address, status);
        if (status === 200) {
          let token: unknown;
          let serviceUrl: unknown;
          try {
            const j: unknown = JSON.parse(text);
            if (isPlainObject(j)) {
              token = j.token;
              serviceUrl = j.service;
            }
          } catch {
            /* a 200 without a token is treated as busy */
          }
          if (typeof token === 'string' && token !== '') {
            if (decided) {
              opts.counters.tokenAbandoned();
            } else {
              const target = typeof serviceUrl === 'string' && /^https?:\/\//.test(serviceUrl) ? trimUrl(serviceUrl) : addr.base;
              decide({ kind: 'grant', grant: { addr, token, target } });
            }
          }
        } else if (status === 404) {
          if (opts.onUnknownService === 'skip-address') skipped.add(addr);
          else decide({ kind: 'unknown', addr, message: legacyErrorText(text) ?? `Unknown service ${JSON.stringify(service)}` });
        }
        settled();
      })();
    }
  });
}

/**
 * Waits for a slot the old way and runs the job on it. Never throws: every outcome is a result.
 */
export async function acquireAndRun(job: JobSpec, opts: AcquireOptions): Promise<AcquireResult> {
  const { clock, counters } = opts;
  const dispatcher = opts.dispatcher ?? legacyAgent;
  const interval = opts.pollIntervalMs ?? POLL_INTERVAL_MS;
  const deadline = clock.now() + opts.connectTimeoutSec * 1000;
  const service = job.service;
  let addrs = opts.addresses.map(parseLegacyAddress).filter((a) => a.onlyService === null || a.onlyService === service);
  const noAddress = (): AcquireResult => ({
    kind: 'failed',
    error: new SlotgateError('unknown_service', `no configured execserver address serves ${JSON.stringify(service)}`),
    status: null,
    address: null,
  });
  if (addrs.length === 0) return noAddress();

  let rounds = 0;
  let grant: Grant | undefined;
  for (;;) {
    if (opts.signal?.aborted) return { kind: 'requeue', reason: 'aborted', rounds };
    const roundStart = clock.now();
    const skipped = new Set<LegacyAddress>();
    const outcome = await tokenRound(addrs, service, opts, dispatcher, skipped);
    rounds++;
    if (outcome.kind === 'grant') {
      grant = outcome.grant;
      break;
    }
    if (outcome.kind === 'unknown') {
      return { kind: 'failed', error: new SlotgateError('unknown_service', outcome.message), status: 404, address: outcome.addr.address };
    }
    if (skipped.size > 0) {
      addrs = addrs.filter((a) => !skipped.has(a));
      if (addrs.length === 0) return noAddress();
    }
    counters.busyRound();
    const wakeAt = Math.min(roundStart + interval, deadline);
    await sleep(clock, wakeAt - clock.now(), opts.signal);
    if (opts.signal?.aborted) return { kind: 'requeue', reason: 'aborted', rounds };
    // A timer may fire a fraction of a millisecond early (Node's timers count whole ms, the clock
    // does not): less than 1 ms left is the deadline, not one more token round.
    if (deadline - clock.now() < 1) return { kind: 'requeue', reason: 'no_slot', rounds };
  }
  if (opts.signal?.aborted) return { kind: 'requeue', reason: 'aborted', rounds };
  return put(job, grant, opts, dispatcher);
}

async function put(job: JobSpec, grant: Grant, opts: AcquireOptions, dispatcher: Dispatcher): Promise<AcquireResult> {
  const { counters } = opts;
  const body = usesBody(job);
  const query = encodeURIComponent(JSON.stringify({ ...job, token: grant.token }));
  const url = `${grant.target}/job/${encodeURIComponent(job.service)}?job=${query}`;
  const address = grant.addr.address;
  opts.onRunning?.(grant.target);
  counters.putSent();
  let res: Dispatcher.ResponseData;
  try {
    res = await request(url, {
      method: 'PUT',
      dispatcher,
      body: body.stdin ? (opts.stdin ?? '') : undefined,
      // A job may run for hours: no client-side limit on waiting for the answer.
      headersTimeout: 0,
      bodyTimeout: 0,
    });
  } catch (e) {
    counters.put('error');
    return { kind: 'failed', error: new SlotgateError('backend_failed', `PUT ${grant.target}: ${(e as Error).message}`, { cause: e }), status: null, address };
  }
  counters.put(res.statusCode);

  if (res.statusCode === 200 && body.stdout) {
    // Body mode: the response body is stdout. A failure after the commit aborts it mid-stream.
    let bytes = 0;
    const count = async function* (src: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
      for await (const chunk of src) {
        bytes += chunk.length;
        yield chunk;
      }
    };
    try {
      if (opts.stdout) await pipeline(res.body, count, opts.stdout);
      else for await (const _ of count(res.body)) void _;
    } catch (e) {
      return { kind: 'failed', error: new SlotgateError('pipe_out_failed', `stdout from ${grant.target} broke off after ${bytes} bytes: ${(e as Error).message}`, { cause: e }), status: 200, address };
    }
    const receipt = receiptFromHeader(res.headers) ?? { ...okReceipt(), output_bytes: bytes };
    return { kind: 'done', receipt, status: 200, address, target: grant.target };
  }

  const text = await res.body.text().catch(() => '');
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if ((res.statusCode === 200 || res.statusCode >= 500) && isReceipt(parsed)) {
    return { kind: 'done', receipt: parsed, status: res.statusCode, address, target: grant.target };
  }
  const error = legacyError(res.statusCode, text);
  if (error.code === 'token_not_found') counters.tokenNotFound();
  return { kind: 'failed', error, status: res.statusCode, address };
}
