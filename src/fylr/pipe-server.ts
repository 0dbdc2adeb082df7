/**
 * One-time pipe endpoints for body-mode jobs (PROTOCOL.md §2), mounted on the fylr's own HTTP
 * listener:
 *
 *   GET /pipe/:id   an in-pipe: streams the caller's stdin Readable (the job's stdin)
 *   PUT /pipe/:id   an out-pipe: streams the request body into the caller's stdout Writable
 *
 * A pipe's life:   open --first request--> used (tombstone: 410) --ttl--> forgotten (404)
 *                    \--ttl, never requested--> forgotten (404)
 *
 * The id (192 random bits, base64url) is the only credential, and each id is served exactly
 * once: a second request gets 410, an unknown or expired id 404. Nothing is buffered in full:
 * both directions are written chunk by chunk, waiting for 'drain' (backpressure reaches the
 * execserver's socket). An out-pipe whose request body ends early (the execserver aborted the
 * PUT) resolves its result with ok: false, so the job's receipt can report the failure even
 * when DONE says ok.
 *
 * Caller streams are never destroyed with an error (an 'error' event without a listener would
 * crash the process): a broken stdin or stdout is `destroy()`ed plainly, and the failure travels
 * in the result instead.
 */
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Readable, Writable } from 'node:stream';
import type { FastifyPluginAsync, FastifyReply } from 'fastify';
import { batchedPerTurn } from '../batched-per-turn.js';
import { type Clock, systemClock, type TimerHandle } from '../clock.js';
import { type ErrorCode, httpStatusOf } from '../errors.js';
import { forEachChunk } from '../for-each-chunk.js';

/** Unused pipes are forgotten after this long (a job's pipes are discarded at its DONE anyway). */
export const DEFAULT_PIPE_TTL_MS = 10 * 60_000;
/** Bytes of randomness in a pipe id. */
export const PIPE_ID_BYTES = 24;

export type PipeKind = 'in' | 'out';

export interface PipeOutResult {
  /** The execserver sent a PUT at all. */
  started: boolean;
  /** The body arrived complete and was written to the sink. */
  ok: boolean;
  bytes: number;
  /** Why not ok. */
  error: string | null;
}

export interface PipeInResult {
  started: boolean;
  /** The whole stdin was sent. */
  ok: boolean;
  bytes: number;
  error: string | null;
}

export interface Pipe<R> {
  readonly id: string;
  readonly kind: PipeKind;
  /** `/pipe/<id>`: append to the base URL the execserver reaches this listener at. */
  readonly path: string;
  /** Settles once the pipe was served (or discarded/expired without a request: started false). */
  readonly result: Promise<R>;
  /** Has a request for it arrived? */
  readonly started: boolean;
  /** Forget an unused pipe now (404 afterwards). No effect once a request arrived. */
  discard(): void;
}

interface Entry {
  id: string;
  kind: PipeKind;
  state: 'open' | 'used';
  timer: TimerHandle | undefined;
  stdin: Readable | undefined;
  stdout: Writable | undefined;
  settle: (r: PipeOutResult) => void;
  settled: boolean;
  started: boolean;
}

function newPipeId(): string {
  return randomBytes(PIPE_ID_BYTES).toString('base64url');
}

function sendError(reply: FastifyReply, code: ErrorCode, message: string): FastifyReply {
  return reply.code(httpStatusOf(code)).type('application/json').send({ error: { code, message } });
}

/** Resolves when `w` drained, or rejects when it closed or failed first. */
async function drained(w: Writable | ServerResponse): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const done = (err?: Error): void => {
      w.off('drain', onDrain);
      w.off('close', onClose);
      w.off('error', onError);
      if (err) reject(err);
      else resolve();
    };
    const onDrain = (): void => done();
    const onClose = (): void => done(new Error('stream closed before it drained'));
    const onError = (e: Error): void => done(e);
    w.on('drain', onDrain);
    w.on('close', onClose);
    w.on('error', onError);
  });
}

async function endWritable(w: Writable): Promise<void> {
  if (w.writableFinished) return;
  const finished = Promise.race([
    once(w, 'finish').then(() => undefined),
    once(w, 'close').then(() => {
      if (!w.writableFinished) throw new Error('stdout closed before it finished');
    }),
  ]);
  w.end();
  await finished;
}

export class PipeServer {
  readonly #clock: Clock;
  readonly #ttlMs: number;
  readonly #pipes = new Map<string, Entry>();
  #port: number | null = null;

  constructor(opts: { clock?: Clock; ttlMs?: number } = {}) {
    this.#clock = opts.clock ?? systemClock;
    this.#ttlMs = opts.ttlMs ?? DEFAULT_PIPE_TTL_MS;
  }

  /** The port the fylr process listens on (call after listen). */
  setPort(port: number): void {
    this.#port = port;
  }

  get port(): number | null {
    return this.#port;
  }

  /** Open and used-but-remembered pipes. */
  get size(): number {
    return this.#pipes.size;
  }

  /** An in-pipe: its one GET streams `stdin` (an empty body when undefined). */
  createIn(stdin: Readable | undefined, opts: { ttlMs?: number } = {}): Pipe<PipeInResult> {
    return this.#create('in', stdin, undefined, opts.ttlMs) as Pipe<PipeInResult>;
  }

  /** An out-pipe: its one PUT is written into `stdout` (counted and dropped when undefined), which is ended on success. */
  createOut(stdout: Writable | undefined, opts: { ttlMs?: number } = {}): Pipe<PipeOutResult> {
    return this.#create('out', undefined, stdout, opts.ttlMs);
  }

