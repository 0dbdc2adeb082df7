/**
 * The gateway's SlotSource: a slot is a legacy token held from one backend (PROTOCOL.md §5, §6).
 * HELLO's `processes` is the sum of the backends' slots; the broker, the want-book and the broker
 * connections are the native execserver's, unchanged.
 *
 * A token's life:
 *
 *   (parked wants) ─► TokenPump GET /token ──► free ──tryReserve──► offered ──run──► running ──► gone
 *                                               ▲  │                  │ release (DECLINE, expiry,
 *                                               │  │                  │ UNWANT, close)
 *                                               └──┼──────────────────┘  still good for another offer?
 *                                                  │                     then free again, else given back
 *                                                  └─ nobody took it by the end of the broker's pump
 *                                                     ─► given back at once (redeemed with a job that
 *                                                        has no commands) ─► gone
 *
 * Demand: only while wants are parked (DemandView), and only for the wants no token covers yet
 * (parked - free - in flight), does the pump ask; it asks for the service of the want the grant
 * rule picks next (DemandView.peek). A token of another service that comes back meanwhile still
 * goes to the best want of ITS service (the broker's spare-services path), or is given back.
 *
 * A token lives LEGACY_TOKEN_TTL_MS from its request at the latest. It is offered again after a
 * DECLINE or an expired offer only if it outlives the new offer by REOFFER_MARGIN_MS, so a JOB
 * that comes at the last moment of an offer still finds the token alive at the backend.
 *
 * Every relayed job that ends frees its backend's slot: the pump's pause for that backend ends
 * and the waitgroup asks again at once (no waiting for the poll for work that went through here).
 */
import type { Clock } from '../clock.js';
import { LEGACY_TOKEN_TTL_MS, type ServeConfig } from '../config/types.js';
import { failedReceipt, type JobSpec, type Receipt } from '../protocol/job.js';
import type { DemandView, JobIo, Slot, SlotSource } from '../slots/slot-source.js';
import { type Backend, type BackendStatus, backendsOf } from './backend.js';
import { relayJob } from './job-relay.js';
import { acceptServiceUrl } from './replica-url.js';
import { type TokenGrant, TokenPump } from './token-pump.js';

/** A re-offered token must outlive its new offer by this much (the JOB's trip to the backend). */
export const REOFFER_MARGIN_MS = 500;
/** A fresh token is offered if no older than this (its request took longer: given back). */
export const FRESH_TOKEN_MAX_AGE_MS = 250;
/**
 * After a CANCEL the old execserver stops the job when the gateway hangs up (SIGTERM, then
 * SIGKILL after its kill grace of 2 s) and frees the slot, and says nothing. DONE waits until the
 * backend grants a token in that waitgroup again, asking with backoff from STOP_PROBE_FIRST_MS,
 * for at most STOP_CONFIRM_MS.
 */
export const STOP_CONFIRM_MS = 3000;
export const STOP_PROBE_FIRST_MS = 10;

type TokenState = 'free' | 'offered' | 'running' | 'returning' | 'gone';

export interface HeldToken extends Slot {
  readonly service: string;
  readonly backend: Backend;
  readonly token: string;
  readonly target: string;
  readonly askedAt: number;
  state: TokenState;
  offers: number;
}

export interface GatewaySlotSourceOptions {
  config: ServeConfig;
  clock: Clock;
}

export interface GatewaySourceStatus {
  backends: BackendStatus[];
  tokens: { free: number; offered: number; running: number; returning: number };
  token_requests_in_flight: number;
  pauses: string[];
}

export class GatewaySlotSource implements SlotSource {
  readonly kind = 'gateway' as const;
  readonly backends: readonly Backend[];
  readonly #config: ServeConfig;
  readonly #clock: Clock;
  readonly #pump: TokenPump;
  readonly #tokens = new Map<number, HeldToken>();
  readonly #returning = new Set<Promise<void>>();
  /** Relays and stop confirmations in flight; close() waits for them. */
  readonly #work = new Set<Promise<unknown>>();
  readonly #sweeps = new Set<string>();
  #view: DemandView | undefined;
  #listener: (waitgroup: string) => void = () => undefined;
  #draining: () => boolean = () => false;
  #closed = false;
  #nextId = 1;

