/**
 * The fylr side of the slot broker: gets slots for jobs from every configured execserver
 * address, over `/broker` where the address speaks it and over the legacy token API where it
 * does not (PROTOCOL.md §1, §5; seed: "Replicas behind one address", "Heterogeneous fleets",
 * "Failure matrix").
 *
 * One acquire:
 *
 *   WANT on every open link whose HELLO announces the service (not draining)   ┐ first to answer
 *   GET /token once per retry tick on every polling address that may serve it ┘ wins
 *      first OFFER ──► lease (JOB at run()); UNWANT on every other link where the want is parked
 *      later OFFER for the job, or any OFFER after our UNWANT ──► DECLINE at once
 *      a surplus token ──► given back at once (an empty job)
 *      timeout (connectTimeoutSec) / abort ──► UNWANT everywhere, { kind: 'requeue' }
 *
 * Links that come up while a want waits (a growth connection, a reconnect, a polling address
 * that switched to the broker, a HELLO that now announces the service) get the WANT at once:
 * that is how parked wants are re-registered after an execserver restart. Backpressure (a want
 * still waiting after a full retry tick) lets an address pool open one more connection.
 */
import type { Dispatcher } from 'undici';
import { type Clock, every, systemClock, type TimerHandle } from '../clock.js';
import type { ExecserverClientConfig } from '../config/types.js';
import { SlotgateError } from '../errors.js';
import type { ExecMessage, FylrMessage } from '../protocol/messages.js';
import { addressServes, parseExecAddress } from './address.js';
import { AddressPool, type PoolEvents, type Transport } from './address-pool.js';
import { instanceShare, type InstanceView, pollingShare } from './admission.js';
import { type BackoffOptions, DEFAULT_BACKOFF } from './backoff.js';
import { BrokerLease } from './broker-lease.js';
import { type BrokerLink, type ConnectFn, defaultConnect, type DialFailure, type DialPurpose, type LinkMessage } from './broker-link.js';
import type { AcquireRequest, AcquireResult, RequeueReason } from './lease.js';
import type { PipeServer } from './pipe-server.js';
import { giveBackToken, PollingLease, pollingAgent, requestToken, type TokenOutcome } from './polling-transport.js';

export type { AcquireRequest, AcquireResult, RequeueReason, RunIo, SlotLease } from './lease.js';
export type { Transport } from './address-pool.js';

/** The retry tick of the old client: polling rounds, and the unit of "backpressure". */
export const RETRY_TICK_MS = 1000;
/** At most one new connection per address this often. */
export const GROWTH_MIN_INTERVAL_MS = 2000;
export const DEFAULT_PING_INTERVAL_MS = 10_000;
export const HANDSHAKE_TIMEOUT_MS = 10_000;
export const HELLO_TIMEOUT_MS = 10_000;
/** The execserver closes a connection over 100 refused frames in 10 s: spend at most half on redundant DECLINEs. */
export const REDUNDANT_DECLINE_BUDGET = 50;
export const REDUNDANT_DECLINE_WINDOW_MS = 10_000;
const UNWANT_MEMORY = 10_000;

/** Hooks for tests, metrics and logs. Never waited for. */
export interface ExecClientObserver {
  dialed?(address: string, purpose: DialPurpose, atMs: number): void;
  dialFailed?(address: string, purpose: DialPurpose, failure: DialFailure): void;
  connected?(address: string, instanceId: string, localAddress: string | undefined): void;
  duplicate?(address: string, instanceId: string): void;
  disconnected?(address: string, instanceId: string, reason: string): void;
  transportChanged?(address: string, transport: Transport): void;
  frameOut?(address: string, instanceId: string, message: FylrMessage): void;
  frameIn?(address: string, instanceId: string, message: ExecMessage): void;
  pong?(address: string, instanceId: string): void;
  tokenAnswer?(address: string, outcome: TokenOutcome['kind']): void;
}

