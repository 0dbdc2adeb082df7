/**
 * The body stdout of a job and its commit rule (PROTOCOL.md §2, §5):
 *
 *   buffering (<= STDOUT_COMMIT_BYTES held) --more arrives--> committing --> streaming --> ended
 *        |                                                         \             \        /
 *        +-- finish(): commit, write the buffer, end                +------------+------+--> aborted
 *        +-- fail(): nothing is ever committed                           (fail() after the commit)
 *
 * A small failing output therefore never reaches the peer as an empty or partial success; it
 * travels in the receipt's `stdout_prefix` instead. Writes wait for the sink's stream to drain,
 * so backpressure reaches the command's stdout pipe. Every wait (commit, drain, `accepted`) ends
 * at once when the job fails or the sink breaks, so a peer that stops answering cannot hold a
 * job past its timeout.
 */
import type { Writable } from 'node:stream';
import { batchedPerTurn } from '../batched-per-turn.js';
import { SlotgateError } from '../errors.js';
import { STDOUT_COMMIT_BYTES } from '../protocol/job.js';

export interface StdoutSink {
  /**
   * Called at most once: when body stdout outgrows STDOUT_COMMIT_BYTES or when the job succeeds
   * with no more than that. Returns the stream to write into and a promise that settles when the
   * peer has accepted the whole stream (e.g. the PUT's response).
   */
  commit(): Promise<{ stream: Writable; accepted: Promise<void> }>;
  /** Called instead of a clean end when the job fails after commit: the peer must see an incomplete body. */
  abort(error: Error): void;
}

type State = 'buffering' | 'committing' | 'streaming' | 'ended' | 'aborted';

function pipeOutFailed(what: string, cause: unknown): SlotgateError {
  if (cause instanceof SlotgateError) return cause;
  const msg = (cause as Error | undefined)?.message ?? String(cause);
  return new SlotgateError('pipe_out_failed', `${what}: ${msg}`, { cause });
}

export class BodyOutput {
  readonly #sink: StdoutSink | undefined;
  readonly #onBroken: (err: SlotgateError) => void;
  #state: State = 'buffering';
  #commitCalled = false;
  #buffer: Buffer[] = [];
  #buffered = 0;
  #stream: Writable | null = null;
  /** Chunks written in one turn leave the sink's stream in one write (batched-per-turn.ts). */
  #batch: (() => void) | null = null;
  #accepted: Promise<void> | null = null;
  /** Why every further wait must end: the sink broke, or the job failed. */
  #stopped: SlotgateError | null = null;
  #abortReason: Error | null = null;
  #waiters = new Set<(err: SlotgateError) => void>();

  /** `onBroken` hears of a sink that fails on its own (not through fail()). */
  constructor(sink: StdoutSink | undefined, onBroken: (err: SlotgateError) => void) {
    this.#sink = sink;
    this.#onBroken = onBroken;
  }

  /** commit() was called on the sink. */
  get committed(): boolean {
    return this.#commitCalled;
  }

