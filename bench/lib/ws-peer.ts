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
    this.send({ type: 'WANT', job_id: jobId, service, priority });
    return jobId;
  }

  /** Accepts an offer with a no-command job (the transport without any process cost). */
  accept(jobId: string, token: string, job?: Record<string, unknown>): void {
    const service = this.#services.get(jobId) ?? 'noop';
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
        if (this.handlers.onOffer) this.handlers.onOffer(this, m.job_id as string, m.token as string);
        else this.accept(m.job_id as string, m.token as string);
        return;
      case 'DONE':
        this.dones++;
        this.#services.delete(m.job_id as string);
        this.handlers.onDone?.(this, m.job_id as string, m.receipt?.ok === true);
        return;
      case 'ERROR':
        this.errors++;
        this.lastError = `${m.code}: ${m.message}`;
        if (m.job_id !== undefined) this.#services.delete(m.job_id);
        return;
      default:
        return;
    }
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

export async function closePeers(peers: readonly BrokerPeer[]): Promise<void> {
  await Promise.all(peers.map((p) => p.close()));
}
