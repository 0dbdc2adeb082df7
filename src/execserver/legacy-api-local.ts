/**
 * The legacy HTTP API (PROTOCOL.md §5) on a native execserver, for old fylrs. Legacy tokens and
 * broker offers draw on the same SlotSource, so a slot is never handed out twice; `GET /token`
 * answers 503 (Retry-After: 1) while broker wants are parked in the service's waitgroup, so old
 * clients cannot take slots from parked jobs.
 */
import type { FastifyInstance } from 'fastify';
import { usesBody } from '../protocol/job.js';
import type { Broker } from './broker.js';
import { ALL_WORKERS_BUSY, legacyError, TOKEN_NOT_FOUND, unknownServiceText } from './legacy-body.js';
import { requestStdin, responseStdout, sendReceipt } from './legacy-job-io.js';
import { parseLegacyJobQuery } from './legacy-job-query.js';
import type { LegacyTokens } from './legacy-tokens.js';
import type { ExecserverMetrics } from './metrics.js';

export interface LocalLegacyApiOptions {
  broker: Broker;
  tokens: LegacyTokens;
  metrics: ExecserverMetrics;
}

export async function localLegacyApi(app: FastifyInstance, opts: LocalLegacyApiOptions): Promise<void> {
  const { broker, tokens, metrics } = opts;

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
    return reply.send({ token: tokens.issue(service, slot) });
  });

  app.put<{ Params: { service: string }; Querystring: Record<string, unknown> }>('/job/:service', async (req, reply) => {
    const service = req.params.service;
    const count = (status: number) => metrics.legacyJobs.inc({ service: broker.waitgroupOf(service) ? service : '(unknown)', status: String(status) });
    if (broker.waitgroupOf(service) === undefined) {
      count(404);
      return legacyError(reply, 404, unknownServiceText(service));
    }
    const parsed = parseLegacyJobQuery(req.query, service);
    if ('error' in parsed) {
      count(400);
      return legacyError(reply, 400, parsed.error);
    }
    const slot = tokens.redeem(parsed.job.token, service);
    if (!slot) {
      count(400);
      return legacyError(reply, 400, TOKEN_NOT_FOUND);
    }
    const job = { ...parsed.job };
    delete job.token;
    const body = usesBody(job);
    const abort = new AbortController();
    // An old client that hangs up mid-job stops it, as a broker connection close would.
    reply.raw.on('close', () => {
      if (!reply.raw.writableFinished) abort.abort(new Error('client went away'));
    });
    reply.hijack();
    const stdout = body.stdout ? responseStdout(reply.raw) : undefined;
    if (!body.stdin) req.raw.resume();
    const io = { signal: abort.signal, ...(body.stdin ? { stdin: requestStdin(req.raw) } : {}), ...(stdout ? { stdout } : {}) };
    const receipt = await broker.source.run(slot, job, io);
    broker.stats.record(service, receipt.duration_ms);
    if (stdout?.committed) {
      count(receipt.ok ? 200 : 500);
      return;
    }
    const status = body.stdout && !receipt.ok ? 500 : 200;
    count(status);
    sendReceipt(reply.raw, receipt, body.stdout);
  });
}
