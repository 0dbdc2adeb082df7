/**
 * The slot broker of one execserver instance (native or gateway): the want-book, the offers, the
 * running jobs and the rules of PROTOCOL.md §1. It knows nothing of sockets (connections come in
 * as BrokerTransport) or of where slots come from (SlotSource).
 *
 * A want's life:   parked --next()--> offered --JOB--> running --DONE--> (gone)
 *                     ^                  | DECLINE / UNWANT / expiry / close: the want ends,
 *                     |                  v the slot goes straight to the next want (pump)
 *                  (WANT)             (gone)
 *
 * Invariant: every slot the source reserved is held by exactly one offer or one running job (or
 * a legacy token outside the broker); `pump(wg)` runs after every event that may free a slot or
 * add a want, so a free slot and a parked want of the same waitgroup never coexist for longer
 * than one synchronous step (rule 3) unless the server drains.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { type Clock, systemClock } from '../clock.js';
import type { ServeConfig } from '../config/types.js';
import type { ErrorCode } from '../errors.js';
import { type ConnectionId, type Want, WantBook } from '../book/want-book.js';
import { decodeFromFylr, encode, isProtocolError } from '../protocol/codec.js';
import { usesBody } from '../protocol/job.js';
import {
  assertNever,
  type ExecMessage,
  type HelloMessage,
  type JobMessage,
  PROTOCOL_VERSION,
  type PositionMessage,
  type WantMessage,
} from '../protocol/messages.js';
import { pipeStdin, pipeStdout } from '../slots/pipe-io.js';
import type { JobIo, Slot, SlotSource } from '../slots/slot-source.js';
import type { BrokerObserver } from './broker-observer.js';
import {
  BrokerConnection,
  type BrokerTransport,
  type ConnectionInfo,
  HELLO_MIN_INTERVAL_MS,
  type Offer,
} from './broker-connection.js';
import { RunStats } from './run-stats.js';

export interface BrokerOptions {
  config: ServeConfig;
  source: SlotSource;
  clock?: Clock;
  observer?: BrokerObserver;
}

/** A connection handle for the socket layer. */
export interface BrokerSession {
  readonly id: ConnectionId;
  receive(data: string | Buffer, isBinary: boolean): void;
  /** The peer answered a ping (or sent anything). */
  alive(): void;
  /** The socket closed, for whatever reason. Idempotent. */
  closed(reason?: string): void;
}

export interface WaitgroupStatus {
  processes: number;
  running: number;
  in_use: number;
  parked: number;
  offered: number;
  parked_by_priority: Record<string, number>;
}

export interface BrokerStatus {
  instance_id: string;
  name: string;
  kind: SlotSource['kind'];
  draining: boolean;
  waitgroups: Record<string, WaitgroupStatus>;
  connections: {
    id: string;
    remote_address: string | null;
    local_address: string | null;
    connected_ms: number;
    parked: number;
    offered: number;
    running: number;
    frames_in: number;
    frames_out: number;
  }[];
}

function newOfferToken(): string {
  // 128 random bits: an offer token is only checked against its own connection, but it must
  // not be guessable from another job's.
  return randomBytes(16).toString('base64url');
}

export class Broker {
  readonly instanceId = randomUUID();
  readonly book = new WantBook();
  readonly config: ServeConfig;
  readonly source: SlotSource;
  readonly clock: Clock;
  readonly stats = new RunStats();
  readonly #observer: BrokerObserver;
  readonly #connections = new Map<ConnectionId, BrokerConnection>();
  /** Parked wants per waitgroup and service, so spare service-bound slots find takers fast. */
  readonly #parkedByService = new Map<string, Map<string, number>>();
  /** When a slot of the waitgroup last became available without a taker (for the latency metric). */
  readonly #availableSince = new Map<string, number>();
  #nextConnection = 1;
  #pumping = new Set<string>();
  #repump = new Set<string>();
  #draining = false;
  #drainWaiters: (() => void)[] = [];

