/**
 * A small fylr-side websocket client for tests of any `/broker` server (native execserver,
 * gateway): it connects to `url + '/broker'`, collects every frame, and lets a test await the
 * next frame of a type instead of sleeping.
 *
 *   const peer = await BrokerPeer.connect(server.url);        // resolves after HELLO
 *   peer.want('j1', 'echo');
 *   const offer = await peer.next('OFFER', 'j1');
 *   peer.job('j1', offer.token, { service: 'echo', commands: [...] });
 *   const done = await peer.next('DONE', 'j1');
 *
 * Every frame is consumed at most once by `next`, in arrival order, so a test can await frames
 * in any order. A wait that is not answered within `timeoutMs` (default 10 s) rejects with the
 * frames seen so far: a failing test says what it got instead of hanging. `sync()` is a barrier:
 * a websocket ping the server answers only after it handled every frame sent before it.
 */
import { once } from 'node:events';
import WebSocket from 'ws';
import type { JobSpec } from '../../src/protocol/job.js';
import type { ExecMessage, HelloMessage } from '../../src/protocol/messages.js';

export type ExecType = ExecMessage['type'];
export type FrameOf<T extends ExecType> = Extract<ExecMessage, { type: T }>;

export interface PeerOptions {
  /** Answer the server's pings (default true). false: a half-open peer. */
  autoPong?: boolean;
  /** Default timeout of `next` and friends. */
  timeoutMs?: number;
  /** Passed to ws (e.g. maxPayload of what we accept). */
  wsOptions?: WebSocket.ClientOptions;
}

export interface CloseInfo {
  code: number;
  reason: string;
}

interface Received {
  frame: ExecMessage;
  consumed: boolean;
}

interface Waiter {
  match: (f: ExecMessage) => boolean;
  resolve: (f: ExecMessage) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

export function brokerUrl(baseUrl: string): string {
  return `${baseUrl.replace(/^http/, 'ws').replace(/\/+$/, '')}/broker`;
}

export class BrokerPeer {
  readonly ws: WebSocket;
  /** Every frame received, in order (the raw JSON objects). */
  readonly received: ExecMessage[] = [];
  /** Non-JSON text frames (none from a correct server). */
  readonly garbage: string[] = [];
  /** Resolves when the socket closed, with the close code the peer saw. */
  readonly closed: Promise<CloseInfo>;
  readonly timeoutMs: number;
  /** Pings received from the server. */
  pings = 0;
  #items: Received[] = [];
  #waiters = new Set<Waiter>();
  #closeInfo: CloseInfo | undefined;
  #pingWaiters: { n: number; resolve: () => void }[] = [];
  #syncs = 0;
  #listeners = new Set<(f: ExecMessage) => void>();

  private constructor(ws: WebSocket, timeoutMs: number) {
    this.ws = ws;
    this.timeoutMs = timeoutMs;
    ws.on('message', (data, isBinary) => {
      const text = isBinary ? '' : data.toString();
      let frame: ExecMessage;
      try {
        frame = JSON.parse(text) as ExecMessage;
      } catch {
        this.garbage.push(text);
        return;
      }
      this.received.push(frame);
      for (const l of this.#listeners) l(frame);
      const item: Received = { frame, consumed: false };
      this.#items.push(item);
      for (const w of this.#waiters) {
        if (w.match(frame)) {
          item.consumed = true;
          this.#waiters.delete(w);
          clearTimeout(w.timer);
          w.resolve(frame);
          break;
        }
      }
    });
    ws.on('ping', () => {
      this.pings++;
      this.#pingWaiters = this.#pingWaiters.filter((w) => {
        if (this.pings < w.n) return true;
        w.resolve();
        return false;
      });
    });
    ws.on('error', () => undefined);
    this.closed = new Promise<CloseInfo>((resolve) => {
      ws.on('close', (code, reason) => {
        this.#closeInfo = { code, reason: reason.toString() };
        for (const w of this.#waiters) {
          clearTimeout(w.timer);
          w.reject(new Error(`connection closed (${code} ${reason.toString()}) while waiting; frames: ${this.#describe()}`));
        }
        this.#waiters.clear();
        resolve(this.#closeInfo);
      });
    });
  }

