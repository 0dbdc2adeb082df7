/**
 * The reference OLD execserver (PROTOCOL.md §5; seed "Problem"): the peer that old fylrs, the
 * gateway and the compatibility suite talk to. It is written as the old server behaved, flaws
 * included, and on purpose without the new ideas:
 *
 *   GET /token/{service}   reserve a slot: in-memory, single-use token, 10 s, this instance only
 *   PUT /job/{service}?job=<job JSON with "token">   redeem it and run the job (runJob)
 *   GET /healthz
 *
 * Every response says `Connection: close` (the old re-balance hack: each request opens a new
 * connection, so a balancer spreads them). There is no `/broker`: a websocket upgrade gets 404.
 * Error bodies are `{"Error": "...", "Status": N}`.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify';
import { type Clock, systemClock } from '../../src/clock.js';
import type { CommandConfig, ServeConfig } from '../../src/config/types.js';
import { type JobSpec, type Receipt, failedReceipt, isFieldProblem, okReceipt, validateJob } from '../../src/protocol/job.js';
import { runJob, type RunOptions } from '../../src/slots/job-runner.js';
import { type LegacyExecCounters, type LegacyRoute, bump, newCounters } from './legacy-counters.js';
import { requestStdin, responseStdout } from './legacy-body-io.js';
import { TokenStore } from './token-store.js';

export type { LegacyExecCounters } from './legacy-counters.js';

export interface LegacyJobEnd {
  service: string;
  waitgroup: string;
  receipt: Receipt;
}

export interface LegacyExecserver {
  /** http://host:port of the listener (the real port when config.listen.port is 0). */
  url: string;
  close(): Promise<void>;
  counters: LegacyExecCounters;
  /** Calls `listener` after each redeemed job ended and its slot was freed; returns an unsubscribe. */
  onJobEnd(listener: (e: LegacyJobEnd) => void): () => void;
}

export interface LegacyExecserverOptions {
  clock?: Clock;
  /** Request logging (pino) to stdout. Default off. */
  log?: boolean;
  /** Kill grace for stopped jobs (runJob's killGraceMs). */
  killGraceMs?: number;
}

/** The old server's limit on request headers (Go's http.DefaultMaxHeaderBytes): `?job=` can be long. */
export const LEGACY_MAX_HEADER_BYTES = 1 << 20;

export const LEGACY_ERRORS = {
  busy: 'All workers busy',
  tokenNotFound: 'Token not found',
  unknownService: (service: string) => `Unknown service ${JSON.stringify(service)}`,
  wrongService: (service: string) => `Token not valid for service ${JSON.stringify(service)}`,
} as const;

function errorBody(status: number, message: string): { Error: string; Status: number } {
  return { Error: message, Status: status };
}

function hostForUrl(host: string): string {
  const h = host.startsWith('::ffff:') ? host.slice(7) : host;
  return h.includes(':') ? `[${h}]` : h;
}

function isWildcard(host: string): boolean {
  return host === '0.0.0.0' || host === '::' || host === '';
}

/** Commands a job of this service may run: only those the service lists. */
function serviceCommands(config: ServeConfig, service: string): Record<string, CommandConfig> {
  const out: Record<string, CommandConfig> = {};
  for (const name of config.services[service]?.commands ?? []) {
    const c = config.commands[name];
    if (c !== undefined) out[name] = c;
  }
  return out;
}