  /**
   * Takes the chunk. Returns nothing when it was taken at once (buffered, or written without
   * filling the sink's stream), else a promise that settles once it was: a caller that writes
   * the next chunk only then keeps the order and the backpressure, and pays for no promise per
   * chunk while the sink keeps up.
   */
  write(chunk: Buffer): Promise<void> | undefined {
    if (this.#sink === undefined) return undefined;
    switch (this.#state) {
      case 'buffering':
        this.#buffer.push(Buffer.from(chunk));
        this.#buffered += chunk.length;
        return this.#buffered > STDOUT_COMMIT_BYTES ? this.#commitAndFlush() : undefined;
      case 'streaming':
        return this.#writeToStream(chunk);
      case 'committing':
        // Every caller waits for a returned promise, so a commit in flight is never overtaken.
        return Promise.reject(new SlotgateError('internal', 'body write while the commit is in flight'));
      case 'ended':
      case 'aborted':
        return Promise.reject(this.#stopped ?? new SlotgateError('pipe_out_failed', 'stdout stream already closed'));
    }
  }

  /** The job succeeded: commit if not done yet, flush, end, and wait for the peer to accept. */
  async finish(): Promise<void> {
    if (this.#sink === undefined) return;
    if (this.#state === 'buffering') await this.#commitAndFlush();
    if (this.#state !== 'streaming' || this.#stream === null || this.#accepted === null) {
      throw this.#stopped ?? new SlotgateError('pipe_out_failed', 'stdout stream closed before the end');
    }
    this.#state = 'ended';
    this.#stream.end();
    await this.#orStop(this.#accepted).catch((e: unknown) => {
      throw pipeOutFailed('stdout was not accepted', e);
    });
  }

  /** The job failed: a committed stream is aborted; an uncommitted one is never committed. */
  fail(error: Error): void {
    if (this.#sink === undefined || this.#state === 'aborted') return;
    const prev = this.#state;
    this.#state = 'aborted';
    this.#abortReason = error;
    this.#stop(error instanceof SlotgateError ? error : new SlotgateError('pipe_out_failed', error.message));
    // 'committing': the commit in flight is aborted when it resolves (see #commitAndFlush).
    if (prev === 'streaming' || prev === 'ended') this.#abortSink(error);
  }

  #abortSink(error: Error): void {
    try {
      this.#sink?.abort(error);
    } catch {
      // A sink's abort must not turn into an exception of the job.
    }
  }

  async #commitAndFlush(): Promise<void> {
    const sink = this.#sink as StdoutSink;
    this.#state = 'committing';
    this.#commitCalled = true;
    const pending = sink.commit();
    let committed: Awaited<typeof pending>;
    try {
      committed = await this.#orStop(pending);
    } catch (e) {
      // A commit that resolves after we gave up on it is aborted at once.
      pending.then(
        (late) => {
          late.accepted.catch(() => {});
          this.#abortSink(this.#abortReason ?? new Error('job ended during the stdout commit'));
        },
        () => {},
      );
      const err = pipeOutFailed('stdout commit failed', e);
      this.#break(err);
      throw err;
    }
    const { stream, accepted } = committed;
    this.#stream = stream;
    this.#batch = batchedPerTurn(stream);
    this.#accepted = accepted;
    accepted.catch((e: unknown) => this.#break(pipeOutFailed('stdout was not accepted', e)));
    stream.on('error', (e) => this.#break(pipeOutFailed('stdout stream failed', e)));
    stream.on('close', () => {
      if (!stream.writableFinished) this.#break(new SlotgateError('pipe_out_failed', 'stdout stream closed before the end'));
    });
    if (this.#state !== 'committing') {
      this.#abortSink(this.#abortReason ?? new Error('job failed'));
      throw this.#stopped ?? new SlotgateError('pipe_out_failed', 'job failed during the stdout commit');
    }
    this.#state = 'streaming';
    const held = this.#buffer;
    this.#buffer = [];
    this.#buffered = 0;
    for (const chunk of held) await this.#writeToStream(chunk);
  }

  #writeToStream(chunk: Buffer): Promise<void> | undefined {
    if (this.#stopped !== null) return Promise.reject(this.#stopped);
    const stream = this.#stream as Writable;
    (this.#batch as () => void)();
    if (stream.write(chunk)) return undefined;
    return this.#orStop(
      new Promise<void>((resolve) => {
        stream.once('drain', resolve);
      }),
    );
  }

  /** `p`, unless the sink breaks or the job fails first. */
  #orStop<T>(p: Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (this.#stopped !== null) {
        reject(this.#stopped);
        return;
      }
      const onStop = (err: SlotgateError): void => reject(err);
      this.#waiters.add(onStop);
      p.then(
        (v) => {
          this.#waiters.delete(onStop);
          resolve(v);
        },
        (e: unknown) => {
          this.#waiters.delete(onStop);
          reject(e);
        },
      );
    });
  }

  #stop(err: SlotgateError): void {
    if (this.#stopped !== null) return;
    this.#stopped = err;
    const waiters = [...this.#waiters];
    this.#waiters.clear();
    for (const w of waiters) w(err);
  }

  /** The sink failed on its own. */
  #break(err: SlotgateError): void {
    const news = this.#stopped === null && this.#state !== 'aborted';
    this.#stop(err);
    if (news) this.#onBroken(err);
  }
}
