/**
 * Legacy tokens of a native execserver: a token is a reserved local slot, single use, alive for
 * LEGACY_TOKEN_TTL_MS. Expiry gives the slot back to the source (and so to parked wants).
 */
import { randomBytes } from 'node:crypto';
import type { Clock, TimerHandle } from '../clock.js';
import { LEGACY_TOKEN_TTL_MS } from '../config/types.js';
import type { Slot, SlotSource } from '../slots/slot-source.js';

interface Held {
  service: string;
  slot: Slot;
  timer: TimerHandle;
}

export class LegacyTokens {
  readonly #held = new Map<string, Held>();
  readonly #clock: Clock;
  readonly #source: SlotSource;
  readonly #ttlMs: number;
  issued = 0;
  expired = 0;

  constructor(source: SlotSource, clock: Clock, ttlMs = LEGACY_TOKEN_TTL_MS) {
    this.#source = source;
    this.#clock = clock;
    this.#ttlMs = ttlMs;
  }

  get outstanding(): number {
    return this.#held.size;
  }

  issue(service: string, slot: Slot): string {
    const token = randomBytes(16).toString('base64url');
    const timer = this.#clock.setTimeout(() => {
      if (this.#held.delete(token)) {
        this.expired++;
        this.#source.release(slot);
      }
    }, this.#ttlMs);
    this.#held.set(token, { service, slot, timer });
    this.issued++;
    return token;
  }

  /** Spends a token of `service`; undefined for an unknown, used, expired or other-service token. */
  redeem(token: string | undefined, service: string): Slot | undefined {
    if (token === undefined) return undefined;
    const held = this.#held.get(token);
    if (!held || held.service !== service) return undefined;
    this.#held.delete(token);
    this.#clock.clearTimeout(held.timer);
    return held.slot;
  }

  releaseAll(): void {
    for (const [token, held] of this.#held) {
      this.#clock.clearTimeout(held.timer);
      this.#held.delete(token);
      this.#source.release(held.slot);
    }
  }
}