  /** Connects and resolves once the server's first frame arrived (it must be HELLO). */
  static async connect(baseUrl: string, opts: PeerOptions = {}): Promise<BrokerPeer> {
    const ws = new WebSocket(brokerUrl(baseUrl), { autoPong: opts.autoPong ?? true, ...opts.wsOptions });
    const peer = new BrokerPeer(ws, opts.timeoutMs ?? 10_000);
    const first = peer.#nextFrame(() => true, peer.timeoutMs);
    first.catch(() => undefined); // awaited below unless the connect itself fails
    await Promise.race([
      once(ws, 'open'),
      once(ws, 'error').then(([e]) => {
        throw e as Error;
      }),
    ]);
    const frame = await first;
    if (frame.type !== 'HELLO') throw new Error(`first frame was ${frame.type}, not HELLO`);
    return peer;
  }

  /** The first frame of the connection. */
  get hello(): HelloMessage {
    return this.received[0] as HelloMessage;
  }

  /** The latest HELLO received. */
  get lastHello(): HelloMessage {
    return this.received.filter((f): f is HelloMessage => f.type === 'HELLO').at(-1) as HelloMessage;
  }

  get closeInfo(): CloseInfo | undefined {
    return this.#closeInfo;
  }

  get isOpen(): boolean {
    return this.ws.readyState === WebSocket.OPEN;
  }

  /** The local address of this broker connection (what a fylr puts into pipe URLs, §2). */
  get localAddress(): string {
    return (this.ws as unknown as { _socket: { localAddress: string } })._socket.localAddress;
  }

  /** Calls `fn` with every frame from now on (it does not consume them). Returns an unsubscribe. */
  onFrame(fn: (f: ExecMessage) => void): () => void {
    this.#listeners.add(fn);
    return () => this.#listeners.delete(fn);
  }

  /** Frames of a type received so far (consumed or not). */
  all<T extends ExecType>(type: T): FrameOf<T>[] {
    return this.received.filter((f): f is FrameOf<T> => f.type === type);
  }

  /** Frames not consumed by `next` yet. */
  unconsumed(): ExecMessage[] {
    return this.#items.filter((i) => !i.consumed).map((i) => i.frame);
  }

  /**
   * The next not yet consumed frame of `type` (and of `jobId`, or matching `where`), waiting
   * for it if needed.
   */
  next<T extends ExecType>(type: T, jobIdOrWhere?: string | ((f: FrameOf<T>) => boolean), timeoutMs = this.timeoutMs): Promise<FrameOf<T>> {
    const where = typeof jobIdOrWhere === 'function' ? jobIdOrWhere : undefined;
    const jobId = typeof jobIdOrWhere === 'string' ? jobIdOrWhere : undefined;
    const match = (f: ExecMessage): boolean =>
      f.type === type && (jobId === undefined || (f as { job_id?: string }).job_id === jobId) && (where === undefined || where(f as FrameOf<T>));
    return this.#nextFrame(match, timeoutMs, `${type}${jobId ? ` ${jobId}` : ''}`) as Promise<FrameOf<T>>;
  }

  /** The next unconsumed frame of any type. */
  nextAny(timeoutMs = this.timeoutMs): Promise<ExecMessage> {
    return this.#nextFrame(() => true, timeoutMs, 'any frame');
  }

  /** The next ERROR with this code (and job_id). */
  error(code: string, jobId?: string, timeoutMs = this.timeoutMs): Promise<FrameOf<'ERROR'>> {
    return this.next('ERROR', (f) => f.code === code && (jobId === undefined || f.job_id === jobId), timeoutMs);
  }

  #nextFrame(match: (f: ExecMessage) => boolean, timeoutMs: number, what = 'frame'): Promise<ExecMessage> {
    const item = this.#items.find((i) => !i.consumed && match(i.frame));
    if (item) {
      item.consumed = true;
      return Promise.resolve(item.frame);
    }
    if (this.#closeInfo) return Promise.reject(new Error(`connection closed (${this.#closeInfo.code}); no ${what}; frames: ${this.#describe()}`));
    return new Promise<ExecMessage>((resolve, reject) => {
      const w: Waiter = {
        match,
        resolve,
        reject,
        timer: setTimeout(() => {
          this.#waiters.delete(w);
          reject(new Error(`no ${what} within ${timeoutMs} ms; frames: ${this.#describe()}`));
        }, timeoutMs),
      };
      this.#waiters.add(w);
    });
  }

  #describe(): string {
    return this.received.map((f) => `${f.type}${'job_id' in f && f.job_id ? `(${f.job_id})` : ''}${f.type === 'ERROR' ? `[${f.code}]` : ''}`).join(' ') || '(none)';
  }