  constructor(opts: GatewaySlotSourceOptions) {
    this.#config = opts.config;
    this.#clock = opts.clock;
    this.backends = backendsOf(opts.config);
    this.#pump = new TokenPump({
      backends: this.backends,
      clock: opts.clock,
      pollIntervalMs: opts.config.gateway.poll_interval_ms,
      onToken: (g) => this.#tokenArrived(g),
      onReady: (wg) => this.#fill(wg),
    });
  }

  /**
   * Lets the source see the broker's draining flag: while it is up no token is asked for, and
   * one that arrives is given back (the broker makes no offers then).
   */
  watchDraining(draining: () => boolean): void {
    this.#draining = draining;
  }

  #stopped(): boolean {
    return this.#closed || this.#draining();
  }

  // ---------------------------------------------------------------- counts

  processes(waitgroup: string): number {
    return this.backends.reduce((n, b) => n + b.processes(waitgroup), 0);
  }

  #count(waitgroup: string, ...states: TokenState[]): number {
    let n = 0;
    for (const t of this.#tokens.values()) if (t.waitgroup === waitgroup && states.includes(t.state)) n++;
    return n;
  }

  inUse(waitgroup: string): number {
    return this.#count(waitgroup, 'free', 'offered', 'running');
  }

  running(waitgroup: string): number {
    return this.#count(waitgroup, 'running');
  }

  // ---------------------------------------------------------------- the SlotSource port

  #offerable(t: HeldToken): boolean {
    if (t.state !== 'free') return false;
    const age = this.#clock.now() - t.askedAt;
    if (t.offers === 0) return age <= Math.max(FRESH_TOKEN_MAX_AGE_MS, LEGACY_TOKEN_TTL_MS - this.#config.broker.offer_timeout_ms - REOFFER_MARGIN_MS);
    return age + this.#config.broker.offer_timeout_ms + REOFFER_MARGIN_MS <= LEGACY_TOKEN_TTL_MS;
  }

  tryReserve(waitgroup: string, service: string): Slot | null {
    let best: HeldToken | undefined;
    for (const t of this.#tokens.values()) {
      if (t.waitgroup !== waitgroup || t.service !== service || !this.#offerable(t)) continue;
      // The oldest first: it has the least life left to lose.
      if (best === undefined || t.askedAt < best.askedAt) best = t;
    }
    if (best === undefined) {
      this.#scheduleSweep(waitgroup);
      return null;
    }
    best.state = 'offered';
    best.offers++;
    return best;
  }

  spareServices(waitgroup: string): string[] {
    const out = new Set<string>();
    for (const t of this.#tokens.values()) if (t.waitgroup === waitgroup && this.#offerable(t)) out.add(t.service);
    return [...out];
  }

  release(slot: Slot): void {
    const t = this.#tokens.get(slot.id);
    if (t === undefined || t.state !== 'offered') return;
    // Still valid: the broker's pump (which follows at once) may hand it to the next want of
    // its service; what nobody takes is given back when the pump is over.
    t.state = 'free';
    this.#scheduleSweep(t.waitgroup);
  }

  async run(slot: Slot, job: JobSpec, io: JobIo): Promise<Receipt> {
    const t = this.#tokens.get(slot.id);
    if (t === undefined || t.state !== 'offered') return failedReceipt('internal', 'slot was not reserved');
    t.state = 'running';
    const work = this.#relay(t, job, io);
    this.#work.add(work);
    try {
      return await work;
    } finally {
      this.#work.delete(work);
    }
  }

  async #relay(t: HeldToken, job: JobSpec, io: JobIo): Promise<Receipt> {
    const b = t.backend;
    b.jobsRelayed++;
    const { receipt, tokenSpent } = await relayJob({ client: b.client, target: t.target, token: t.token }, job, io, {
      clock: this.#clock,
      defaultTimeoutSec: this.#config.default_timeout_sec,
    });
    if (receipt.error?.code === 'backend_failed') {
      b.jobsFailed++;
      b.lastError = receipt.error.message;
    }
    if (!tokenSpent) this.#giveBack(t);
    else {
      if (receipt.stopped) await this.#confirmStopped(t);
      this.#gone(t);
    }
    return receipt;
  }

  /**
   * A relayed job was stopped by hanging up on its backend: resolves once the backend grants a
   * token of the waitgroup again (its slot is back; the token joins the pool, so a parked want
   * gets it at once, or it is given back), or after STOP_CONFIRM_MS, or when it cannot be asked.
   */
  async #confirmStopped(t: HeldToken): Promise<void> {
    const b = t.backend;
    const deadline = this.#clock.now() + STOP_CONFIRM_MS;
    for (let wait = STOP_PROBE_FIRST_MS; !this.#stopped(); wait *= 2) {
      const askedAt = this.#clock.now();
      let answer;
      try {
        answer = await b.client.getToken(t.service, undefined, t.target);
      } catch {
        return;
      }
      if (answer.kind === 'token') {
        b.countTokenRequest('200');
        const target = answer.serviceUrl === null ? t.target : acceptServiceUrl(answer.serviceUrl, b.url, this.backends.map((x) => x.url));
        if (target !== null) this.#tokenArrived({ backend: b, waitgroup: t.waitgroup, service: t.service, token: answer.token, target, askedAt });
        return;
      }
      b.countTokenRequest('503');
      if (this.#clock.now() + wait > deadline) return;
      await new Promise<void>((resolve) => this.#clock.setTimeout(resolve, wait));
    }
  }

  onAvailable(listener: (waitgroup: string) => void): void {
    this.#listener = listener;
  }

  demandChanged(waitgroup: string, view: DemandView): void {
    this.#view = view;
    this.#fill(waitgroup);
  }

  // ---------------------------------------------------------------- tokens

  /** Asks for tokens for the parked wants that no token covers yet. */
  #fill(waitgroup: string): void {
    if (this.#stopped() || this.#view === undefined) return;
    const uncovered = this.#view.parked(waitgroup) - this.#count(waitgroup, 'free') - this.#pump.inFlight(waitgroup);
    if (uncovered <= 0) return;
    const head = this.#view.peek(waitgroup);
    if (head === undefined) return;
    this.#pump.request(waitgroup, head.service, uncovered);
  }

  #tokenArrived(g: TokenGrant): void {
    const t: HeldToken = {
      id: this.#nextId++,
      waitgroup: g.waitgroup,
      service: g.service,
      backend: g.backend,
      token: g.token,
      target: g.target,
      askedAt: g.askedAt,
      state: 'free',
      offers: 0,
    };
    this.#tokens.set(t.id, t);
    g.backend.hold(t.waitgroup, 1);
    if (this.#stopped()) {
      this.#giveBack(t);
      return;
    }
    // The broker pumps now; whatever it leaves is given back right after.
    this.#listener(t.waitgroup);
    this.#scheduleSweep(t.waitgroup);
  }

  /** After the current synchronous step (the broker's pump), give back what nobody took. */
  #scheduleSweep(waitgroup: string): void {
    if (this.#sweeps.has(waitgroup)) return;
    this.#sweeps.add(waitgroup);
    queueMicrotask(() => {
      this.#sweeps.delete(waitgroup);
      this.#sweep(waitgroup);
    });
  }

  #sweep(waitgroup: string): void {
    for (const t of [...this.#tokens.values()]) {
      if (t.waitgroup === waitgroup && t.state === 'free') this.#giveBack(t);
    }
  }

  /** The token is spent (its job ran) or lapsed: the backend's slot is free again. */
  #gone(t: HeldToken): void {
    if (t.state === 'gone') return;
    t.state = 'gone';
    this.#tokens.delete(t.id);
    t.backend.hold(t.waitgroup, -1);
    this.#pump.wake(t.backend, t.waitgroup);
    this.#fill(t.waitgroup);
    // inUse dropped (the broker re-checks a drain's completion here).
    this.#listener(t.waitgroup);
  }

  #giveBack(t: HeldToken): void {
    if (t.state === 'returning' || t.state === 'gone') return;
    if (this.#clock.now() - t.askedAt >= LEGACY_TOKEN_TTL_MS) {
      // Lapsed already: the backend freed the slot on its own.
      this.#gone(t);
      return;
    }
    const wasInUse = t.state === 'free' || t.state === 'offered';
    t.state = 'returning';
    if (wasInUse) this.#listener(t.waitgroup);
    const p = t.backend.client
      .giveBack(t.target, t.service, t.token)
      .then(
        () => {
          t.backend.tokensGivenBack++;
        },
        (e: unknown) => {
          // The slot comes back when the token lapses, at the latest.
          t.backend.lastError = `give-back failed: ${(e as Error).message}`;
        },
      )
      .finally(() => {
        this.#returning.delete(p);
        this.#gone(t);
      });
    this.#returning.add(p);
  }

  /** A token obtained elsewhere (the legacy API, when a want parked meanwhile) joins the pool. */
  adoptToken(g: TokenGrant): void {
    this.#tokenArrived(g);
  }

  /** A legacy job (an old fylr's PUT through this gateway) ended on `backend`. */
  legacyJobEnded(b: Backend, waitgroup: string): void {
    this.#pump.wake(b, waitgroup);
    this.#fill(waitgroup);
  }

  backendByUrl(url: string): Backend | undefined {
    return this.backends.find((b) => b.url === url);
  }

  status(): GatewaySourceStatus {
    const tokens = { free: 0, offered: 0, running: 0, returning: 0 };
    for (const t of this.#tokens.values()) if (t.state !== 'gone') tokens[t.state]++;
    let inflight = 0;
    for (const wg of Object.keys(this.#config.waitgroups)) inflight += this.#pump.inFlight(wg);
    return { backends: this.backends.map((b) => b.status()), tokens, token_requests_in_flight: inflight, pauses: this.#pump.pauses() };
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#pump.close();
    for (const t of [...this.#tokens.values()]) if (t.state === 'free' || t.state === 'offered') this.#giveBack(t);
    while (this.#work.size > 0 || this.#returning.size > 0) await Promise.allSettled([...this.#work, ...this.#returning]);
  }
}
