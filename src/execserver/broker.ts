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
 *
 * Time comes from the injected Clock only (offer expiry, pings, HELLO throttling), so the unit
 * tests drive all of it with a ManualClock.
 */
import { randomUUID } from 'node:crypto';
import { newOfferToken } from './offer-token.js';
import { type Clock, systemClock } from '../clock.js';
import type { ServeConfig } from '../config/types.js';
import type { ErrorCode } from '../errors.js';
import { type ConnectionId, type Want, WantBook } from '../book/want-book.js';
import { decodeFromFylr, encode, isProtocolError } from '../protocol/codec.js';
import { failedReceipt, type Receipt, usesBody } from '../protocol/job.js';
import {
  assertNever,
  type ExecMessage,
  type HelloMessage,
  type JobMessage,
  type PositionMessage,
  type WantMessage,
} from '../protocol/messages.js';
import { pipeStdin, pipeStdout } from '../slots/pipe-io.js';
import type { DemandView, JobIo, Slot, SlotSource } from '../slots/slot-source.js';
import type { BrokerObserver } from './broker-observer.js';
import {
  BrokerConnection,
  type BrokerTransport,
  type ConnectionInfo,
  HELLO_MIN_INTERVAL_MS,
  type Offer,
  PING_MISSES_ALLOWED,
  type RunningJob,
} from './broker-connection.js';
import { type BrokerReportView, type BrokerStatus, positionOf, type RunningByPriority, runningByPriorityOf, statusOf } from './broker-reports.js';
import { buildHello, helloSignature } from './hello.js';
import { RunStats } from './run-stats.js';

export type { BrokerStatus, RunningByPriority, WaitgroupStatus } from './broker-reports.js';

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

export { newOfferToken } from './offer-token.js';

const NO_DEMAND: DemandView = { peek: () => undefined, parked: () => 0 };

export class Broker {
  readonly instanceId = randomUUID();
  readonly book = new WantBook();
  readonly config: ServeConfig;
  readonly source: SlotSource;
  readonly clock: Clock;
  readonly stats = new RunStats();
  readonly #observer: BrokerObserver;
  readonly #connections = new Map<ConnectionId, BrokerConnection>();
  /** Every job started through the broker and not ended, including those of closed connections. */
  readonly #jobs = new Set<RunningJob>();
  /** Parked wants per waitgroup and service, so spare service-bound slots find takers fast. */
  readonly #parkedByService = new Map<string, Map<string, number>>();
  /**
   * When slots of the waitgroup became available while wants were parked, oldest first: the
   * start of the slot-free-to-OFFER latency, consumed by the offers that follow.
   */
  readonly #freedAt = new Map<string, number[]>();
  #nextConnection = 1;
  #pumping = new Set<string>();
  #repump = new Set<string>();
  #draining = false;
  #drained: Promise<void> | undefined;
  #resolveDrained: (() => void) | undefined;

