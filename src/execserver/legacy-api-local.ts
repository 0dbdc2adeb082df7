/**
 * The legacy HTTP API (PROTOCOL.md §5) on a native execserver, for old fylrs. Legacy tokens and
 * broker offers draw on the same SlotSource, so a slot is never handed out twice; `GET /token`
 * answers 503 (Retry-After: 1) while broker wants are parked in the service's waitgroup (or the
 * server drains), so old clients cannot take slots from parked jobs.
 *
 *   GET /token/{svc}  --slot reserved-->  token (10 s)  --PUT /job/{svc}?job={..token..}-->  run
 *                                              \--lapses--> slot released (to parked wants)
 */
import type { Socket } from 'node:net';
import type { FastifyInstance } from 'fastify';
import type { ServeConfig } from '../config/types.js';
import { usesBody } from '../protocol/job.js';
import type { Broker } from './broker.js';
import { ALL_WORKERS_BUSY, legacyError, TOKEN_NOT_FOUND, unknownServiceText } from './legacy-body.js';
import { requestStdin, responseStdout, sendReceipt } from './legacy-job-io.js';
import { legacyPutPrelude } from './legacy-put-prelude.js';
import type { LegacyTokens } from './legacy-tokens.js';
import type { ExecserverMetrics } from './metrics.js';

export interface LocalLegacyApiOptions {
  broker: Broker;
  tokens: LegacyTokens;
  metrics: ExecserverMetrics;
  /** For `tokenResponseSendServerIP`. */
  config?: Pick<ServeConfig, 'tokenResponseSendServerIP'>;
}

/** `http://<own ip>:<port>` of the connection the request came in on (tokenResponseSendServerIP). */
export function ownServiceUrl(socket: Socket): string {
  let host = socket.localAddress ?? '127.0.0.1';
  if (host.startsWith('::ffff:')) host = host.slice('::ffff:'.length);
  if (host.includes(':')) host = `[${host}]`;
  return `http://${host}:${socket.localPort ?? 0}`;
}

export async function localLegacyApi(app: FastifyInstance, opts: LocalLegacyApiOptions): Promise<void> {
  const { broker, tokens, metrics } = opts;
  const sendServerIp = opts.config?.tokenResponseSendServerIP === true;

  app.get<{ Params: { service: string } }>('/token/:service', async (req, reply) => {
    const service = req.params.service;
    const waitgroup = broker.waitgroupOf(service);
    if (waitgroup === undefined) {
      metrics.legacyTokens.inc({ service: '(unknown)', status: '404' });
      return legacyError(reply, 404, unknownServiceText(service));
    }
    const slot = broker.draining || broker.hasParked(waitgroup) ? null : broker.source.tryReserve(waitgroup, service);
    if (!slot) {
      metrics.legacyTokens.inc({ service, status: '503' });
      return legacyError(reply, 503, ALL_WORKERS_BUSY, { 'retry-after': '1' });
    }
    metrics.legacyTokens.inc({ service, status: '200' });
    const token = tokens.issue(service, slot);
    return reply.send(sendServerIp ? { token, service: ownServiceUrl(req.socket) } : { token });
  });

  app.put<{ Params: { service: string }; Querystring: Record<string, unknown> }>('/job/:service', async (req, reply) => {
    const put = legacyPutPrelude(req, reply, broker, metrics);
    if (!put) return reply;
    const { service, count } = put;
    const slot = tokens.redeem(put.job.token, service);
    if (!slot) {
      count(400);
      return legacyError(reply, 400, TOKEN_NOT_FOUND);
    }
    const job = { ...put.job };
    delete job.token;
    const body = usesBody(job);
    const abort = new AbortController();
    // An old client that hangs up mid-job stops it, as a broker connection close would: nobody
    // is left to read its answer. The slot frees once the process has ended.
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) abort.abort(new Error('client went away'));
    });
    reply.hijack();
    const stdout = body.stdout ? responseStdout(reply.raw) : undefined;
    if (!body.stdin) req.raw.resume();
    const io = { signal: abort.signal, ...(body.stdin ? { stdin: requestStdin(req.raw) } : {}), ...(stdout ? { stdout } : {}) };
    const receipt = await broker.source.run(slot, job, io);
    broker.recordRun(service, receipt);
    if (stdout?.committed) {
      // The status line went out with the first byte of stdout; a failure after it cut the body.
      count(receipt.ok ? 200 : 500);
      if (!receipt.ok && !reply.raw.destroyed) reply.raw.destroy();
      return;
    }
    const status = body.stdout && !receipt.ok ? 500 : 200;
    count(status);
    if (!reply.raw.destroyed) sendReceipt(reply.raw, receipt, body.stdout);
  });
}
