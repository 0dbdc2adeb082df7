/**
 * The connections of one configured execserver address (seed: "Replicas behind one address").
 *
 *   mode:  connecting --HELLO--> broker <--reprobe: HELLO-- polling
 *              |                 |  ^                        ^
 *              |   last link lost|  |HELLO                   | 404 on the upgrade, no link left
 *              v                 v  |                        |
 *            down  <------------------ refused / 502 / timeout (reconnect with jittered backoff)
 *
 * Seats: the number of connections the pool means to hold. One to start. A seat whose link drops
 * is redialled with jittered backoff (through a balancer it lands on a live pod). `grow()` adds a
 * seat under backpressure (the client decides what that is): at most one growth dial every
 * `growthMinIntervalMs`, none while another dial is in flight, never beyond
 * `maxConnections`. A link whose HELLO names an instance already in the pool is closed at once,
 * gives its seat up and marks the pool `covered`: growth stops until the next re-probe
 * (every `reprobeIntervalMs`) clears the mark. In polling mode the re-probe dials `/broker`
 * again, so an address that got a broker-speaking server switches by itself.
 */
import { type Clock, every, type TimerHandle } from '../clock.js';
import type { FylrMessage, HelloMessage } from '../protocol/messages.js';
import type { ExecAddress } from './address.js';
import { type BackoffOptions, backoffDelayMs } from './backoff.js';
import { BrokerLink, type ConnectFn, type DialFailure, type DialPurpose, type LinkMessage } from './broker-link.js';

export type PoolMode = 'connecting' | 'broker' | 'polling' | 'down';
export type Transport = 'broker' | 'polling' | 'down';

export interface PoolTiming {
  reprobeIntervalMs: number;
  maxConnections: number;
  growthMinIntervalMs: number;
  pingIntervalMs: number;
  handshakeTimeoutMs: number;
  helloTimeoutMs: number;
  maxPayloadBytes: number;
  backoff: BackoffOptions;
  random: () => number;
}

export interface PoolEvents {
  linkUp(pool: AddressPool, link: BrokerLink): void;
  linkDown(pool: AddressPool, link: BrokerLink, reason: string): void;
  linkHello(pool: AddressPool, link: BrokerLink, previous: HelloMessage): void;
  message(pool: AddressPool, link: BrokerLink, message: LinkMessage): void;
  /** Mode, covered or the set of links changed. */
  changed(pool: AddressPool): void;
  dialed?(pool: AddressPool, purpose: DialPurpose, atMs: number): void;
  dialFailed?(pool: AddressPool, purpose: DialPurpose, failure: DialFailure): void;
  duplicate?(pool: AddressPool, link: BrokerLink): void;
  sent?(pool: AddressPool, link: BrokerLink, message: FylrMessage): void;
  pong?(pool: AddressPool, link: BrokerLink): void;
}

export class AddressPool {
  readonly addr: ExecAddress;
  readonly #clock: Clock;
  readonly #connect: ConnectFn;
  readonly #timing: PoolTiming;
  readonly #events: PoolEvents;
  #mode: PoolMode = 'connecting';
  /** Open links with a HELLO, oldest first. */
  readonly #links: BrokerLink[] = [];
  readonly #dialing = new Set<BrokerLink>();
  #seats = 1;
  #covered = false;
  #lastGrowthAt = Number.NEGATIVE_INFINITY;
  #reconnectAttempt = 0;
  #reconnectTimer: TimerHandle | undefined;
  #stopReprobe: (() => void) | undefined;
  #closed = false;
  #verdict: (() => void) | undefined;
  /** Jobs this fylr holds on the address through the polling transport (tokens and PUTs). */
  pollingHeld = 0;

  constructor(addr: ExecAddress, opts: { clock: Clock; connect: ConnectFn; timing: PoolTiming }, events: PoolEvents) {
    this.addr = addr;
    this.#clock = opts.clock;
    this.#connect = opts.connect;
    this.#timing = opts.timing;
    this.#events = events;
  }

  get mode(): PoolMode {
    return this.#mode;
  }

