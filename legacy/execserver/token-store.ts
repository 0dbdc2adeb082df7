/**
 * The old execserver's slot reservation (PROTOCOL.md §5), flaws included: `GET /token` reserves
 * one slot of the service's waitgroup under a random, single-use token that lives
 * LEGACY_TOKEN_TTL_MS in this instance's memory only; `PUT /job` redeems it. Another instance
 * behind the same address knows nothing of it ("Token not found"), and a client that never PUTs
 * holds the slot until a cleanup tick frees it.
 *
 *   per waitgroup:  held = reserved (live tokens) + running  <=  processes
 *
 *   issue ──> reserved ──redeem──> running ──release──> free
 *                 └──expiry: the cleanup tick (every CLEANUP_INTERVAL_MS), or found lapsed on use──> free
 */
import { randomUUID } from 'node:crypto';
import { type Clock, every } from '../../src/clock.js';
import { LEGACY_TOKEN_TTL_MS, type ServeConfig } from '../../src/config/types.js';
import type { LegacyExecCounters } from './legacy-counters.js';

/** How often the cleanup timer looks for lapsed tokens. */
export const CLEANUP_INTERVAL_MS = 1000;

interface Reservation {
  token: string;
  service: string;
  waitgroup: string;
  expiresAt: number;
}

/** A redeemed token: one running job holding one slot. */
export interface RunningSlot {
  readonly service: string;
  readonly waitgroup: string;
}

export type IssueResult = { ok: true; token: string } | { ok: false; reason: 'unknown_service' | 'busy' };
export type RedeemResult = { ok: true; slot: RunningSlot } | { ok: false; reason: 'not_found' | 'wrong_service' };

export class TokenStore {
  readonly #config: Pick<ServeConfig, 'waitgroups' | 'services'>;
  readonly #clock: Clock;
  readonly #counters: LegacyExecCounters;
  readonly #ttlMs: number;
  readonly #tokens = new Map<string, Reservation>();
  readonly #reserved = new Map<string, number>();
  readonly #running = new Map<string, number>();
  readonly #live = new Set<RunningSlot>();
  readonly #stopCleanup: () => void;

  constructor(config: Pick<ServeConfig, 'waitgroups' | 'services'>, clock: Clock, counters: LegacyExecCounters, ttlMs = LEGACY_TOKEN_TTL_MS) {
    this.#config = config;
    this.#clock = clock;
    this.#counters = counters;
    this.#ttlMs = ttlMs;
    this.#stopCleanup = every(clock, CLEANUP_INTERVAL_MS, () => this.#sweep());
  }

  /** Slots of the waitgroup that are reserved or running. */
  held(waitgroup: string): number {
    return (this.#reserved.get(waitgroup) ?? 0) + (this.#running.get(waitgroup) ?? 0);
  }

  issue(service: string): IssueResult {
    const svc = Object.hasOwn(this.#config.services, service) ? this.#config.services[service] : undefined;
    if (svc === undefined) return { ok: false, reason: 'unknown_service' };
    // No sweep here: like the old server, a lapsed token's slot is only freed by the cleanup tick.
    const wg = svc.waitgroup;
    if (this.held(wg) >= (this.#config.waitgroups[wg] ?? 0)) return { ok: false, reason: 'busy' };
    const token = randomUUID();
    this.#tokens.set(token, { token, service, waitgroup: wg, expiresAt: this.#clock.now() + this.#ttlMs });
    this.#reserved.set(wg, (this.#reserved.get(wg) ?? 0) + 1);
    this.#counters.tokensIssued++;
    this.#noteHeld(wg);
    return { ok: true, token };
  }

  /**
   * Spends the token and turns its reservation into a running slot. A token of another service
   * is refused and NOT spent: it still holds its own service's slot until used or expired.
   */
  redeem(token: string, service: string): RedeemResult {
    const r = this.#tokens.get(token);
    if (r === undefined) return { ok: false, reason: 'not_found' };
    if (this.#clock.now() >= r.expiresAt) {
      this.#expire(r);
      return { ok: false, reason: 'not_found' };
    }
    if (r.service !== service) return { ok: false, reason: 'wrong_service' };
    this.#tokens.delete(token);
    this.#reserved.set(r.waitgroup, (this.#reserved.get(r.waitgroup) ?? 1) - 1);
    const running = (this.#running.get(r.waitgroup) ?? 0) + 1;
    this.#running.set(r.waitgroup, running);
    this.#counters.tokensRedeemed++;
    this.#counters.running[r.waitgroup] = running;
    if (running > (this.#counters.maxRunning[r.waitgroup] ?? 0)) this.#counters.maxRunning[r.waitgroup] = running;
    const slot: RunningSlot = { service: r.service, waitgroup: r.waitgroup };
    this.#live.add(slot);
    return { ok: true, slot };
  }

  /** The job ended: its slot is free. Releasing twice is a no-op. */
  release(slot: RunningSlot): void {
    if (!this.#live.delete(slot)) return;
    const running = (this.#running.get(slot.waitgroup) ?? 1) - 1;
    this.#running.set(slot.waitgroup, running);
    this.#counters.running[slot.waitgroup] = running;
  }

  close(): void {
    this.#stopCleanup();
  }

  #noteHeld(wg: string): void {
    const held = this.held(wg);
    if (held > (this.#counters.maxHeld[wg] ?? 0)) this.#counters.maxHeld[wg] = held;
  }

  #expire(r: Reservation): void {
    if (!this.#tokens.delete(r.token)) return;
    this.#reserved.set(r.waitgroup, (this.#reserved.get(r.waitgroup) ?? 1) - 1);
    this.#counters.tokensExpired++;
  }

  #sweep(): void {
    const now = this.#clock.now();
    for (const r of this.#tokens.values()) {
      if (now >= r.expiresAt) this.#expire(r);
    }
  }
}