  constructor(opts: BrokerOptions) {
    this.config = opts.config;
    this.source = opts.source;
    this.clock = opts.clock ?? systemClock;
    this.#observer = opts.observer ?? {};
    this.source.onAvailable((wg) => this.#slotAvailable(wg));
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
    return Object.hasOwn(this.config.services, service) ? this.config.services[service]?.waitgroup : undefined;
  }

  /** Counts a finished run into the ETA statistics (only successful runs: failures end early). */
  recordRun(service: string, receipt: Receipt): void {
    if (receipt.ok) this.stats.record(service, receipt.duration_ms);
  }

  // ---------------------------------------------------------------- connections

  open(transport: BrokerTransport, info: ConnectionInfo = {}): BrokerSession {
    const now = this.clock.now();
    const conn = new BrokerConnection(`c${this.#nextConnection++}`, transport, info, now, this.config.broker.ping_interval_ms);
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

  /**
   * One timer per connection, due at the next ping or at the liveness deadline (last sign of
   * life + 2 intervals), whichever is first: a silent peer is dropped exactly 2 intervals after
   * it last answered, not up to a third interval later.
   */
  #armPing(conn: BrokerConnection): void {
    const interval = this.config.broker.ping_interval_ms;
    const deadline = conn.lastSeenAt + PING_MISSES_ALLOWED * interval;
    conn.pingTimer = this.clock.setTimeout(() => this.#pingTick(conn), Math.min(conn.nextPingAt, deadline) - this.clock.now());
  }

  #pingTick(conn: BrokerConnection): void {
    if (conn.closed) return;
    const interval = this.config.broker.ping_interval_ms;
    const now = this.clock.now();
    if (now - conn.lastSeenAt >= PING_MISSES_ALLOWED * interval) {
      // Half-open: the peer has not answered for two intervals.
      conn.transport.terminate();
      this.#closeConnection(conn, 'ping_timeout');
      return;
    }
    if (now >= conn.nextPingAt) {
      conn.nextPingAt = now + interval;
      conn.transport.ping();
    }
    this.#armPing(conn);
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
        if (!offer || offer.token !== msg.token) {
          if (conn.takeWithdrawn(msg.job_id, msg.token)) return;
          return this.#refuse(conn, 'no_offer', 'no live offer with this token', msg.job_id);
        }
        return this.#endOffer(conn, offer, 'declined');
      }
      case 'CANCEL': {
        const job = conn.running.get(msg.job_id);
        if (!job) {
          const hint = this.book.has(msg.job_id, conn.id) || conn.offers.has(msg.job_id) ? ' (it is not running: withdraw it with UNWANT)' : '';
          return this.#refuse(conn, 'unknown_job', `no running job with this job_id${hint}`, msg.job_id);
        }
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
    if (this.#draining) return this.#refuse(conn, 'draining', 'the server is draining and takes no new wants', msg.job_id);
    const waitgroup = this.waitgroupOf(msg.service);
    if (waitgroup === undefined) return this.#refuse(conn, 'unknown_service', `unknown service ${JSON.stringify(msg.service)}`, msg.job_id);
    if (this.#knows(conn, msg.job_id)) return this.#refuse(conn, 'duplicate_job', 'job_id already parked, offered or running on this connection', msg.job_id);
    const max = this.config.broker.max_wants_per_connection;
    if (this.book.connectionWants(conn.id) + conn.offers.size >= max) {
      return this.#refuse(conn, 'too_many_wants', `over max_wants_per_connection (${max} parked or offered)`, msg.job_id);
    }
    const want: Want = { jobId: msg.job_id, connId: conn.id, service: msg.service, waitgroup, priority: msg.priority };
    conn.forgetWithdrawn(msg.job_id);
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
    if (offer) {
      conn.rememberWithdrawn(jobId, offer.token);
      return this.#endOffer(conn, offer, 'withdrawn');
    }
    const hint = conn.running.has(jobId) ? ' (it is running: stop it with CANCEL)' : '';
    this.#refuse(conn, 'unknown_job', `no parked want or offer with this job_id${hint}`, jobId);
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
    const wg = offer.slot.waitgroup;
    this.#observer.jobStarted?.(wg, now - offer.offeredAt);
    const abort = new AbortController();
    const job: RunningJob = { jobId: msg.job_id, connId: conn.id, service: msg.job.service, priority: offer.want.priority, slot: offer.slot, abort, startedAt: now };
    conn.running.set(msg.job_id, job);
    this.#jobs.add(job);
    const io: JobIo = { signal: abort.signal };
    const body = usesBody(msg.job);
    if (body.stdin && msg.job.pipes?.in) io.stdin = pipeStdin(msg.job.pipes.in, abort.signal);
    if (body.stdout && msg.job.pipes?.out) io.stdout = pipeStdout(msg.job.pipes.out, abort.signal);
    let run: Promise<Receipt>;
    try {
      run = this.source.run(offer.slot, msg.job, io);
    } catch (e) {
      run = Promise.reject(e);
    }
    // DONE exactly once per accepted JOB, even if the source breaks its promise never to reject.
    void run
      .catch((e: unknown) => failedReceipt('internal', `slot source failed: ${(e as Error)?.message ?? String(e)}`, this.clock.now() - now))
      .then((receipt) => {
        conn.running.delete(msg.job_id);
        this.#jobs.delete(job);
        this.recordRun(job.service, receipt);
        this.#observer.jobDone?.(wg, job.service, receipt.ok, receipt.duration_ms);
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

  /** What the source may see of the demand: nothing while draining (no new offers will be made). */
  #demandView(): DemandView {
    if (this.#draining) return NO_DEMAND;
    return {
      peek: (wg: string) => this.book.peek(wg),
      parked: (wg: string) => this.book.parked(wg),
    };
  }

  /** Processes per waitgroup as last checked for HELLO, so freed slots re-check it cheaply. */
  readonly #announcedProcesses = new Map<string, number>();

  #slotAvailable(wg: string): void {
    if (!this.#draining && this.book.parked(wg) > 0) {
      const q = this.#freedAt.get(wg) ?? [];
      this.#freedAt.set(wg, q);
      // At most one pending start per slot: a source may report the same slot more than once.
      if (q.length < Math.max(1, this.source.processes(wg))) q.push(this.clock.now());
    }
    this.pump(wg);
    // A source may change its capacity (a gateway backend comes or goes): HELLO says so. Only
    // then: rebuilding HELLO on every freed slot cost ~2 µs per job.
    const processes = this.source.processes(wg);
    if (this.#announcedProcesses.get(wg) !== processes) {
      this.#announcedProcesses.set(wg, processes);
      this.helloChanged();
    }
    this.#checkDrained();
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
    // Nobody waits any more: a slot that frees from now on starts no latency.
    if (this.book.parked(waitgroup) === 0) this.#freedAt.delete(waitgroup);
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
    const since = this.#freedAt.get(want.waitgroup)?.shift();
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
    return buildHello({
      config: this.config,
      source: this.source,
      book: this.book,
      instanceId: this.instanceId,
      clients: this.#connections.size,
      draining: this.#draining,
    });
  }

  #sendHello(conn: BrokerConnection): void {
    const h = this.hello();
    conn.lastHelloSignature = helloSignature(h);
    conn.lastHelloAt = this.clock.now();
    this.#send(conn, h);
  }

  /** Re-sends HELLO to every connection whose view is stale, at most every 100 ms each. */
  helloChanged(): void {
    if (this.#connections.size === 0) return;
    const signature = helloSignature(this.hello());
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
        // The latest state, and nothing if it changed back in the meantime.
        if (conn.lastHelloSignature !== helloSignature(this.hello())) this.#sendHello(conn);
      }, wait);
    }
  }

  // ---------------------------------------------------------------- queries (broker-reports.ts)

  /** What the reports may read; nothing in it can change the broker. */
  #reportView(): BrokerReportView {
    return {
      instanceId: this.instanceId,
      config: this.config,
      source: this.source,
      book: this.book,
      stats: this.stats,
      now: this.clock.now(),
      draining: this.#draining,
      connections: this.#connections,
      jobs: this.#jobs,
    };
  }

  /**
   * POSITION for a job of this connection: a parked want (ahead by the grant rule replayed), an
   * offered job (ahead 0) or a running one (ahead 0, eta_ms the mean run time left).
   */
  position(connId: ConnectionId, jobId: string): PositionMessage | undefined {
    return positionOf(this.#reportView(), connId, jobId);
  }

  /** `GET /queue/{job_id}`: job ids are unique per connection only; the first connection that knows it. */
  positionAnywhere(jobId: string): PositionMessage | undefined {
    const view = this.#reportView();
    for (const conn of this.#connections.values()) {
      const p = positionOf(view, conn.id, jobId);
      if (p) return p;
    }
    return undefined;
  }

  /** Jobs running in the waitgroup by the priority of their WANT; the rest (legacy PUTs) as 'legacy'. */
  runningByPriority(waitgroup: string): RunningByPriority {
    return runningByPriorityOf(this.#reportView(), waitgroup);
  }

  status(): BrokerStatus {
    return statusOf(this.#reportView());
  }

  // ---------------------------------------------------------------- draining

  /** Drained: no offer out, no broker job running, and every slot back home (legacy tokens too). */
  #isDrained(): boolean {
    if (this.#jobs.size > 0) return false;
    for (const c of this.#connections.values()) if (c.offers.size > 0) return false;
    for (const wg of Object.keys(this.config.waitgroups)) if (this.source.inUse(wg) > 0) return false;
    return true;
  }

  #checkDrained(): void {
    if (!this.#draining || this.#resolveDrained === undefined || !this.#isDrained()) return;
    const resolve = this.#resolveDrained;
    this.#resolveDrained = undefined;
    resolve();
  }

  /**
   * Rule 7: no new offers, new WANTs refused, HELLO says draining; resolves once every outstanding
   * offer ended (JOB, DECLINE, UNWANT, expiry, close), every running job sent its DONE and every
   * slot came home (a legacy token is redeemed and its job ends, or it lapses). Parked wants stay
   * parked, never offered, until their connections close. Idempotent: every call gets the same
   * promise.
   */
  drain(): Promise<void> {
    if (this.#drained === undefined) {
      this.#draining = true;
      this.#drained = new Promise<void>((resolve) => {
        this.#resolveDrained = resolve;
      });
      this.#freedAt.clear();
      // The source stops reserving for wants that will not be offered (a gateway's tokens).
      for (const wg of Object.keys(this.config.waitgroups)) this.source.demandChanged(wg, this.#demandView());
      this.helloChanged();
      this.#checkDrained();
    }
    return this.#drained;
  }

  /** Closes every connection (1001 going away); their running jobs are stopped (rule 6). */
  closeAll(): void {
    for (const conn of [...this.#connections.values()]) {
      conn.transport.close(1001, 'server shutting down');
      this.#closeConnection(conn, 'shutdown');
    }
  }
}
