/**
 * A slot won by an OFFER on one broker connection.
 *
 *   offered --run(): JOB--> sent --DONE--> (join the out-pipe) --> over
 *      |                      |--connection closed--> over (stopped)
 *      |                      `--ERROR no_offer / invalid_field for the JOB--> over (no_slot / invalid_job)
 *      `--release(): DECLINE / ERROR offer_expired / expires_ms passed / connection closed--> over (run(): no_slot)
 *
 * Pipes (PROTOCOL.md §2) are created at run() time for the commands that read stdin or write
 * stdout as a body, with URLs on the connection's local address (or callbackBackendOwnURL).
 * The receipt joins DONE with what the out-pipe received: an out-pipe PUT that broke off makes
 * the job failed (pipe_out_failed) even when DONE says ok. Unused pipes are discarded at the end.
 */
import type { Clock, TimerHandle } from '../clock.js';
import { type JobSpec, failedReceipt, type Receipt, usesBody } from '../protocol/job.js';
import type { BrokerLink } from './broker-link.js';
import { noSlotReceipt, type RunIo, type SlotLease, stoppedReceipt } from './lease.js';
import type { Pipe, PipeInResult, PipeOutResult, PipeServer } from './pipe-server.js';
import { pipeBaseUrl } from './pipe-url.js';

/** After DONE, how long a PUT still in progress may take to settle before it counts as failed. */
export const PIPE_JOIN_TIMEOUT_MS = 30_000;
/** Unused pipes of a job without timeout_sec are forgotten after this long. */
const PIPE_TTL_NO_TIMEOUT_MS = 24 * 3600_000;

export interface BrokerLeaseContext {
  clock: Clock;
  pipes: PipeServer | undefined;
  ownUrl: string | null;
  /** Called once when the lease is over. */
  finished(lease: BrokerLease): void;
}

type State = 'offered' | 'sent' | 'over';

export class BrokerLease implements SlotLease {
  readonly transport = 'broker' as const;
  readonly address: string;
  readonly link: BrokerLink;
  readonly jobId: string;
  readonly service: string;
  readonly token: string;
  readonly offeredAt: number;
  readonly expiresMs: number;
  readonly #ctx: BrokerLeaseContext;
  #state: State = 'offered';
  #voidReason = '';
  #run: Promise<Receipt> | undefined;
  #resolve: ((r: Receipt) => void) | undefined;
  #in: Pipe<PipeInResult> | undefined;
  #out: Pipe<PipeOutResult> | undefined;
  #io: RunIo = {};
  #reported = false;

  constructor(link: BrokerLink, offer: { job_id: string; token: string; expires_ms: number }, service: string, ctx: BrokerLeaseContext) {
    this.link = link;
    this.address = link.address;
    this.jobId = offer.job_id;
    this.token = offer.token;
    this.expiresMs = offer.expires_ms;
    this.service = service;
    this.#ctx = ctx;
    this.offeredAt = ctx.clock.now();
  }

  get state(): State {
    return this.#state;
  }

  run(job: JobSpec, io: RunIo = {}): Promise<Receipt> {
    this.#run ??= this.#start(job, io);
    return this.#run;
  }

