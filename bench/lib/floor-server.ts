/**
 * The physical floor for the broker's hand-off and throughput on loopback: a bare `ws` server that
 * speaks the same four frames per job (WANT -> OFFER -> JOB -> DONE) with nothing else — one FIFO
 * of wants, `processes` slots, no want-book, no priorities, no timers, no fastify, no validation.
 * Whatever the native execserver takes beyond this is the cost of its logic; what this takes is
 * the cost of websocket framing, JSON and two event-loop hops.
 *
 * It timestamps hand-offs like TimingSource: slot freed -> the next JOB frame decoded.
 */
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { type WebSocket, WebSocketServer } from 'ws';

interface FloorWant {
  ws: WebSocket;
  jobId: string;
}

const OK_RECEIPT = {
  ok: true, exit_code: 0, duration_ms: 0, timed_out: false, stopped: false, stderr_line: '',
  stdout_prefix: '', output_bytes: 0, commands: [], error: null,
};

export class FloorServer {
  readonly #wss: WebSocketServer;
  readonly #queue: FloorWant[] = [];
  #head = 0;
  readonly #offers = new Map<string, { ws: WebSocket; token: string }>();
  #free: number;
  #freedAt: number[] = [];
  holdMs: number;
  recording = false;
  readonly samplesMs: number[] = [];
  framesIn = 0;
  framesOut = 0;
  jobsRun = 0;

  private constructor(wss: WebSocketServer, processes: number, holdMs: number) {
    this.#wss = wss;
    this.#free = processes;
    this.holdMs = holdMs;
    wss.on('connection', (ws) => this.#connection(ws));
  }

  static async start(processes: number, holdMs = 0): Promise<{ server: FloorServer; url: string }> {
    const wss = new WebSocketServer({ host: '127.0.0.1', port: 0, path: '/broker' });
    await new Promise<void>((resolve) => wss.once('listening', () => resolve()));
    const port = (wss.address() as AddressInfo).port;
    return { server: new FloorServer(wss, processes, holdMs), url: `http://127.0.0.1:${port}` };
  }

  reset(recording: boolean): void {
    this.#freedAt = [];
    this.samplesMs.length = 0;
    this.recording = recording;
  }

  #send(ws: WebSocket, msg: unknown): void {
    this.framesOut++;
    ws.send(JSON.stringify(msg));
  }

  #connection(ws: WebSocket): void {
    this.#send(ws, { type: 'HELLO', protocol: 1, instance_id: 'floor', name: 'floor', services: { noop: 'wg' }, waitgroups: {}, clients: 0, draining: false });
    ws.on('message', (data) => {
      this.framesIn++;
      const msg = JSON.parse(String(data)) as { type: string; job_id: string; token?: string };
      if (msg.type === 'WANT') {
        this.#queue.push({ ws, jobId: msg.job_id });
        this.#pump();
      } else if (msg.type === 'JOB') {
        const offer = this.#offers.get(msg.job_id);
        if (!offer || offer.token !== msg.token) return;
        this.#offers.delete(msg.job_id);
        const freed = this.#freedAt.shift();
        if (this.recording && freed !== undefined) this.samplesMs.push(performance.now() - freed);
        this.jobsRun++;
        const finish = (): void => {
          this.#free++;
          if (this.recording && this.#head < this.#queue.length) this.#freedAt.push(performance.now());
          this.#pump();
          this.#send(ws, { type: 'DONE', job_id: msg.job_id, receipt: OK_RECEIPT });
        };
        if (this.holdMs > 0) setTimeout(finish, this.holdMs);
        else queueMicrotask(finish);
      }
    });
    ws.on('close', () => {
      // Benchmark peers close only at the end; drop their wants lazily in #pump.
    });
  }

  #pump(): void {
    while (this.#free > 0 && this.#head < this.#queue.length) {
      const w = this.#queue[this.#head++] as FloorWant;
      if (this.#head > 4096 && this.#head * 2 > this.#queue.length) {
        this.#queue.splice(0, this.#head);
        this.#head = 0;
      }
      if (w.ws.readyState !== w.ws.OPEN) continue;
      this.#free--;
      const token = randomBytes(16).toString('base64url');
      this.#offers.set(w.jobId, { ws: w.ws, token });
      this.#send(w.ws, { type: 'OFFER', job_id: w.jobId, token, expires_ms: 5000 });
    }
  }

  close(): Promise<void> {
    for (const c of this.#wss.clients) c.terminate();
    return new Promise((resolve) => this.#wss.close(() => resolve()));
  }
}
