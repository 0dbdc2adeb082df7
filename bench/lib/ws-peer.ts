/**
 * A raw broker peer playing the fylr side over one websocket (PROTOCOL.md §1), as lean as a
 * client can be: WANT, and on OFFER at once JOB with a no-command job (or whatever `onOffer`
 * decides), counting DONEs. No reconnects, no admission, no pipes: the bench measures the
 * execserver, not a client library.
 */
import { WebSocket } from 'ws';

export interface PeerHandlers {
  /** Default: accept with a no-command job of the WANT's service. */
  onOffer?(peer: BrokerPeer, jobId: string, token: string): void;
  onDone?(peer: BrokerPeer, jobId: string, ok: boolean): void;
}

let peerSeq = 0;

export class BrokerPeer {
  readonly ws: WebSocket;
  readonly name = `p${++peerSeq}`;
  readonly #services = new Map<string, string>();
  /** Wants sent and not offered yet (nor refused). */
  readonly parked = new Set<string>();
  /** Jobs accepted (JOB sent) whose DONE has not come yet. */
  running = 0;
  handlers: PeerHandlers;
  #seq = 0;
  offers = 0;
  dones = 0;
  errors = 0;
  lastError = '';
  framesIn = 0;
  framesOut = 0;
  hello: Record<string, unknown> | undefined;

  private constructor(ws: WebSocket, handlers: PeerHandlers) {
    this.ws = ws;
    this.handlers = handlers;
    ws.on('message', (data) => this.#message(String(data)));
  }

  static async connect(baseUrl: string, handlers: PeerHandlers = {}): Promise<BrokerPeer> {
    const ws = new WebSocket(`${baseUrl.replace(/^http/, 'ws')}/broker`, { perMessageDeflate: false });
    const peer = new BrokerPeer(ws, handlers);
    await new Promise<void>((resolve, reject) => {
      ws.once('error', reject);
      const giveUp = setTimeout(() => reject(new Error(`no HELLO from ${baseUrl}/broker within 10 s`)), 10_000);
      const check = (): void => {
        if (peer.hello) {
          clearTimeout(giveUp);
          ws.off('error', reject);
          ws.on('error', () => undefined);
          resolve();
        } else setTimeout(check, 2);
      };
      ws.once('open', check);
    });
    return peer;
  }

  nextJobId(): string {
    return `${this.name}-${++this.#seq}`;
  }

  send(msg: Record<string, unknown>): void {
    this.framesOut++;
    this.ws.send(JSON.stringify(msg));
  }

  want(service: string, priority = 0, jobId = this.nextJobId()): string {
    this.#services.set(jobId, service);
    this.parked.add(jobId);
    this.send({ type: 'WANT', job_id: jobId, service, priority });
    return jobId;
  }

  /** Accepts an offer with a no-command job (the transport without any process cost). */
  accept(jobId: string, token: string, job?: Record<string, unknown>): void {
    const service = this.#services.get(jobId) ?? 'noop';
    this.running++;
    this.send({ type: 'JOB', job_id: jobId, token, job: job ?? { service, commands: [] } });
  }

  get parkedHere(): number {
    return this.#services.size;
  }

  #message(text: string): void {
    this.framesIn++;
    const m = JSON.parse(text) as { type: string; job_id?: string; token?: string; code?: string; message?: string; receipt?: { ok: boolean } };
    switch (m.type) {
      case 'HELLO':
        this.hello = m as Record<string, unknown>;
        return;
      case 'OFFER':
        this.offers++;
        this.parked.delete(m.job_id as string);
        if (this.handlers.onOffer) this.handlers.onOffer(this, m.job_id as string, m.token as string);
        else this.accept(m.job_id as string, m.token as string);
        return;
      case 'DONE':
        this.dones++;
        this.running--;
        this.#services.delete(m.job_id as string);
        this.handlers.onDone?.(this, m.job_id as string, m.receipt?.ok === true);
        return;
      case 'ERROR':
        this.errors++;
        this.lastError = `${m.code}: ${m.message}`;
        if (m.job_id !== undefined) {
          this.#services.delete(m.job_id);
          this.parked.delete(m.job_id);
        }
        return;
      default:
        return;
    }
  }

  /**
   * Ends cleanly: UNWANT every parked want, DECLINE offers that still come, and wait (at most
   * `timeoutMs`) until every accepted job sent its DONE. What a well-behaved fylr does when it
   * stops, so that closing the socket stops no running job (rule 6) and costs no extra work.
   */
  async drain(timeoutMs = 10_000): Promise<void> {
    this.handlers = { onOffer: (p, jobId, token) => p.send({ type: 'DECLINE', job_id: jobId, token }) };
    for (const jobId of [...this.parked]) {
      this.parked.delete(jobId);
      this.send({ type: 'UNWANT', job_id: jobId });
    }
    const until = performance.now() + timeoutMs;
    while (this.running > 0 && performance.now() < until) await new Promise((resolve) => setTimeout(resolve, 5));
  }

  close(): Promise<void> {
    if (this.ws.readyState === this.ws.CLOSED) return Promise.resolve();
    return new Promise((resolve) => {
      this.ws.once('close', () => resolve());
      this.ws.close(1000);
      setTimeout(() => {
        this.ws.terminate();
        resolve();
      }, 2000).unref();
    });
  }
}

/** Connects `n` peers. */
export async function connectPeers(url: string, n: number, handlers: PeerHandlers = {}): Promise<BrokerPeer[]> {
  const out: BrokerPeer[] = [];
  for (let i = 0; i < n; i++) out.push(await BrokerPeer.connect(url, handlers));
  return out;
}

/** drain() then close() every peer. */
export async function drainAndClosePeers(peers: readonly BrokerPeer[]): Promise<void> {
  await Promise.all(peers.map((p) => p.drain()));
  await closePeers(peers);
}

export async function closePeers(peers: readonly BrokerPeer[]): Promise<void> {
  await Promise.all(peers.map((p) => p.close()));
}