export async function startLegacyExecserver(config: ServeConfig, opts: LegacyExecserverOptions = {}): Promise<LegacyExecserver> {
  const clock = opts.clock ?? systemClock;
  const counters = newCounters();
  const tokens = new TokenStore(config, clock, counters);
  const running = new Set<AbortController>();
  const jobEndListeners = new Set<(e: LegacyJobEnd) => void>();
  const jobEnded = (e: LegacyJobEnd): void => {
    for (const l of [...jobEndListeners]) l(e);
  };

  const app = Fastify({
    logger: opts.log === true,
    forceCloseConnections: true,
    requestTimeout: 0,
    // The job stream has no size limit; this only applies to bodies fastify itself would parse.
    bodyLimit: Number.MAX_SAFE_INTEGER,
    http: { maxHeaderSize: LEGACY_MAX_HEADER_BYTES },
  });

  const count = (route: LegacyRoute, status: number): void => {
    bump(counters.requests[route], status);
  };
  const fail = (reply: FastifyReply, route: LegacyRoute, status: number, message: string): FastifyReply => {
    count(route, status);
    return reply.code(status).send(errorBody(status, message));
  };

  // The re-balance hack: no connection is ever reused.
  app.addHook('onRequest', async (request, reply) => {
    reply.raw.setHeader('Connection', 'close');
    // Any body, of any (or a malformed) content type, reaches the job as a raw stream.
    if (request.method === 'PUT' && request.headers['content-type'] !== undefined) {
      request.headers['content-type'] = 'application/octet-stream';
    }
  });
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', (_request, _payload, done) => done(null, undefined));

  app.setNotFoundHandler((request, reply) => fail(reply, 'other', 404, `Not found: ${request.method} ${request.url.split('?')[0]}`));
  app.setErrorHandler((err: { statusCode?: number; message: string }, _request, reply) => {
    const status = typeof err.statusCode === 'number' && err.statusCode >= 400 ? err.statusCode : 500;
    return fail(reply, 'other', status, err.message);
  });

  app.get('/healthz', async (_request, reply) => {
    count('healthz', 200);
    return reply.code(200).send({ status: 'ok' });
  });

  app.get<{ Params: { service: string } }>('/token/:service', async (request, reply) => {
    const { service } = request.params;
    const r = tokens.issue(service);
    if (!r.ok) {
      return r.reason === 'unknown_service'
        ? fail(reply, 'token', 404, LEGACY_ERRORS.unknownService(service))
        : fail(reply, 'token', 503, LEGACY_ERRORS.busy);
    }
    const body: { token: string; service?: string } = { token: r.token };
    if (config.tokenResponseSendServerIP) {
      const addr = app.server.address() as AddressInfo;
      const own = isWildcard(addr.address) ? (request.raw.socket.localAddress ?? addr.address) : addr.address;
      body.service = `http://${hostForUrl(own)}:${addr.port}`;
    }
    count('token', 200);
    return reply.code(200).send(body);
  });

  app.put<{ Params: { service: string }; Querystring: Record<string, unknown> }>('/job/:service', async (request, reply) => {
    const { service } = request.params;
    if (!Object.hasOwn(config.services, service)) return fail(reply, 'job', 404, LEGACY_ERRORS.unknownService(service));
    const raw = request.query.job;
    if (typeof raw !== 'string' || raw === '') return fail(reply, 'job', 400, 'Missing query parameter "job"');
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw);
    } catch (e) {
      return fail(reply, 'job', 400, `Invalid job JSON: ${(e as Error).message}`);
    }
    const job = validateJob(parsed);
    if (isFieldProblem(job)) return fail(reply, 'job', 400, `Invalid job: ${job.message}`);
    if (job.token === undefined) return fail(reply, 'job', 400, LEGACY_ERRORS.tokenNotFound);
    const redeemed = tokens.redeem(job.token, service);
    if (!redeemed.ok) {
      return fail(reply, 'job', 400, redeemed.reason === 'wrong_service' ? LEGACY_ERRORS.wrongService(service) : LEGACY_ERRORS.tokenNotFound);
    }
    const slot = redeemed.slot;
    bump(counters.jobs, service);
    let ended = false;
    // The slot is free before the answer goes out: a client that got its answer may ask again at once.
    const free = (): void => tokens.release(slot);
    const end = (receipt: Receipt): void => {
      if (ended) return;
      ended = true;
      free();
      jobEnded({ service, waitgroup: slot.waitgroup, receipt });
    };
    try {
      if (job.commands.length === 0) {
        // A token given back (the gateway does this): no temp dir, no process.
        bump(counters.emptyJobs, service);
        const receipt = okReceipt(0);
        end(receipt);
        count('job', 200);
        return reply.code(200).send(receipt);
      }
      await runAndAnswer(job, service, request, reply, free, end);
      return reply;
    } finally {
      end(failedReceipt('internal', 'the request ended without a receipt'));
    }
  });

  /**
   * Runs the job and answers the PUT. The slot is freed (`free`, or `end` with the receipt) just
   * before the final answer or the last chunk of a body goes out.
   */
  async function runAndAnswer(
    job: JobSpec,
    service: string,
    request: FastifyRequest,
    reply: FastifyReply,
    free: () => void,
    end: (r: Receipt) => void,
  ): Promise<void> {
    const req: IncomingMessage = request.raw;
    const res: ServerResponse = reply.raw;
    const stdoutBody = job.commands.some((c) => c.stdout?.type === 'body');
    const stdinBody = job.commands.some((c) => c.stdin?.type === 'body');
    // A client that goes away stops its job (the old server ran it under the request's context).
    const ac = new AbortController();
    running.add(ac);
    const onClose = (): void => {
      if (!res.writableFinished) ac.abort();
    };
    res.on('close', onClose);
    const runOpts: RunOptions = {
      commands: serviceCommands(config, service),
      clock,
      signal: ac.signal,
      defaultTimeoutSec: config.default_timeout_sec,
    };
    if (opts.killGraceMs !== undefined) runOpts.killGraceMs = opts.killGraceMs;
    if (stdinBody) runOpts.stdin = requestStdin(req);
    let receipt: Receipt;
    try {
      if (!stdoutBody) {
        receipt = await runJob(job, runOpts);
        end(receipt);
        count('job', 200);
        reply.code(200).send(receipt);
        return;
      }
      // Body mode: we write the response ourselves, as a stream.
      reply.hijack();
      const sink = responseStdout(res, { onCommit: () => count('job', 200), onEnd: free });
      runOpts.stdout = sink;
      receipt = await runJob(job, runOpts);
      end(receipt);
      if (!sink.committed) {
        // A failure before the commit (or a small success that could not commit) answers with the receipt.
        const status = receipt.ok ? 200 : 500;
        if (!res.destroyed && !res.headersSent) {
          const text = JSON.stringify(receipt);
          count('job', status);
          res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(text), connection: 'close' });
          res.end(text);
        }
      } else if (!receipt.ok && !res.destroyed) {
        res.destroy();
      }
    } finally {
      res.off('close', onClose);
      running.delete(ac);
    }
  }

  await app.listen({ host: config.listen.host, port: config.listen.port });
  const addr = app.server.address() as AddressInfo;
  const url = `http://${hostForUrl(addr.address)}:${addr.port}`;

  return {
    url,
    counters,
    onJobEnd(listener) {
      jobEndListeners.add(listener);
      return () => jobEndListeners.delete(listener);
    },
    async close() {
      tokens.close();
      for (const ac of running) ac.abort();
      await app.close();
    },
  };
}