  #start(job: JobSpec, io: RunIo): Promise<Receipt> {
    if (this.#state !== 'offered') return Promise.resolve(noSlotReceipt(this.#voidReason || 'the slot was released before run()'));
    if (this.#ctx.clock.now() - this.offeredAt >= this.expiresMs) {
      this.#void(`the offer lapsed after ${this.expiresMs} ms before run() (call run() at once after acquire)`);
      return Promise.resolve(noSlotReceipt(this.#voidReason));
    }
    if (job.service !== this.service) {
      this.release();
      return Promise.resolve(failedReceipt('invalid_job', `job.service ${JSON.stringify(job.service)} is not the acquired service ${JSON.stringify(this.service)}`));
    }
    const { token: _token, pipes: _pipes, ...frameJob } = job;
    const wire: JobSpec = frameJob;
    const body = usesBody(job);
    if (body.stdin || body.stdout) {
      const pipes = this.#ctx.pipes;
      const base = pipes ? pipeBaseUrl(this.link.localAddress, pipes.port, this.#ctx.ownUrl) : null;
      if (pipes === undefined || base === null) {
        this.release();
        return Promise.resolve(failedReceipt('internal', 'a body-mode job needs a pipe server with a known port (ExecClient opts.pipes, PipeServer.setPort)'));
      }
      const ttlMs = job.timeout_sec !== undefined ? job.timeout_sec * 1000 + 60_000 : PIPE_TTL_NO_TIMEOUT_MS;
      wire.pipes = {};
      if (body.stdin) {
        this.#in = pipes.createIn(io.stdin, { ttlMs });
        wire.pipes.in = base + this.#in.path;
      }
      if (body.stdout) {
        this.#out = pipes.createOut(io.stdout, { ttlMs });
        wire.pipes.out = base + this.#out.path;
      }
    }
    this.#io = io;
    const result = new Promise<Receipt>((resolve) => (this.#resolve = resolve));
    if (!this.link.send({ type: 'JOB', job_id: this.jobId, token: this.token, job: wire })) {
      this.#void('the broker connection closed before JOB');
      this.#finish(noSlotReceipt(this.#voidReason));
      return result;
    }
    this.#state = 'sent';
    return result;
  }

  cancel(): void {
    if (this.#state === 'offered') return this.release();
    if (this.#state === 'sent') this.link.send({ type: 'CANCEL', job_id: this.jobId });
  }

  release(): void {
    if (this.#state !== 'offered') return;
    this.link.send({ type: 'DECLINE', job_id: this.jobId, token: this.token });
    this.#void('the slot was released');
  }

  // ---------------------------------------------------------------- from the client

  /** DONE for this job on this link. */
  done(receipt: Receipt): void {
    if (this.#state !== 'sent') return;
    this.#state = 'over';
    void this.#join(receipt).then((r) => this.#finish(r));
  }

  /** An ERROR frame naming this job on this link. */
  refused(code: string, message: string): void {
    if (this.#state === 'offered') {
      if (code === 'offer_expired') this.#void(`the offer expired: ${message}`);
      return;
    }
    if (this.#state !== 'sent') return;
    // Only the JOB can be refused now (a DONE always follows an accepted one).
    if (code !== 'no_offer' && code !== 'invalid_field' && code !== 'unknown_service' && code !== 'draining') return;
    this.#state = 'over';
    this.#discardPipes();
    this.#io.stdout?.destroy();
    this.#finish(code === 'invalid_field' ? failedReceipt('invalid_job', `the execserver refused the job: ${message}`) : noSlotReceipt(`the execserver refused the JOB (${code}): ${message}`));
  }

  /** The link closed. */
  linkLost(reason: string): void {
    if (this.#state === 'offered') return this.#void(`the broker connection closed (${reason})`);
    if (this.#state !== 'sent') return;
    this.#state = 'over';
    this.#discardPipes();
    if (this.#out?.started !== true) this.#io.stdout?.destroy();
    this.#finish(stoppedReceipt(`the broker connection closed before DONE (${reason}); the execserver stopped the job`));
  }

  // ---------------------------------------------------------------- internals

  #void(reason: string): void {
    if (this.#state === 'over') return;
    this.#state = 'over';
    this.#voidReason = reason;
    this.#report();
  }

  #report(): void {
    if (this.#reported) return;
    this.#reported = true;
    this.#ctx.finished(this);
  }

  #finish(receipt: Receipt): void {
    const resolve = this.#resolve;
    this.#resolve = undefined;
    this.#report();
    resolve?.(receipt);
  }

  #discardPipes(): void {
    if (this.#in?.started === false) this.#in.discard();
    if (this.#out?.started === false) this.#out.discard();
  }

  async #join(receipt: Receipt): Promise<Receipt> {
    if (this.#in?.started === false) this.#in.discard();
    const out = this.#out;
    if (out === undefined) return receipt;
    if (!out.started) {
      out.discard();
      const stdout = this.#io.stdout;
      if (stdout !== undefined) {
        // An execserver that never committed the stream: a failure destroys stdout; a success
        // (a peer that kept small output in the receipt) delivers the prefix.
        if (receipt.ok) stdout.end(receipt.stdout_prefix);
        else stdout.destroy();
      }
      return receipt;
    }
    const r = await this.#settleWithin(out.result, PIPE_JOIN_TIMEOUT_MS);
    if (r === null) {
      this.#io.stdout?.destroy();
      return receipt.ok ? { ...receipt, ok: false, error: { code: 'pipe_out_failed', message: `the stdout pipe did not complete within ${PIPE_JOIN_TIMEOUT_MS} ms of DONE` } } : receipt;
    }
    if (!r.ok && receipt.ok) {
      return { ...receipt, ok: false, error: { code: 'pipe_out_failed', message: `DONE said ok, but the stdout pipe failed: ${r.error ?? 'incomplete'} (${r.bytes} bytes arrived)` } };
    }
    return receipt;
  }

  #settleWithin<T>(p: Promise<T>, ms: number): Promise<T | null> {
    let timer: TimerHandle | undefined;
    return Promise.race([
      p.finally(() => this.#ctx.clock.clearTimeout(timer)),
      new Promise<null>((resolve) => {
        timer = this.#ctx.clock.setTimeout(() => resolve(null), ms);
      }),
    ]);
  }
}