  constructor(opts: BrokerOptions) {
    this.config = opts.config;
    this.source = opts.source;
    this.clock = opts.clock ?? systemClock;
    this.#observer = opts.observer ?? {};
    this.source.onAvailable((wg) => {
      if (!this.#availableSince.has(wg)) this.#availableSince.set(wg, this.clock.now());
      this.pump(wg);
    });
  }

  get draining(): boolean {
    return this.#draining;
  }

  get connectionCount(): number {
    return this.#connections.size;
  }

  /** Are broker wants parked in this waitgroup? (the legacy API's 503 gate) */
  hasParked(waitgroup: string): boolean {
    return this.book.parked(waitgroup) > 0;
  }

  waitgroupOf(service: string): string | undefined {
    return this.config.services[service]?.waitgroup;
  }

  // ---------------------------------------------------------------- connections

  open(transport: BrokerTransport, info: ConnectionInfo = {}): BrokerSession {
    const conn = new BrokerConnection(`c${this.#nextConnection++}`, transport, info, this.clock.now());
    this.#connections.set(conn.id, conn);
    this.#observer.connectionsChanged?.(this.#connections.size);
    this.#sendHello(conn);
    this.#armPing(conn);
    this.helloChanged();
    return {
      id: conn.id,
      receive: (data, isBinary) => this.#receive(conn, data, isBinary),
      alive: () => {
        conn.lastSeenAt = this.clock.now();
      },
      closed: (reason) => this.#closeConnection(conn, reason ?? 'closed'),
    };
  }

  #armPing(conn: BrokerConnection): void {
    const interval = this.config.broker.ping_interval_ms;
    conn.pingTimer = this.clock.setTimeout(() => {
      if (conn.closed) return;
      if (this.clock.now() - conn.lastSeenAt >= 2 * interval) {
        // Half-open: the peer has not answered for two intervals.
        conn.transport.terminate();
        this.#closeConnection(conn, 'ping_timeout');
        return;
      }
      conn.transport.ping();
      this.#armPing(conn);
    }, interval);
  }

  #closeConnection(conn: BrokerConnection, reason: string): void {
    if (conn.closed) return;
    conn.closed = true;
    this.clock.clearTimeout(conn.pingTimer);
    this.clock.clearTimeout(conn.helloTimer);
    this.#connections.delete(conn.id);
    const touched = new Set<string>();
    for (const want of this.book.removeConnection(conn.id)) {
      this.#wantLeft(want);
      touched.add(want.waitgroup);
    }
    for (const offer of [...conn.offers.values()]) {
      this.#endOffer(conn, offer, 'withdrawn');
      touched.add(offer.slot.waitgroup);
    }
    // Nobody is left to receive their DONE (rule 6): stop them; their slots free when they end.
    for (const job of conn.running.values()) job.abort.abort(new Error('connection closed'));
    this.#observer.connectionsChanged?.(this.#connections.size);
    this.#observer.connectionClosed?.(reason);
    for (const wg of touched) {
      this.source.demandChanged(wg, this.#demandView());
      this.pump(wg);
    }
    this.helloChanged();
    this.#checkDrained();
  }

  // ---------------------------------------------------------------- frames