  get transport(): Transport {
    if (this.#mode === 'polling') return 'polling';
    return this.#mode === 'broker' && this.#links.length > 0 ? 'broker' : 'down';
  }

  get links(): readonly BrokerLink[] {
    return this.#links;
  }

  get covered(): boolean {
    return this.#covered;
  }

  get seats(): number {
    return this.#seats;
  }

  get dialing(): number {
    return this.#dialing.size;
  }

  /** Dials the first connection; resolves at its verdict (HELLO, 404, or a failure). */
  start(): Promise<void> {
    const verdict = new Promise<void>((resolve) => (this.#verdict = resolve));
    this.#lastGrowthAt = this.#clock.now();
    this.#stopReprobe = every(this.#clock, this.#timing.reprobeIntervalMs, () => this.#reprobe());
    this.#dial('initial');
    return verdict;
  }

  /**
   * Backpressure reported by the client: open one more connection if allowed now. True when a
   * dial started.
   */
  grow(): boolean {
    const now = this.#clock.now();
    if (this.#closed || this.#mode !== 'broker' || this.#links.length === 0) return false;
    if (this.#covered || this.#dialing.size > 0 || this.#reconnectTimer !== undefined) return false;
    if (this.#seats >= this.#timing.maxConnections) return false;
    if (now - this.#lastGrowthAt < this.#timing.growthMinIntervalMs) return false;
    this.#seats++;
    this.#lastGrowthAt = now;
    this.#dial('growth');
    return true;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopReprobe?.();
    this.#clock.clearTimeout(this.#reconnectTimer);
    this.#reconnectTimer = undefined;
    const all = [...this.#links, ...this.#dialing];
    for (const link of all) {
      link.retired = true;
      link.close(1001, 'fylr closing');
    }
    this.#verdict?.();
    await Promise.all(all.map((l) => l.whenClosed));
  }

  // ---------------------------------------------------------------- dialling

  #dial(purpose: DialPurpose): void {
    const at = this.#clock.now();
    const link = new BrokerLink(
      {
        url: this.addr.brokerUrl,
        address: this.addr.address,
        purpose,
        connect: this.#connect,
        clock: this.#clock,
        pingIntervalMs: this.#timing.pingIntervalMs,
        handshakeTimeoutMs: this.#timing.handshakeTimeoutMs,
        helloTimeoutMs: this.#timing.helloTimeoutMs,
        maxPayloadBytes: this.#timing.maxPayloadBytes,
      },
      {
        opened: (l) => this.#opened(l),
        failed: (l, f) => this.#failed(l, f),
        hello: (l, _h, previous) => this.#events.linkHello(this, l, previous),
        message: (l, m) => this.#events.message(this, l, m),
        closed: (l, reason) => this.#linkClosed(l, reason),
        sent: (l, m) => this.#events.sent?.(this, l, m),
        pong: (l) => this.#events.pong?.(this, l),
      },
    );
    this.#dialing.add(link);
    this.#events.dialed?.(this, purpose, at);
  }

  #opened(link: BrokerLink): void {
    this.#dialing.delete(link);
    if (this.#closed) {
      link.retired = true;
      link.close(1001, 'fylr closing');
      return;
    }
    const id = link.instanceId;
    if (this.#links.some((l) => l.instanceId === id)) {
      // Circled back to a known pod: close the duplicate (the execserver counts us once) and stop growing.
      link.retired = true;
      link.close(1000, 'duplicate instance');
      this.#seats = Math.max(this.#links.length, this.#seats - 1);
      this.#covered = true;
      this.#events.duplicate?.(this, link);
      this.#events.changed(this);
      this.#settleVerdict();
      return;
    }
    this.#links.push(link);
    this.#reconnectAttempt = 0;
    this.#mode = 'broker';
    link.up = true;
    this.#events.linkUp(this, link);
    this.#events.changed(this);
    this.#settleVerdict();
    this.#ensureSeats();
  }

  #failed(link: BrokerLink, failure: DialFailure): void {
    this.#dialing.delete(link);
    this.#events.dialFailed?.(this, link.purpose, failure);
    if (this.#closed) return;
    const before = this.#mode;
    if (link.purpose === 'growth') {
      // A growth dial that found no broker pod simply gives its seat back.
      this.#seats = Math.max(1, this.#seats - 1);
    } else if (failure.kind === 'no_broker') {
      if (this.#links.length > 0) {
        // An old pod behind the same balancer as broker pods: drop that seat, keep the others.
        this.#seats = Math.max(this.#links.length, this.#seats - 1);
      } else {
        this.#mode = 'polling';
        this.#seats = 1;
        this.#reconnectAttempt = 0;
      }
    } else {
      this.#reconnectAttempt++;
      if (this.#links.length === 0) this.#mode = 'down';
    }
    if (this.#mode !== before) this.#events.changed(this);
    this.#settleVerdict();
    this.#ensureSeats();
  }

  #linkClosed(link: BrokerLink, reason: string): void {
    const i = this.#links.indexOf(link);
    if (i >= 0) this.#links.splice(i, 1);
    if (link.up) {
      link.up = false;
      this.#events.linkDown(this, link, reason);
    }
    if (this.#closed || link.retired) return;
    if (this.#links.length === 0 && this.#mode === 'broker') this.#mode = 'down';
    this.#events.changed(this);
    this.#ensureSeats();
  }

  /** Redial missing seats, one at a time, with jittered backoff. */
  #ensureSeats(): void {
    if (this.#closed || this.#mode === 'polling' || this.#reconnectTimer !== undefined) return;
    if (this.#links.length + this.#dialing.size >= this.#seats) return;
    if (this.#dialing.size > 0) return; // the dial in flight decides first
    const delay = backoffDelayMs(this.#reconnectAttempt, this.#timing.backoff, this.#timing.random);
    this.#reconnectTimer = this.#clock.setTimeout(() => {
      this.#reconnectTimer = undefined;
      if (this.#closed || this.#mode === 'polling') return;
      if (this.#links.length + this.#dialing.size >= this.#seats) return;
      this.#dial('reconnect');
    }, delay);
  }

  #reprobe(): void {
    if (this.#closed) return;
    if (this.#mode === 'polling') {
      if (this.#dialing.size === 0) this.#dial('reprobe');
      return;
    }
    if (this.#covered) {
      this.#covered = false;
      this.#events.changed(this);
    }
  }

  #settleVerdict(): void {
    const v = this.#verdict;
    this.#verdict = undefined;
    v?.();
  }
}