  /** Resolves once the server has sent `n` pings in total. */
  waitPings(n: number, timeoutMs = this.timeoutMs): Promise<void> {
    if (this.pings >= n) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`only ${this.pings} of ${n} pings within ${timeoutMs} ms`)), timeoutMs);
      this.#pingWaiters.push({
        n,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      });
    });
  }

  /**
   * A barrier: resolves when the server answered a ping sent after every frame so far, so every
   * earlier frame has been handled (and any frame it answered at once has arrived).
   */
  async sync(timeoutMs = this.timeoutMs): Promise<void> {
    const tag = `sync-${++this.#syncs}`;
    const pong = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no pong for ${tag} within ${timeoutMs} ms`)), timeoutMs);
      const onPong = (data: Buffer): void => {
        if (data.toString() !== tag) return;
        clearTimeout(timer);
        this.ws.off('pong', onPong);
        resolve();
      };
      this.ws.on('pong', onPong);
    });
    this.ws.ping(tag);
    await pong;
  }

  // ---------------------------------------------------------------- sending

  send(frame: Record<string, unknown>): void {
    this.ws.send(JSON.stringify(frame));
  }

  sendRaw(data: string | Buffer, opts: { binary?: boolean } = {}): void {
    this.ws.send(data, { binary: opts.binary ?? Buffer.isBuffer(data) });
  }

  want(jobId: string, service: string, priority = 0): void {
    this.send({ type: 'WANT', job_id: jobId, service, priority });
  }

  unwant(jobId: string): void {
    this.send({ type: 'UNWANT', job_id: jobId });
  }

  job(jobId: string, token: string, job: JobSpec): void {
    this.send({ type: 'JOB', job_id: jobId, token, job });
  }

  decline(jobId: string, token: string): void {
    this.send({ type: 'DECLINE', job_id: jobId, token });
  }

  cancel(jobId: string): void {
    this.send({ type: 'CANCEL', job_id: jobId });
  }

  query(jobId: string): void {
    this.send({ type: 'QUERY', job_id: jobId });
  }

  /** WANT, then QUERY: resolves with the POSITION once the want is parked (not offered). */
  async park(jobId: string, service: string, priority = 0): Promise<FrameOf<'POSITION'>> {
    this.want(jobId, service, priority);
    this.query(jobId);
    return this.next('POSITION', jobId);
  }

  /** WANT, await the OFFER, send JOB; resolves with the OFFER. */
  async acquire(jobId: string, job: JobSpec, priority = 0): Promise<FrameOf<'OFFER'>> {
    this.want(jobId, job.service, priority);
    const offer = await this.next('OFFER', jobId);
    this.job(jobId, offer.token, job);
    return offer;
  }

  /** WANT, OFFER, JOB, DONE: resolves with the DONE. */
  async run(jobId: string, job: JobSpec, priority = 0): Promise<FrameOf<'DONE'>> {
    await this.acquire(jobId, job, priority);
    return this.next('DONE', jobId);
  }

  // ---------------------------------------------------------------- closing

  /** Closes cleanly and waits for the close to complete. */
  async close(code = 1000): Promise<CloseInfo> {
    if (this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING) this.ws.close(code);
    return this.closed;
  }

  /** Drops the socket without a close handshake. */
  terminate(): void {
    this.ws.terminate();
  }
}

/** Job JSON helpers for the services of the contract config (test/execserver/broker-contract.ts). */
export const jobs = {
  /** Holds a slot until CANCEL or `seconds` pass. */
  sleep: (seconds: number | string = 30): JobSpec => ({ service: 'sleep', commands: [{ prog: 'sleep', args: [{ type: 'value', value: String(seconds) }] }] }),
  echo: (...words: string[]): JobSpec => ({ service: 'echo', commands: [{ prog: 'echo', args: words.map((value) => ({ type: 'value' as const, value })) }] }),
  /** No commands: succeeds at once (PROTOCOL.md §3). */
  empty: (service: string): JobSpec => ({ service, commands: [] }),
  /** Body mode: stdin from pipes.in, stdout to pipes.out. */
  cat: (pipes: { in?: string; out?: string }): JobSpec => ({
    service: 'cat',
    commands: [{ prog: 'cat', args: [], stdin: { type: 'body' }, stdout: { type: 'body' } }],
    pipes,
  }),
  /** Writes `bytes` bytes of "x\n" to a body stdout, then exits 3. */
  fail: (bytes: number, pipes: { out?: string } = {}): JobSpec => ({
    service: 'fail',
    commands: [{ prog: 'fail', args: [{ type: 'value', value: String(bytes) }], stdout: { type: 'body' } }],
    pipes,
  }),
};
