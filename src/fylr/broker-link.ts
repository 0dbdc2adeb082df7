/**
 * One fylr-side broker connection: a websocket to `<address>/broker`, from the dial to the close.
 *
 *   connecting --HELLO--> open --close / error / 2 silent ping intervals--> closed
 *       |
 *       +--404 on the upgrade--> failed: no_broker (an old execserver: poll this address)
 *       +--anything else (refused, 502, timeout, first frame not HELLO)--> failed
 *
 * Everything is reported through LinkEvents synchronously, in frame order: a frame that arrives
 * in the same TCP read as the HELLO is handled after `opened`, never before it and never lost
 * in a promise hop. The local address of the socket is kept: pipe URLs of jobs carried by this
 * link point there (the replica that owns the pipes).
 */
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import WebSocket, { type ClientOptions } from 'ws';
import { type Clock, every, type TimerHandle } from '../clock.js';
import { decodeFromExec, encode, isProtocolError } from '../protocol/codec.js';
import type { ExecMessage, FylrMessage, HelloMessage } from '../protocol/messages.js';

/** The narrow port the pool dials through (tests bind a local address, wrap, or fake it). */
export type ConnectFn = (url: string, options: ClientOptions) => WebSocket;

export const defaultConnect: ConnectFn = (url, options) => new WebSocket(url, options);

export type DialPurpose = 'initial' | 'growth' | 'reconnect' | 'reprobe';

export type DialFailure = { kind: 'no_broker'; status: number } | { kind: 'failed'; reason: string };

export type LinkMessage = Exclude<ExecMessage, HelloMessage>;

export interface LinkEvents {
  /** The first HELLO arrived: the link is usable. */
  opened(link: BrokerLink): void;
  /** The dial ended without a HELLO. */
  failed(link: BrokerLink, failure: DialFailure): void;
  /** A later HELLO (services, processes, clients or draining changed). */
  hello(link: BrokerLink, hello: HelloMessage, previous: HelloMessage): void;
  message(link: BrokerLink, message: LinkMessage): void;
  /** An opened link closed, for whatever reason (also after close() and terminate()). */
  closed(link: BrokerLink, reason: string): void;
  /** Sent a frame (for observers). */
  sent?(link: BrokerLink, message: FylrMessage): void;
  pong?(link: BrokerLink): void;
}

export interface LinkOptions {
  url: string;
  /** The configured address this link belongs to. */
  address: string;
  purpose: DialPurpose;
  connect: ConnectFn;
  clock: Clock;
  pingIntervalMs: number;
  /** How long the upgrade may take (real time, ws's own timer). */
  handshakeTimeoutMs: number;
  /** How long the HELLO may take after the upgrade. */
  helloTimeoutMs: number;
  maxPayloadBytes: number;
}

let nextLinkId = 1;

export class BrokerLink {
  readonly id = `l${nextLinkId++}`;
  readonly address: string;
  readonly purpose: DialPurpose;
  readonly dialedAt: number;
  readonly #ws: WebSocket;
  readonly #events: LinkEvents;
  readonly #clock: Clock;
  readonly #pingIntervalMs: number;
  #state: 'connecting' | 'open' | 'closed' = 'connecting';
  #hello: HelloMessage | undefined;
  #localAddress: string | undefined;
  #lastSeenAt: number;
  #stopPing: (() => void) | undefined;
  #helloTimer: TimerHandle | undefined;
  #httpStatus: number | undefined;
  #failure: string | undefined;
  #closeReason: string | undefined;
  /** Set by the pool when it dropped the link (duplicate, shutdown): its close is expected. */
  retired = false;
  /** The pool reported it up (linkUp) and owes a linkDown. */
  up = false;
  /** Resolves once the socket is closed (after a failed dial too). */
  readonly whenClosed: Promise<void>;
  #resolveClosed!: () => void;

