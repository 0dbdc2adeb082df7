/**
 * The gateway's only source of backend traffic while broker wants wait: `GET /token/{service}`
 * requests, rate-limited so that the load on the backends does not grow with the number of
 * waiting jobs.
 *
 *   request(wg, svc, n) ─► over the backends in turn (the start rotates), while n > 0:
 *        skip one if: it has no slot in wg · (backend, svc) has its limit in flight ·
 *                    (backend, wg) is paused · the gateway already holds all its slots in wg
 *        else GET /token ──200──► onToken(grant), onReady(wg)        (the caller may ask again)
 *                        ──503 / unreachable──► pause (backend, wg) for poll_interval_ms
 *                        ──404 unknown service──► pause (backend, svc) for poll_interval_ms
 *        a pause lapses (injected clock) ─► onReady(wg)
 *   wake(backend, wg): a slot there just freed (a relayed job ended, a token came back):
 *        the pause ends now, so the next request does not wait for the poll.
 *
 * The limit in flight per (backend, service) is 1, and MAX_TOKEN_REQUESTS_IN_FLIGHT while that
 * pair's last answer was a token: a backend that just had a slot to spare likely has more, and
 * one request at a time (a new TCP connection each, ~1 ms) capped the gateway near 1,000 jobs/s
 * however many slots stood free (bench/README.md). A 503 or a failure drops it back to 1, so a
 * full backend is never asked more than once per poll interval and waitgroup.
 *
 * Invariants: at most MAX_TOKEN_REQUESTS_IN_FLIGHT requests in flight per (backend, service),
 * never more than the slots the gateway does not hold there; after a 503 a backend hears
 * from this pump again for that waitgroup only after poll_interval_ms or a wake. The pump never
 * asks on its own: every request comes from `request()`, which the slot source calls only while
 * wants are parked, so an idle gateway sends nothing.
 */
import type { Clock, TimerHandle } from '../clock.js';
import { SlotgateError } from '../errors.js';
import type { Backend } from './backend.js';
import { acceptServiceUrl } from './replica-url.js';

/** Token requests in flight per (backend, service) while its answers are tokens. */
export const MAX_TOKEN_REQUESTS_IN_FLIGHT = 4;

export interface TokenGrant {
  backend: Backend;
  waitgroup: string;
  service: string;
  /** The backend's token. */
  token: string;
  /** Where to redeem it: the backend URL, or the replica its answer named. */
  target: string;
  /** When the request was sent: the token's 10 s life started no earlier. */
  askedAt: number;
}

export interface TokenPumpOptions {
  backends: readonly Backend[];
  clock: Clock;
  pollIntervalMs: number;
  onToken(grant: TokenGrant): void;
  /** A request ended or a pause lapsed: the waitgroup may ask again. */
  onReady(waitgroup: string): void;
}

export class TokenPump {
  readonly #opts: TokenPumpOptions;
  readonly #urls: string[];
  /** `${backend}|${service}` -> the requests in flight. */
  readonly #inflight = new Map<string, Set<AbortController>>();
  /** `${backend}|${service}` pairs whose last answer was a token: they may have several in flight. */
  readonly #streak = new Set<string>();
  /** `${backend}|${waitgroup}` -> requests in flight. */
  readonly #inflightByGroup = new Map<string, number>();
  /** `${backend}|wg|${waitgroup}` or `${backend}|svc|${service}` -> the timer that ends the pause. */
  readonly #pauses = new Map<string, { timer: TimerHandle; waitgroup: string }>();
  readonly #cursor = new Map<string, number>();
  #closed = false;

  constructor(opts: TokenPumpOptions) {
    this.#opts = opts;
    this.#urls = opts.backends.map((b) => b.url);
  }

