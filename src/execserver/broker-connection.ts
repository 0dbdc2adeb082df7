/**
 * One fylr's websocket, as the broker sees it: a small transport (so unit tests can drive it
 * over an in-memory pair), its offers and running jobs, liveness and the refusal window.
 * Frame semantics live in Broker; this file only keeps per-connection state.
 */
import type { TimerHandle } from '../clock.js';
import type { ConnectionId, Want } from '../book/want-book.js';
import type { Slot } from '../slots/slot-source.js';

export interface BrokerTransport {
  send(text: string): void;
  /** A clean close with a websocket close code. */
  close(code: number, reason: string): void;
  /** Drop the socket at once (half-open peer). */
  terminate(): void;
  ping(): void;
}

export interface ConnectionInfo {
  remoteAddress?: string | undefined;
  localAddress?: string | undefined;
}

export interface Offer {
  readonly want: Want;
  readonly slot: Slot;
  readonly token: string;
  readonly offeredAt: number;
  timer: TimerHandle | undefined;
}

export interface RunningJob {
  readonly jobId: string;
  readonly connId: ConnectionId;
  readonly service: string;
  readonly priority: number;
  readonly slot: Slot;
  readonly abort: AbortController;
  readonly startedAt: number;
}

/** More refused frames than this within REFUSAL_WINDOW_MS closes the connection (1008). */
export const MAX_REFUSALS = 100;
export const REFUSAL_WINDOW_MS = 10_000;
/** HELLO is re-sent on change, but at most this often per connection. */
export const HELLO_MIN_INTERVAL_MS = 100;
/** A peer silent for this many ping intervals is half-open: terminated (PROTOCOL.md §1). */
export const PING_MISSES_ALLOWED = 2;

/** How many UNWANT-withdrawn offers a connection remembers for a late DECLINE. */
export const MAX_REMEMBERED_WITHDRAWALS = 1024;

export class BrokerConnection {
  readonly id: ConnectionId;
  readonly transport: BrokerTransport;
  readonly info: ConnectionInfo;
  readonly connectedAt: number;
  readonly offers = new Map<string, Offer>();
  readonly running = new Map<string, RunningJob>();
  /** Times of recent refusals, oldest first; pruned to the window. */
  readonly #refusals: number[] = [];
  /** When the peer last showed life (a frame, a pong or a ping of its own). */
  lastSeenAt: number;
  /** When the next ping is due. */
  nextPingAt: number;
  closed = false;
  /** The content of the last HELLO sent, minus the volatile counts, to skip identical re-sends. */
  lastHelloSignature = '';
  lastHelloAt = Number.NEGATIVE_INFINITY;
  helloTimer: TimerHandle | undefined;
  pingTimer: TimerHandle | undefined;
  framesIn = 0;
  framesOut = 0;

  constructor(id: ConnectionId, transport: BrokerTransport, info: ConnectionInfo, now: number, pingIntervalMs: number) {
    this.id = id;
    this.transport = transport;
    this.info = info;
    this.connectedAt = now;
    this.lastSeenAt = now;
    this.nextPingAt = now + pingIntervalMs;
  }

  /**
   * Tokens of offers an UNWANT withdrew, by job_id. A fylr that raced an OFFER against its own
   * UNWANT DECLINEs that offer once it arrives (the UNWANT already freed the slot); such a DECLINE
   * is acknowledged silently instead of counting as a refused frame. Bounded, oldest dropped.
   */
  readonly #withdrawnByUnwant = new Map<string, string>();

  rememberWithdrawn(jobId: string, token: string): void {
    this.#withdrawnByUnwant.delete(jobId);
    this.#withdrawnByUnwant.set(jobId, token);
    if (this.#withdrawnByUnwant.size > MAX_REMEMBERED_WITHDRAWALS) {
      const oldest = this.#withdrawnByUnwant.keys().next().value as string;
      this.#withdrawnByUnwant.delete(oldest);
    }
  }

  /** True (and forgotten) when this DECLINE answers an offer that an UNWANT already withdrew. */
  takeWithdrawn(jobId: string, token: string): boolean {
    if (this.#withdrawnByUnwant.get(jobId) !== token) return false;
    this.#withdrawnByUnwant.delete(jobId);
    return true;
  }

  forgetWithdrawn(jobId: string): void {
    this.#withdrawnByUnwant.delete(jobId);
  }

  send(text: string): void {
    if (this.closed) return;
    this.framesOut++;
    this.transport.send(text);
  }

  /** Records a refusal; true when the connection is over the limit and must be closed. */
  refuse(now: number): boolean {
    this.#refusals.push(now);
    while (this.#refusals.length > 0 && (this.#refusals[0] as number) <= now - REFUSAL_WINDOW_MS) this.#refusals.shift();
    return this.#refusals.length > MAX_REFUSALS;
  }
}
