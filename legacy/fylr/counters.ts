/**
 * What polling costs, counted: token requests per address and status, PUTs, "Token not found"
 * answers, claim queries against file_queue. Rates are counts / `elapsed_ms`.
 *
 * Emits 'change' after every increment, so tests wait for a count instead of sleeping.
 */
import { EventEmitter } from 'node:events';
import { type Clock, systemClock } from '../../src/clock.js';
import { untilChange } from '../../src/until-change.js';

/** An HTTP status, or 'error' for a request that got no answer (refused, reset, timeout). */
export type StatusKey = number | 'error';

export interface StatusCounts {
  total: number;
  by_status: Record<string, number>;
}

export interface LegacyCountersSnapshot {
  elapsed_ms: number;
  token_requests: StatusCounts & { by_address: Record<string, StatusCounts> };
  /** Tokens obtained (200s), including those left to expire. */
  tokens_granted: number;
  /** Tokens obtained but not used: a sibling address answered first in the same round. */
  tokens_abandoned: number;
  /** Polling rounds that found no free slot anywhere. */
  busy_rounds: number;
  /** PUTs sent. */
  puts_sent: number;
  /** PUTs answered (or failed without an answer: 'error'), by status. */
  puts: StatusCounts;
  token_not_found: number;
  claim_queries: number;
  /** Claim queries that found an item. */
  claims: number;
  /** Items the worker pool stored as done (ok receipt), failed, or requeued. */
  results: { done: number; failed: number; requeue: number };
}

function bump(c: StatusCounts, status: StatusKey): void {
  c.total++;
  const k = String(status);
  c.by_status[k] = (c.by_status[k] ?? 0) + 1;
}

function emptyCounts(): StatusCounts {
  return { total: 0, by_status: {} };
}

export class LegacyCounters extends EventEmitter {
  readonly #clock: Clock;
  readonly #startedAt: number;
  readonly #tokenRequests = { ...emptyCounts(), by_address: {} as Record<string, StatusCounts> };
  readonly #puts = emptyCounts();
  #putsSent = 0;
  #tokensGranted = 0;
  #tokensAbandoned = 0;
  #busyRounds = 0;
  #tokenNotFound = 0;
  #claimQueries = 0;
  #claims = 0;
  readonly #results = { done: 0, failed: 0, requeue: 0 };

  constructor(clock: Clock = systemClock) {
    super();
    this.#clock = clock;
    this.#startedAt = clock.now();
  }

  #changed(): void {
    this.emit('change');
  }

  tokenRequest(address: string, status: StatusKey): void {
    bump(this.#tokenRequests, status);
    bump((this.#tokenRequests.by_address[address] ??= emptyCounts()), status);
    if (status === 200) this.#tokensGranted++;
    this.#changed();
  }

  tokenAbandoned(): void {
    this.#tokensAbandoned++;
    this.#changed();
  }

  busyRound(): void {
    this.#busyRounds++;
    this.#changed();
  }

  putSent(): void {
    this.#putsSent++;
    this.#changed();
  }

  put(status: StatusKey): void {
    bump(this.#puts, status);
    this.#changed();
  }

  tokenNotFound(): void {
    this.#tokenNotFound++;
    this.#changed();
  }

  claimQuery(found: boolean): void {
    this.#claimQueries++;
    if (found) this.#claims++;
    this.#changed();
  }

  result(kind: 'done' | 'failed' | 'requeue'): void {
    this.#results[kind]++;
    this.#changed();
  }

  get tokenRequests(): number {
    return this.#tokenRequests.total;
  }

  get tokenNotFoundCount(): number {
    return this.#tokenNotFound;
  }

  get claimQueries(): number {
    return this.#claimQueries;
  }

  get busyRounds(): number {
    return this.#busyRounds;
  }

  tokenRequestsTo(address: string): number {
    return this.#tokenRequests.by_address[address]?.total ?? 0;
  }

  /** Resolves once `predicate()` holds (checked now and after every change). */
  until(predicate: () => boolean): Promise<void> {
    return untilChange(this, predicate);
  }

  snapshot(): LegacyCountersSnapshot {
    const copy = (c: StatusCounts): StatusCounts => ({ total: c.total, by_status: { ...c.by_status } });
    return {
      elapsed_ms: this.#clock.now() - this.#startedAt,
      token_requests: {
        ...copy(this.#tokenRequests),
        by_address: Object.fromEntries(Object.entries(this.#tokenRequests.by_address).map(([a, c]) => [a, copy(c)])),
      },
      tokens_granted: this.#tokensGranted,
      tokens_abandoned: this.#tokensAbandoned,
      busy_rounds: this.#busyRounds,
      puts_sent: this.#putsSent,
      puts: copy(this.#puts),
      token_not_found: this.#tokenNotFound,
      claim_queries: this.#claimQueries,
      claims: this.#claims,
      results: { ...this.#results },
    };
  }
}