export interface ExecClientOptions {
  clock?: Clock;
  /** Needed for body-mode jobs over the broker. */
  pipes?: PipeServer;
  name?: string;
  /** Ping every this often; a server silent for 2 intervals is dropped. Default 10 000. */
  pingIntervalMs?: number;
  connect?: ConnectFn;
  observer?: ExecClientObserver;
  backoff?: BackoffOptions;
  /** Jitter source, [0, 1). */
  random?: () => number;
  handshakeTimeoutMs?: number;
  helloTimeoutMs?: number;
  retryTickMs?: number;
  growthMinIntervalMs?: number;
  maxPayloadBytes?: number;
  /** undici dispatcher of the polling transport. */
  dispatcher?: Dispatcher;
}

export interface AddressStatus {
  url: string;
  transport: Transport;
  connections: number;
  instances: string[];
  covered: boolean;
  seats: number;
  dialing: number;
}

export interface ExecClientStatus {
  addresses: AddressStatus[];
  admission: number;
  waiting: number;
  leases: number;
}

interface Acquisition {
  readonly jobId: string;
  readonly service: string;
  readonly priority: number;
  readonly startedAt: number;
  state: 'waiting' | 'over';
  /** Links where the WANT is parked, with when it was sent. */
  readonly parked: Map<BrokerLink, number>;
  readonly pollInFlight: Set<AddressPool>;
  /** Polling addresses that answered 404 for the service. */
  readonly pollSkip: Set<AddressPool>;
  timer: TimerHandle | undefined;
  cleanup: () => void;
  resolve: (r: AcquireResult) => void;
}

type Lease = BrokerLease | PollingLease;

export class ExecClient {
  readonly name: string;
  readonly config: ExecserverClientConfig;
  readonly #clock: Clock;
  readonly #pipes: PipeServer | undefined;
  readonly #observer: ExecClientObserver;
  readonly #dispatcher: Dispatcher;
  readonly #retryTickMs: number;
  readonly #pools: AddressPool[];
  readonly #waiting = new Map<string, Acquisition>();
  readonly #leases = new Map<string, Lease>();
  /** Per link: job ids we sent UNWANT for, whose crossing OFFER would make a DECLINE redundant. */
  readonly #unwanted = new WeakMap<BrokerLink, Map<string, number>>();
  readonly #redundant = new WeakMap<BrokerLink, number[]>();
  readonly #listeners = new Set<() => void>();
  readonly #lastTransport = new Map<AddressPool, Transport>();
  #stopTick: (() => void) | undefined;
  #started: Promise<void> | undefined;
  #closed = false;