  constructor(opts: LinkOptions, events: LinkEvents) {
    this.whenClosed = new Promise<void>((resolve) => (this.#resolveClosed = resolve));
    this.address = opts.address;
    this.purpose = opts.purpose;
    this.#events = events;
    this.#clock = opts.clock;
    this.#pingIntervalMs = opts.pingIntervalMs;
    this.dialedAt = opts.clock.now();
    this.#lastSeenAt = this.dialedAt;
    this.#ws = opts.connect(opts.url, {
      handshakeTimeout: opts.handshakeTimeoutMs,
      perMessageDeflate: false,
      maxPayload: opts.maxPayloadBytes,
    });
    const ws = this.#ws;
    ws.on('upgrade', (res: IncomingMessage) => {
      this.#localAddress = (res.socket as Socket).localAddress;
    });
    ws.on('unexpected-response', (_req, res: IncomingMessage) => {
      this.#httpStatus = res.statusCode;
      res.resume();
      ws.terminate();
    });
    ws.on('open', () => {
      this.#localAddress ??= (ws as unknown as { _socket?: Socket })._socket?.localAddress;
      this.#helloTimer = this.#clock.setTimeout(() => {
        if (this.#state !== 'connecting') return;
        this.#failure = 'no HELLO after the upgrade';
        ws.terminate();
      }, opts.helloTimeoutMs);
    });
    ws.on('message', (data, isBinary) => this.#receive(data, isBinary));
    ws.on('pong', () => {
      this.#lastSeenAt = this.#clock.now();
      this.#events.pong?.(this);
    });
    ws.on('ping', () => {
      this.#lastSeenAt = this.#clock.now();
    });
    ws.on('error', (err) => {
      this.#failure ??= (err as NodeJS.ErrnoException).code ?? err.message;
    });
    ws.on('close', (code) => this.#onClose(code));
  }

  get state(): 'connecting' | 'open' | 'closed' {
    return this.#state;
  }

  get isOpen(): boolean {
    return this.#state === 'open';
  }

  /** The latest HELLO; defined once opened. */
  get hello(): HelloMessage {
    if (this.#hello === undefined) throw new Error('BrokerLink.hello before the first HELLO');
    return this.#hello;
  }

  get instanceId(): string | undefined {
    return this.#hello?.instance_id;
  }

  /** The local address of the socket (what pipe URLs carry), once upgraded. */
  get localAddress(): string | undefined {
    return this.#localAddress;
  }

  /** Does the instance accept wants for `service` now? */
  serves(service: string): boolean {
    return this.#state === 'open' && this.#hello !== undefined && !this.#hello.draining && Object.hasOwn(this.#hello.services, service);
  }

  send(message: FylrMessage): boolean {
    if (this.#state !== 'open' || this.#ws.readyState !== WebSocket.OPEN) return false;
    this.#ws.send(encode(message));
    this.#events.sent?.(this, message);
    return true;
  }

  /** A clean close; `closed` follows (for an opened link) when the socket is gone. */
  close(code: number, reason: string): void {
    this.#closeReason ??= reason;
    if (this.#ws.readyState === WebSocket.CONNECTING) {
      this.#failure ??= reason;
      this.#ws.terminate();
      return;
    }
    this.#ws.close(code, reason);
  }

  terminate(reason: string): void {
    this.#closeReason ??= reason;
    this.#failure ??= reason;
    this.#ws.terminate();
  }

  #receive(data: WebSocket.RawData, isBinary: boolean): void {
    if (this.#state === 'closed') return;
    this.#lastSeenAt = this.#clock.now();
    if (isBinary) return this.#protocolViolation('binary frame from the execserver');
    const text = Array.isArray(data) ? Buffer.concat(data).toString('utf8') : Buffer.isBuffer(data) ? data.toString('utf8') : Buffer.from(data).toString('utf8');
    const msg = decodeFromExec(text);
    if (isProtocolError(msg)) {
      // A frame we cannot read: ignore it (a newer peer), unless it was meant to be the HELLO.
      if (this.#state === 'connecting') this.#protocolViolation(`first frame unreadable: ${msg.message}`);
      return;
    }
    if (msg.type === 'HELLO') {
      const previous = this.#hello;
      this.#hello = msg;
      if (this.#state === 'connecting') {
        this.#state = 'open';
        this.#clock.clearTimeout(this.#helloTimer);
        this.#stopPing = every(this.#clock, this.#pingIntervalMs, () => this.#pingTick());
        this.#events.opened(this);
      } else if (previous !== undefined) {
        this.#events.hello(this, msg, previous);
      }
      return;
    }
    if (this.#state === 'connecting') return this.#protocolViolation(`first frame was ${msg.type}, not HELLO`);
    this.#events.message(this, msg);
  }

  #protocolViolation(why: string): void {
    this.#failure ??= why;
    this.#closeReason ??= why;
    this.#ws.close(1002, why.slice(0, 100));
  }

  #pingTick(): void {
    if (this.#state !== 'open') return;
    if (this.#clock.now() - this.#lastSeenAt >= 2 * this.#pingIntervalMs) {
      // Half-open: nothing heard for two intervals.
      this.terminate('ping_timeout');
      return;
    }
    this.#ws.ping();
  }

  #onClose(code: number): void {
    const was = this.#state;
    if (was === 'closed') return;
    this.#state = 'closed';
    this.#resolveClosed();
    this.#clock.clearTimeout(this.#helloTimer);
    this.#stopPing?.();
    if (was === 'connecting') {
      const failure: DialFailure =
        this.#httpStatus === 404
          ? { kind: 'no_broker', status: 404 }
          : { kind: 'failed', reason: this.#httpStatus !== undefined ? `upgrade answered ${this.#httpStatus}` : (this.#failure ?? `closed (${code}) before HELLO`) };
      this.#events.failed(this, failure);
      return;
    }
    this.#events.closed(this, this.#closeReason ?? `close ${code}`);
  }
}