  /** Forgets every pipe (a closing fylr process). Unserved pipes settle as not started. */
  close(): void {
    for (const e of [...this.#pipes.values()]) this.#forget(e);
  }

  #create(kind: PipeKind, stdin: Readable | undefined, stdout: Writable | undefined, ttlMs: number | undefined): Pipe<PipeOutResult> {
    let id = newPipeId();
    while (this.#pipes.has(id)) id = newPipeId();
    let settle!: (r: PipeOutResult) => void;
    const result = new Promise<PipeOutResult>((resolve) => (settle = resolve));
    const entry: Entry = { id, kind, state: 'open', timer: undefined, stdin, stdout, settle, settled: false, started: false };
    this.#pipes.set(id, entry);
    entry.timer = this.#clock.setTimeout(() => this.#forget(entry), ttlMs ?? this.#ttlMs);
    const server = this;
    return {
      id,
      kind,
      path: `/pipe/${id}`,
      result,
      get started() {
        return entry.started;
      },
      discard() {
        if (entry.state === 'open') server.#forget(entry);
      },
    };
  }

  /** Drop the entry; an unserved pipe settles as not started. */
  #forget(e: Entry): void {
    this.#clock.clearTimeout(e.timer);
    if (this.#pipes.get(e.id) === e) this.#pipes.delete(e.id);
    this.#settle(e, { started: e.started, ok: false, bytes: 0, error: e.started ? 'the pipe server closed' : null });
  }

  #settle(e: Entry, r: PipeOutResult): void {
    if (e.settled) return;
    e.settled = true;
    e.settle(r);
  }

  /** Marks the pipe used (the tombstone answers 410 until the ttl passes). */
  #claim(id: string, kind: PipeKind): Entry | ErrorCode {
    const e = this.#pipes.get(id);
    if (e === undefined || e.kind !== kind) return 'pipe_not_found';
    if (e.state === 'used') return 'pipe_used';
    e.state = 'used';
    e.started = true;
    this.#clock.clearTimeout(e.timer);
    e.timer = this.#clock.setTimeout(() => {
      if (this.#pipes.get(e.id) === e) this.#pipes.delete(e.id);
    }, this.#ttlMs);
    return e;
  }

  /** The fastify plugin: register it on the fylr's listener (encapsulated: it changes no other route). */
  readonly plugin: FastifyPluginAsync = async (app) => {
    // Pipe bodies are streams: no parser may buffer them, whatever their content type.
    app.removeAllContentTypeParsers();
    app.addContentTypeParser('*', (_req, _payload, done) => done(null));

    app.get<{ Params: { id: string } }>('/pipe/:id', async (req, reply) => {
      const claimed = this.#claim(req.params.id, 'in');
      if (typeof claimed === 'string') return sendError(reply, claimed, claimed === 'pipe_used' ? 'this pipe was already served' : 'no such pipe');
      reply.hijack();
      const r = await this.#serveIn(claimed, reply.raw);
      this.#settle(claimed, r);
      return reply;
    });

    app.put<{ Params: { id: string } }>('/pipe/:id', async (req, reply) => {
      const claimed = this.#claim(req.params.id, 'out');
      if (typeof claimed === 'string') {
        // Do not read a body nobody wants; the connection closes after the answer.
        reply.header('connection', 'close');
        return sendError(reply, claimed, claimed === 'pipe_used' ? 'this pipe was already served' : 'no such pipe');
      }
      const r = await this.#receiveOut(claimed, req.raw);
      this.#settle(claimed, r);
      if (!r.ok) {
        if (!req.raw.complete) {
          // The execserver is gone mid-body: there is nobody to answer.
          reply.hijack();
          reply.raw.destroy();
          return reply;
        }
        return sendError(reply, 'pipe_out_failed', r.error ?? 'stdout could not be written');
      }
      return reply.code(204).send();
    });
  };

  async #serveIn(e: Entry, res: ServerResponse): Promise<PipeInResult> {
    const src = e.stdin;
    e.stdin = undefined;
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    let bytes = 0;
    if (src === undefined) {
      res.end();
      return { started: true, ok: true, bytes, error: null };
    }
    try {
      // The chunks the source hands over in one turn leave in one write.
      const batch = batchedPerTurn(res);
      await forEachChunk<Buffer | string>(src, (chunk) => {
        const buf = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
        bytes += buf.length;
        if (res.destroyed) throw new Error('the execserver closed the stdin request');
        batch();
        return res.write(buf) ? undefined : drained(res);
      });
      await new Promise<void>((resolve, reject) => {
        res.end(() => resolve());
        res.once('close', () => (res.writableFinished ? resolve() : reject(new Error('the execserver closed the stdin request'))));
      });
      return { started: true, ok: true, bytes, error: null };
    } catch (err) {
      // The source is of no use any more; end the response as incomplete.
      if (!src.destroyed) src.destroy();
      res.destroy();
      return { started: true, ok: false, bytes, error: (err as Error).message };
    }
  }

  async #receiveOut(e: Entry, req: IncomingMessage): Promise<PipeOutResult> {
    const sink = e.stdout;
    e.stdout = undefined;
    let bytes = 0;
    try {
      await forEachChunk(req, (chunk) => {
        bytes += chunk.length;
        return sink !== undefined && !sink.write(chunk) ? drained(sink) : undefined;
      });
      if (!req.complete) throw new Error('the stdout request ended before its body was complete');
      if (sink !== undefined) await endWritable(sink);
      return { started: true, ok: true, bytes, error: null };
    } catch (err) {
      if (sink !== undefined && !sink.destroyed) sink.destroy();
      const why = req.complete ? (err as Error).message : `the execserver aborted stdout after ${bytes} bytes`;
      return { started: true, ok: false, bytes, error: why };
    }
  }
}