  constructor(config: ExecserverClientConfig, opts: ExecClientOptions = {}) {
    this.config = config;
    this.name = opts.name ?? 'fylr';
    this.#clock = opts.clock ?? systemClock;
    this.#pipes = opts.pipes;
    this.#observer = opts.observer ?? {};
    this.#dispatcher = opts.dispatcher ?? pollingAgent;
    this.#retryTickMs = opts.retryTickMs ?? RETRY_TICK_MS;
    const timing = {
      reprobeIntervalMs: config.reprobe_interval_ms,
      maxConnections: config.max_connections_per_address,
      growthMinIntervalMs: opts.growthMinIntervalMs ?? GROWTH_MIN_INTERVAL_MS,
      pingIntervalMs: opts.pingIntervalMs ?? DEFAULT_PING_INTERVAL_MS,
      handshakeTimeoutMs: opts.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS,
      helloTimeoutMs: opts.helloTimeoutMs ?? HELLO_TIMEOUT_MS,
      maxPayloadBytes: opts.maxPayloadBytes ?? 4 * 1024 * 1024,
      backoff: opts.backoff ?? DEFAULT_BACKOFF,
      random: opts.random ?? Math.random,
    };
    const events = this.#poolEvents();
    this.#pools = config.addresses.map(
      (a) => new AddressPool(parseExecAddress(a), { clock: this.#clock, connect: opts.connect ?? defaultConnect, timing }, events),
    );
  }

  /** Dials every address; resolves once each has a broker connection with HELLO, a polling verdict, or failed once. */
  start(): Promise<void> {
    this.#started ??= Promise.all(this.#pools.map((p) => p.start())).then(() => undefined);
    return this.#started;
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopTick?.();
    this.#stopTick = undefined;
    for (const a of [...this.#waiting.values()]) this.#end(a, 'closed');
    await Promise.all(this.#pools.map((p) => p.close()));
    for (const lease of [...this.#leases.values()]) if (lease instanceof PollingLease) lease.cancel();
    this.#notify();
  }

  onChange(listener: () => void): void {
    this.#listeners.add(listener);
  }

  offChange(listener: () => void): void {
    this.#listeners.delete(listener);
  }

  // ---------------------------------------------------------------- acquire

  acquire(req: AcquireRequest, signal?: AbortSignal): Promise<AcquireResult> {
    if (this.#closed) return Promise.resolve({ kind: 'requeue', reason: 'closed' });
    if (this.#waiting.has(req.jobId) || this.#leases.has(req.jobId)) {
      return Promise.reject(new SlotgateError('duplicate_job', `job ${JSON.stringify(req.jobId)} already waits for or holds a slot`));
    }
    if (signal?.aborted) return Promise.resolve({ kind: 'requeue', reason: 'aborted' });
    return new Promise<AcquireResult>((resolve) => {
      const a: Acquisition = {
        jobId: req.jobId,
        service: req.service,
        priority: req.priority,
        startedAt: this.#clock.now(),
        state: 'waiting',
        parked: new Map(),
        pollInFlight: new Set(),
        pollSkip: new Set(),
        timer: undefined,
        cleanup: () => undefined,
        resolve,
      };
      this.#waiting.set(a.jobId, a);
      const timeoutMs = (req.timeoutSec ?? this.config.connectTimeoutSec) * 1000;
      a.timer = this.#clock.setTimeout(() => this.#end(a, 'timeout'), timeoutMs);
      if (signal) {
        const onAbort = (): void => this.#end(a, 'aborted');
        signal.addEventListener('abort', onAbort, { once: true });
        a.cleanup = () => signal.removeEventListener('abort', onAbort);
      }
      for (const pool of this.#pools) {
        if (!addressServes(pool.addr, a.service)) continue;
        if (pool.mode === 'polling') this.#poll(a, pool);
        else for (const link of pool.links) if (a.state === 'waiting') this.#park(pool, link, a);
      }
      if (a.state === 'waiting') this.#ensureTicker();
    });
  }

  #park(pool: AddressPool, link: BrokerLink, a: Acquisition): void {
    if (a.state !== 'waiting' || a.parked.has(link) || !addressServes(pool.addr, a.service) || !link.serves(a.service)) return;
    this.#unwanted.get(link)?.delete(a.jobId);
    if (link.send({ type: 'WANT', job_id: a.jobId, service: a.service, priority: a.priority })) a.parked.set(link, this.#clock.now());
  }

  #win(a: Acquisition, lease: Lease): void {
    const winner = lease instanceof BrokerLease ? lease.link : undefined;
    this.#settle(a);
    for (const link of a.parked.keys()) if (link !== winner) this.#unwant(link, a.jobId);
    a.parked.clear();
    this.#leases.set(a.jobId, lease);
    a.resolve({ kind: 'slot', lease });
    if (lease instanceof PollingLease) this.#notify();
  }

  #end(a: Acquisition, reason: RequeueReason): void {
    if (a.state !== 'waiting') return;
    this.#settle(a);
    for (const link of a.parked.keys()) this.#unwant(link, a.jobId);
    a.parked.clear();
    a.resolve({ kind: 'requeue', reason });
  }

  #settle(a: Acquisition): void {
    a.state = 'over';
    this.#clock.clearTimeout(a.timer);
    a.cleanup();
    this.#waiting.delete(a.jobId);
    if (this.#waiting.size === 0) {
      this.#stopTick?.();
      this.#stopTick = undefined;
    }
  }

  #unwant(link: BrokerLink, jobId: string): void {
    if (!link.send({ type: 'UNWANT', job_id: jobId })) return;
    let m = this.#unwanted.get(link);
    if (m === undefined) this.#unwanted.set(link, (m = new Map()));
    m.set(jobId, this.#clock.now());
    // Oldest first (insertion order): forget the oldest beyond the memory limit.
    for (const k of m.keys()) {
      if (m.size <= UNWANT_MEMORY) break;
      m.delete(k);
    }
  }

  /** DECLINE an OFFER nobody takes. After our UNWANT the server already withdrew it (and answers no_offer): rate-limited. */
  #decline(link: BrokerLink, jobId: string, token: string): void {
    const m = this.#unwanted.get(link);
    if (m?.has(jobId)) {
      m.delete(jobId);
      const now = this.#clock.now();
      let times = this.#redundant.get(link);
      if (times === undefined) this.#redundant.set(link, (times = []));
      while (times.length > 0 && (times[0] as number) <= now - REDUNDANT_DECLINE_WINDOW_MS) times.shift();
      if (times.length >= REDUNDANT_DECLINE_BUDGET) return;
      times.push(now);
    }
    link.send({ type: 'DECLINE', job_id: jobId, token });
  }

  #leaseFinished(lease: Lease): void {
    if (this.#leases.get(lease.jobId) === lease) this.#leases.delete(lease.jobId);
    if (lease instanceof PollingLease) {
      const pool = this.#pools.find((p) => p.addr.address === lease.address);
      if (pool) pool.pollingHeld = Math.max(0, pool.pollingHeld - 1);
      this.#notify();
    }
  }

  // ---------------------------------------------------------------- polling

  #poll(a: Acquisition, pool: AddressPool): void {
    if (a.state !== 'waiting' || this.#closed || pool.mode !== 'polling') return;
    if (a.pollInFlight.has(pool) || a.pollSkip.has(pool)) return;
    a.pollInFlight.add(pool);
    void requestToken(pool.addr.base, a.service, this.#dispatcher).then((outcome) => {
      a.pollInFlight.delete(pool);
      this.#observer.tokenAnswer?.(pool.addr.address, outcome.kind);
      if (outcome.kind === 'token') {
        if (a.state === 'waiting' && !this.#closed) {
          pool.pollingHeld++;
          const lease = new PollingLease(pool.addr.address, a.jobId, a.service, outcome, {
            clock: this.#clock,
            dispatcher: this.#dispatcher,
            finished: (l) => this.#leaseFinished(l),
          });
          this.#win(a, lease);
        } else {
          giveBackToken(outcome.target, a.service, outcome.token, this.#dispatcher);
        }
      } else if (outcome.kind === 'unknown_service') {
        a.pollSkip.add(pool);
      }
    });
  }

  #ensureTicker(): void {
    if (this.#stopTick !== undefined || this.#closed) return;
    this.#stopTick = every(this.#clock, this.#retryTickMs, () => this.#tick());
  }

  /** Once per retry tick while wants wait: polling rounds, and backpressure for the pools. */
  #tick(): void {
    const now = this.#clock.now();
    const waiting = [...this.#waiting.values()];
    for (const pool of this.#pools) {
      if (pool.mode === 'polling') {
        for (const a of waiting) if (addressServes(pool.addr, a.service)) this.#poll(a, pool);
        continue;
      }
      // Backpressure: a job eligible here has waited through a full tick without a slot.
      if (waiting.some((a) => a.state === 'waiting' && addressServes(pool.addr, a.service) && now - a.startedAt >= this.#retryTickMs)) pool.grow();
    }
  }

  // ---------------------------------------------------------------- pool events

  #poolEvents(): PoolEvents {
    const id = (link: BrokerLink): string => link.instanceId ?? '';
    return {
      linkUp: (pool, link) => {
        this.#observer.connected?.(pool.addr.address, id(link), link.localAddress);
        for (const a of [...this.#waiting.values()]) this.#park(pool, link, a);
        this.#notify();
      },
      linkDown: (pool, link, reason) => {
        this.#observer.disconnected?.(pool.addr.address, id(link), reason);
        for (const a of this.#waiting.values()) a.parked.delete(link);
        for (const lease of [...this.#leases.values()]) if (lease instanceof BrokerLease && lease.link === link) lease.linkLost(reason);
        this.#notify();
      },
      linkHello: (pool, link) => {
        this.#observer.frameIn?.(pool.addr.address, id(link), link.hello);
        for (const a of [...this.#waiting.values()]) this.#park(pool, link, a);
        this.#notify();
      },
      message: (pool, link, msg) => {
        this.#observer.frameIn?.(pool.addr.address, id(link), msg);
        this.#message(link, msg);
      },
      changed: (pool) => {
        const t = pool.transport;
        if (this.#lastTransport.get(pool) !== t) {
          this.#lastTransport.set(pool, t);
          this.#observer.transportChanged?.(pool.addr.address, t);
          if (t === 'polling') for (const a of [...this.#waiting.values()]) if (addressServes(pool.addr, a.service)) this.#poll(a, pool);
        }
        this.#notify();
      },
      dialed: (pool, purpose, at) => this.#observer.dialed?.(pool.addr.address, purpose, at),
      dialFailed: (pool, purpose, failure) => this.#observer.dialFailed?.(pool.addr.address, purpose, failure),
      duplicate: (pool, link) => this.#observer.duplicate?.(pool.addr.address, id(link)),
      sent: (pool, link, msg) => this.#observer.frameOut?.(pool.addr.address, id(link), msg),
      pong: (pool, link) => this.#observer.pong?.(pool.addr.address, id(link)),
    };
  }

  #message(link: BrokerLink, msg: LinkMessage): void {
    switch (msg.type) {
      case 'OFFER': {
        const a = this.#waiting.get(msg.job_id);
        if (a !== undefined && a.state === 'waiting') {
          const lease = new BrokerLease(link, msg, a.service, {
            clock: this.#clock,
            pipes: this.#pipes,
            ownUrl: this.config.callbackBackendOwnURL,
            finished: (l) => this.#leaseFinished(l),
          });
          this.#win(a, lease);
          return;
        }
        // A later OFFER for a job that already has a slot, or one that crossed our UNWANT.
        this.#decline(link, msg.job_id, msg.token);
        return;
      }
      case 'DONE': {
        const lease = this.#leases.get(msg.job_id);
        if (lease instanceof BrokerLease && lease.link === link) lease.done(msg.receipt);
        return;
      }
      case 'ERROR': {
        const jobId = msg.job_id;
        if (jobId === undefined) return;
        const lease = this.#leases.get(jobId);
        if (lease instanceof BrokerLease && lease.link === link) lease.refused(msg.code, msg.message);
        const a = this.#waiting.get(jobId);
        // The WANT was refused there (draining, unknown_service, too_many_wants, ...): it is not parked.
        if (a !== undefined && msg.code !== 'duplicate_job') a.parked.delete(link);
        return;
      }
      case 'POSITION':
        return;
      default: {
        const never: never = msg;
        return never;
      }
    }
  }

  #notify(): void {
    for (const l of [...this.#listeners]) {
      try {
        l();
      } catch {
        /* a listener's bug must not break the client */
      }
    }
  }

  // ---------------------------------------------------------------- admission and status

  /** The claim share: see admission.ts. 0 when nothing is connected. */
  admission(): number {
    const instances = new Map<string, { view: InstanceView; all: boolean; services: Set<string> }>();
    let total = 0;
    for (const pool of this.#pools) {
      if (pool.mode === 'polling') {
        total += pollingShare(pool.pollingHeld);
        continue;
      }
      for (const link of pool.links) {
        if (!link.isOpen) continue;
        const hello = link.hello;
        const only = pool.addr.onlyService;
        let entry = instances.get(hello.instance_id);
        if (entry === undefined) {
          entry = { view: { hello, services: null }, all: only === null, services: new Set() };
          instances.set(hello.instance_id, entry);
        }
        if (only === null) entry.all = true;
        else entry.services.add(only);
      }
    }
    for (const e of instances.values()) total += instanceShare({ hello: e.view.hello, services: e.all ? null : e.services });
    return total;
  }

  /** Is any execserver usable: a non-draining broker instance, or a polling address? */
  hasExecserver(): boolean {
    return this.#pools.some((p) => p.transport === 'polling' || (p.transport === 'broker' && p.links.some((l) => l.isOpen && !l.hello.draining)));
  }

  status(): ExecClientStatus {
    return {
      addresses: this.#pools.map((p) => ({
        url: p.addr.address,
        transport: p.transport,
        connections: p.links.length,
        instances: p.links.map((l) => l.instanceId ?? ''),
        covered: p.covered,
        seats: p.seats,
        dialing: p.dialing,
      })),
      admission: this.admission(),
      waiting: this.#waiting.size,
      leases: this.#leases.size,
    };
  }
}

export { BrokerLease } from './broker-lease.js';
export { PollingLease } from './polling-transport.js';