  /** Requests in flight for the waitgroup, over all backends. */
  inFlight(waitgroup: string): number {
    let n = 0;
    for (const b of this.#opts.backends) n += this.#inflightByGroup.get(`${b.index}|${waitgroup}`) ?? 0;
    return n;
  }

  /** Starts up to `count` token requests for `service`; returns how many it started. */
  request(waitgroup: string, service: string, count: number): number {
    const backends = this.#opts.backends;
    if (this.#closed || count <= 0 || backends.length === 0) return 0;
    const start = this.#cursor.get(waitgroup) ?? 0;
    this.#cursor.set(waitgroup, (start + 1) % backends.length);
    let started = 0;
    // Passes over the backends, one request each, so that several go to different backends
    // before any backend gets a second one.
    for (let progress = true; progress && started < count; ) {
      progress = false;
      for (let i = 0; i < backends.length && started < count; i++) {
        const b = backends[(start + i) % backends.length] as Backend;
        if (!this.#mayAsk(b, waitgroup, service)) continue;
        void this.#ask(b, waitgroup, service);
        started++;
        progress = true;
      }
    }
    return started;
  }

  #mayAsk(b: Backend, waitgroup: string, service: string): boolean {
    const processes = b.processes(waitgroup);
    if (processes <= 0) return false;
    const key = `${b.index}|${service}`;
    const limit = this.#streak.has(key) ? MAX_TOKEN_REQUESTS_IN_FLIGHT : 1;
    if ((this.#inflight.get(key)?.size ?? 0) >= limit) return false;
    if (this.#pauses.has(`${b.index}|wg|${waitgroup}`) || this.#pauses.has(`${b.index}|svc|${service}`)) return false;
    return b.held(waitgroup) + (this.#inflightByGroup.get(`${b.index}|${waitgroup}`) ?? 0) < processes;
  }

  /** A slot of `backend` in `waitgroup` freed: its pause ends now. The caller asks again. */
  wake(b: Backend, waitgroup: string): void {
    const key = `${b.index}|wg|${waitgroup}`;
    const pause = this.#pauses.get(key);
    if (!pause) return;
    this.#opts.clock.clearTimeout(pause.timer);
    this.#pauses.delete(key);
  }

  #pause(key: string, waitgroup: string): void {
    if (this.#closed || this.#pauses.has(key)) return;
    const timer = this.#opts.clock.setTimeout(() => {
      this.#pauses.delete(key);
      this.#opts.onReady(waitgroup);
    }, this.#opts.pollIntervalMs);
    this.#pauses.set(key, { timer, waitgroup });
  }

  async #ask(b: Backend, waitgroup: string, service: string): Promise<void> {
    const key = `${b.index}|${service}`;
    const groupKey = `${b.index}|${waitgroup}`;
    const abort = new AbortController();
    const inflight = this.#inflight.get(key) ?? new Set<AbortController>();
    inflight.add(abort);
    this.#inflight.set(key, inflight);
    this.#inflightByGroup.set(groupKey, (this.#inflightByGroup.get(groupKey) ?? 0) + 1);
    const askedAt = this.#opts.clock.now();
    let grant: TokenGrant | null = null;
    try {
      const answer = await b.client.getToken(service, abort.signal);
      if (answer.kind === 'busy') {
        this.#streak.delete(key);
        b.countTokenRequest('503');
        this.#pause(`${b.index}|wg|${waitgroup}`, waitgroup);
      } else {
        const target = answer.serviceUrl === null ? b.url : acceptServiceUrl(answer.serviceUrl, b.url, this.#urls);
        if (target === null) {
          this.#streak.delete(key);
          // Not an address the gateway may use: the token lapses on its own at that replica.
          b.countTokenRequest('refused_service_url');
          b.lastError = `token response named ${JSON.stringify(answer.serviceUrl)}, which the gateway does not address (docs/gateway.md)`;
          this.#pause(`${b.index}|wg|${waitgroup}`, waitgroup);
        } else {
          this.#streak.add(key);
          b.countTokenRequest('200');
          b.sawReplica(target);
          grant = { backend: b, waitgroup, service, token: answer.token, target, askedAt };
        }
      }
    } catch (e) {
      this.#streak.delete(key);
      const err = e instanceof SlotgateError ? e : new SlotgateError('backend_failed', String(e));
      if (!this.#closed) {
        b.lastError = err.message;
        if (err.code === 'unknown_service') {
          b.countTokenRequest('404');
          this.#pause(`${b.index}|svc|${service}`, waitgroup);
        } else {
          b.countTokenRequest('error');
          this.#pause(`${b.index}|wg|${waitgroup}`, waitgroup);
        }
      }
    } finally {
      inflight.delete(abort);
      if (inflight.size === 0) this.#inflight.delete(key);
      const n = (this.#inflightByGroup.get(groupKey) ?? 1) - 1;
      if (n > 0) this.#inflightByGroup.set(groupKey, n);
      else this.#inflightByGroup.delete(groupKey);
    }
    // A token that arrives after close() still goes to onToken: the source gives it back.
    if (grant !== null) this.#opts.onToken(grant);
    if (!this.#closed) this.#opts.onReady(waitgroup);
  }

  /** Pauses in force, for /status. */
  pauses(): string[] {
    return [...this.#pauses.keys()];
  }

  /** Stops asking: pauses end, requests in flight are aborted. */
  close(): void {
    this.#closed = true;
    for (const p of this.#pauses.values()) this.#opts.clock.clearTimeout(p.timer);
    this.#pauses.clear();
    for (const set of this.#inflight.values()) for (const a of set) a.abort(new Error('gateway closing'));
  }
}