  #send(conn: BrokerConnection, message: ExecMessage): void {
    conn.send(encode(message));
  }

  #refuse(conn: BrokerConnection, code: ErrorCode, message: string, jobId?: string): void {
    this.#observer.refused?.(code);
    const frame: ExecMessage = { type: 'ERROR', code, message };
    if (jobId !== undefined) frame.job_id = jobId;
    this.#send(conn, frame);
    if (conn.refuse(this.clock.now())) {
      conn.transport.close(1008, 'too many refused frames');
      this.#closeConnection(conn, 'too_many_refusals');
    }
  }

  #receive(conn: BrokerConnection, data: string | Buffer, isBinary: boolean): void {
    if (conn.closed) return;
    conn.framesIn++;
    conn.lastSeenAt = this.clock.now();
    if (isBinary) return this.#refuse(conn, 'bad_frame', 'binary frames are refused; send UTF-8 JSON text');
    const msg = decodeFromFylr(typeof data === 'string' ? data : data.toString('utf8'));
    if (isProtocolError(msg)) return this.#refuse(conn, msg.code, msg.message, msg.jobId);
    switch (msg.type) {
      case 'WANT':
        return this.#want(conn, msg);
      case 'UNWANT':
        return this.#unwant(conn, msg.job_id);
      case 'JOB':
        return this.#job(conn, msg);
      case 'DECLINE': {
        const offer = conn.offers.get(msg.job_id);
        if (!offer || offer.token !== msg.token) return this.#refuse(conn, 'no_offer', 'no live offer with this token', msg.job_id);
        return this.#endOffer(conn, offer, 'declined');
      }
      case 'CANCEL': {
        const job = conn.running.get(msg.job_id);
        if (!job) return this.#refuse(conn, 'unknown_job', 'no running job with this job_id (withdraw a want with UNWANT)', msg.job_id);
        job.abort.abort(new Error('cancelled'));
        return;
      }
      case 'QUERY': {
        const pos = this.position(conn.id, msg.job_id);
        if (!pos) return this.#refuse(conn, 'unknown_job', 'no want, offer or running job with this job_id', msg.job_id);
        return this.#send(conn, pos);
      }
      default:
        return assertNever(msg);
    }
  }

  #knows(conn: BrokerConnection, jobId: string): boolean {
    return this.book.has(jobId, conn.id) || conn.offers.has(jobId) || conn.running.has(jobId);
  }

  #want(conn: BrokerConnection, msg: WantMessage): void {
    if (this.#draining) return this.#refuse(conn, 'draining', 'the server is draining', msg.job_id);
    const waitgroup = this.waitgroupOf(msg.service);
    if (waitgroup === undefined) return this.#refuse(conn, 'unknown_service', `unknown service ${JSON.stringify(msg.service)}`, msg.job_id);
    if (this.#knows(conn, msg.job_id)) return this.#refuse(conn, 'duplicate_job', 'job_id already parked, offered or running on this connection', msg.job_id);
    if (this.book.connectionWants(conn.id) + conn.offers.size >= this.config.broker.max_wants_per_connection) {
      return this.#refuse(conn, 'too_many_wants', `over max_wants_per_connection (${this.config.broker.max_wants_per_connection})`, msg.job_id);
    }
    const want: Want = { jobId: msg.job_id, connId: conn.id, service: msg.service, waitgroup, priority: msg.priority };
    this.book.park(want);
    const bySvc = this.#parkedByService.get(waitgroup) ?? new Map<string, number>();
    this.#parkedByService.set(waitgroup, bySvc);
    bySvc.set(want.service, (bySvc.get(want.service) ?? 0) + 1);
    this.#observer.wantParked?.(waitgroup, want.priority);
    this.source.demandChanged(waitgroup, this.#demandView());
    this.pump(waitgroup);
  }

  #unwant(conn: BrokerConnection, jobId: string): void {
    const want = this.book.remove(jobId, conn.id);
    if (want) {
      this.#wantLeft(want);
      this.source.demandChanged(want.waitgroup, this.#demandView());
      return;
    }
    const offer = conn.offers.get(jobId);
    if (offer) return this.#endOffer(conn, offer, 'withdrawn');
    this.#refuse(conn, 'unknown_job', 'no parked want or offer with this job_id', jobId);
  }

  /** Bookkeeping for a want that left the book other than by being offered. */
  #wantLeft(want: Want): void {
    this.#countTaken(want);
    this.#observer.wantLeft?.(want.waitgroup, want.priority);
  }

  #countTaken(want: Want): void {
    const bySvc = this.#parkedByService.get(want.waitgroup);
    const n = (bySvc?.get(want.service) ?? 0) - 1;
    if (n > 0) bySvc!.set(want.service, n);
    else bySvc?.delete(want.service);
  }

  #job(conn: BrokerConnection, msg: JobMessage): void {
    const offer = conn.offers.get(msg.job_id);
    if (!offer || offer.token !== msg.token) return this.#refuse(conn, 'no_offer', 'no live offer with this token', msg.job_id);
    if (msg.job.service !== offer.want.service) {
      return this.#refuse(conn, 'invalid_field', `job.service must be the WANT's service ${JSON.stringify(offer.want.service)}`, msg.job_id);
    }
    this.clock.clearTimeout(offer.timer);
    conn.offers.delete(msg.job_id);
    const now = this.clock.now();
    this.#observer.jobStarted?.(offer.slot.waitgroup, now - offer.offeredAt);
    const abort = new AbortController();
    conn.running.set(msg.job_id, { jobId: msg.job_id, service: msg.job.service, slot: offer.slot, abort, startedAt: now });
    const io: JobIo = { signal: abort.signal };
    const body = usesBody(msg.job);
    if (body.stdin && msg.job.pipes?.in) io.stdin = pipeStdin(msg.job.pipes.in, abort.signal);
    if (body.stdout && msg.job.pipes?.out) io.stdout = pipeStdout(msg.job.pipes.out, abort.signal);
    void this.source.run(offer.slot, msg.job, io).then((receipt) => {
      conn.running.delete(msg.job_id);
      this.stats.record(msg.job.service, receipt.duration_ms);
      this.#observer.jobDone?.(offer.slot.waitgroup, msg.job.service, receipt.ok, receipt.duration_ms);
      this.#send(conn, { type: 'DONE', job_id: msg.job_id, receipt });
      this.#checkDrained();
    });
  }

  /** An offer ends without a JOB: the want ends and the slot goes to the next want at once. */
  #endOffer(conn: BrokerConnection, offer: Offer, why: 'declined' | 'expired' | 'withdrawn'): void {
    this.clock.clearTimeout(offer.timer);
    conn.offers.delete(offer.want.jobId);
    const wg = offer.slot.waitgroup;
    if (why === 'declined') this.#observer.offerDeclined?.(wg);
    else if (why === 'expired') this.#observer.offerExpired?.(wg);
    else this.#observer.offerWithdrawn?.(wg);
    this.source.release(offer.slot);
    this.pump(wg);
    this.#checkDrained();
  }

  // ---------------------------------------------------------------- granting

  #demandView() {
    return {
      peek: (wg: string) => this.book.peek(wg),
      parked: (wg: string) => this.book.parked(wg),
    };
  }

  /**
   * Offers free slots of the waitgroup to parked wants until one of them runs out. Re-entrant
   * calls (a release inside the loop) are folded into one more pass.
   */
  pump(waitgroup: string): void {
    if (this.#draining) return;
    if (this.#pumping.has(waitgroup)) {
      this.#repump.add(waitgroup);
      return;
    }
    this.#pumping.add(waitgroup);
    try {
      do {
        this.#repump.delete(waitgroup);
        while (this.#grantOne(waitgroup));
      } while (this.#repump.has(waitgroup));
    } finally {
      this.#pumping.delete(waitgroup);
    }
  }

  #grantOne(waitgroup: string): boolean {
    const head = this.book.peek(waitgroup);
    if (!head) return false;
    const slot = this.source.tryReserve(waitgroup, head.service);
    if (slot) {
      const want = slot.service === null ? this.book.next(waitgroup) : this.book.next(waitgroup, slot.service);
      if (!want) {
        this.source.release(slot);
        return false;
      }
      this.#offer(want, slot);
      return true;
    }
    // The head's service has no slot, but the source may hold slots bound to another service
    // (gateway tokens): hand them to the best want of that service rather than let them lapse.
    const bySvc = this.#parkedByService.get(waitgroup);
    for (const service of this.source.spareServices(waitgroup)) {
      if (!bySvc?.get(service)) continue;
      const spare = this.source.tryReserve(waitgroup, service);
      if (!spare) continue;
      const want = this.book.next(waitgroup, service);
      if (!want) {
        this.source.release(spare);
        continue;
      }
      this.#offer(want, spare);
      return true;
    }
    return false;
  }

  #offer(want: Want, slot: Slot): void {
    this.#countTaken(want);
    const conn = this.#connections.get(want.connId);
    if (!conn) {
      // Cannot happen: a closing connection's wants leave the book first. Be safe anyway.
      this.source.release(slot);
      return;
    }
    const now = this.clock.now();
    const since = this.#availableSince.get(want.waitgroup);
    this.#availableSince.delete(want.waitgroup);
    this.#observer.offerMade?.(want.waitgroup, since === undefined ? null : now - since);
    const offer: Offer = { want, slot, token: newOfferToken(), offeredAt: now, timer: undefined };
    conn.offers.set(want.jobId, offer);
    const timeout = this.config.broker.offer_timeout_ms;
    offer.timer = this.clock.setTimeout(() => {
      if (conn.offers.get(want.jobId) !== offer) return;
      this.#send(conn, { type: 'ERROR', code: 'offer_expired', message: `offer not answered within ${timeout} ms; the want ended`, job_id: want.jobId });
      this.#endOffer(conn, offer, 'expired');
    }, timeout);
    this.#send(conn, { type: 'OFFER', job_id: want.jobId, token: offer.token, expires_ms: timeout });
  }

  // ---------------------------------------------------------------- HELLO

  hello(): HelloMessage {
    const services: Record<string, string> = {};
    for (const [svc, def] of Object.entries(this.config.services)) services[svc] = def.waitgroup;
    const waitgroups: HelloMessage['waitgroups'] = {};
    for (const wg of Object.keys(this.config.waitgroups)) {
      waitgroups[wg] = { processes: this.source.processes(wg), running: this.source.running(wg), parked: this.book.parked(wg) };
    }
    return {
      type: 'HELLO',
      protocol: PROTOCOL_VERSION,
      instance_id: this.instanceId,
      name: this.config.name,
      services,
      waitgroups,
      clients: this.#connections.size,
      draining: this.#draining,
    };
  }

  /** What makes a HELLO worth re-sending: services, processes, clients, draining. */
  static #signature(h: HelloMessage): string {
    const processes = Object.entries(h.waitgroups).map(([wg, s]) => `${wg}=${s.processes}`);
    return JSON.stringify([h.services, processes, h.clients, h.draining]);
  }

  #sendHello(conn: BrokerConnection): void {
    const h = this.hello();
    conn.lastHelloSignature = Broker.#signature(h);
    conn.lastHelloAt = this.clock.now();
    this.#send(conn, h);
  }

  /** Re-sends HELLO to every connection whose view is stale, at most every 100 ms each. */
  helloChanged(): void {
    const signature = Broker.#signature(this.hello());
    for (const conn of this.#connections.values()) {
      if (conn.lastHelloSignature === signature || conn.helloTimer !== undefined) continue;
      const wait = conn.lastHelloAt + HELLO_MIN_INTERVAL_MS - this.clock.now();
      if (wait <= 0) {
        this.#sendHello(conn);
        continue;
      }
      conn.helloTimer = this.clock.setTimeout(() => {
        conn.helloTimer = undefined;
        if (conn.closed) return;
        if (conn.lastHelloSignature !== Broker.#signature(this.hello())) this.#sendHello(conn);
      }, wait);
    }
  }

  // ---------------------------------------------------------------- queries

  position(connId: ConnectionId, jobId: string): PositionMessage | undefined {
    const conn = this.#connections.get(connId);
    if (!conn) return undefined;
    let waitgroup: string;
    let service: string;
    let ahead = 0;
    const want = this.book.get(jobId, connId);
    if (want) {
      waitgroup = want.waitgroup;
      service = want.service;
      ahead = this.book.position(jobId, connId)?.ahead ?? 0;
    } else {
      const offer = conn.offers.get(jobId);
      const running = conn.running.get(jobId);
      const slot = offer?.slot ?? running?.slot;
      if (!slot) return undefined;
      waitgroup = slot.waitgroup;
      service = offer?.want.service ?? running!.service;
    }
    const capacity = this.source.processes(waitgroup);
    return {
      type: 'POSITION',
      job_id: jobId,
      running: this.source.running(waitgroup),
      ahead,
      capacity,
      parked: this.book.parked(waitgroup),
      eta_ms: want ? this.stats.etaMs(service, ahead, capacity) : this.stats.meanMs(service),
    };
  }

  /** `GET /queue/{job_id}`: the first connection that knows the job. */
  positionAnywhere(jobId: string): PositionMessage | undefined {
    for (const conn of this.#connections.values()) {
      const p = this.position(conn.id, jobId);
      if (p) return p;
    }
    return undefined;
  }

  status(): BrokerStatus {
    const offeredBy = new Map<string, number>();
    for (const c of this.#connections.values()) {
      for (const o of c.offers.values()) offeredBy.set(o.slot.waitgroup, (offeredBy.get(o.slot.waitgroup) ?? 0) + 1);
    }
    const waitgroups: Record<string, WaitgroupStatus> = {};
    for (const wg of Object.keys(this.config.waitgroups)) {
      waitgroups[wg] = {
        processes: this.source.processes(wg),
        running: this.source.running(wg),
        in_use: this.source.inUse(wg),
        parked: this.book.parked(wg),
        offered: offeredBy.get(wg) ?? 0,
        parked_by_priority: Object.fromEntries([...this.book.parkedByPriority(wg)].map(([p, n]) => [String(p), n])),
      };
    }
    const now = this.clock.now();
    return {
      instance_id: this.instanceId,
      name: this.config.name,
      kind: this.source.kind,
      draining: this.#draining,
      waitgroups,
      connections: [...this.#connections.values()].map((c) => ({
        id: c.id,
        remote_address: c.info.remoteAddress ?? null,
        local_address: c.info.localAddress ?? null,
        connected_ms: Math.round(now - c.connectedAt),
        parked: this.book.connectionWants(c.id),
        offered: c.offers.size,
        running: c.running.size,
        frames_in: c.framesIn,
        frames_out: c.framesOut,
      })),
    };
  }

  // ---------------------------------------------------------------- draining

  #busy(): boolean {
    for (const c of this.#connections.values()) if (c.offers.size > 0 || c.running.size > 0) return true;
    return false;
  }

  #checkDrained(): void {
    if (!this.#draining || this.#busy()) return;
    const waiters = this.#drainWaiters;
    this.#drainWaiters = [];
    for (const w of waiters) w();
  }

  /**
   * Rule 7: no new offers, new WANTs refused, HELLO says draining; resolves once every outstanding
   * offer ended and every running job sent its DONE.
   */
  drain(): Promise<void> {
    if (!this.#draining) {
      this.#draining = true;
      this.helloChanged();
    }
    return new Promise((resolve) => {
      this.#drainWaiters.push(resolve);
      this.#checkDrained();
    });
  }

  /** Closes every connection (1001 going away). */
  closeAll(): void {
    for (const conn of [...this.#connections.values()]) {
      conn.transport.close(1001, 'server shutting down');
      this.#closeConnection(conn, 'shutdown');
    }
  }
}
