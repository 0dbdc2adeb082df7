/**
 * The legacy HTTP API (PROTOCOL.md §5) on a gateway, for old fylrs pointed at it:
 *
 *   GET /token/{svc}   404 unknown service · 503 + Retry-After: 1 while broker wants of its
 *                      waitgroup are parked (or the gateway drains) · else each backend offering
 *                      it in turn until one grants: its token goes out sealed in a gateway token
 *                      (gateway-token.ts) that names the backend; a `service` URL in the answer
 *                      becomes `gateway.advertised_url` (or is left out without one). 503 only
 *                      when every backend is busy.
 *   PUT /job/{svc}     the gateway token is opened (a forged or tampered one, or one of another
 *                      service: 400 "Token not found", no backend contacted), the job re-encoded
 *                      with the backend's own token, and the request streamed both ways through
 *                      http-proxy to that backend (or the replica that issued the token).
 *   GET|HEAD /job/{svc}  a probe: passed through to the first backend offering the service, so
 *                      an old fylr sees what its old execserver would answer.
 *   GET /healthz       the admin route's 200.
 *
 * Whatever a job or a header says, the only addresses are the configured backends and the
 * replicas their own token answers named (replica-url.ts).
 */
import type { FastifyInstance, FastifyPluginAsync } from 'fastify';
import type { ServerResponse } from 'node:http';
import type { ServeConfig } from '../config/types.js';
import type { Broker } from '../execserver/broker.js';
import { ALL_WORKERS_BUSY, legacyError, TOKEN_NOT_FOUND, unknownServiceText } from '../execserver/legacy-body.js';
import { legacyPutPrelude } from '../execserver/legacy-put-prelude.js';
import type { ExecserverMetrics } from '../execserver/metrics.js';
import type { Backend } from './backend.js';
import { jobPath } from './backend-client.js';
import type { GatewaySlotSource } from './gateway-slot-source.js';
import type { GatewayTokens } from './gateway-token.js';
import type { LegacyProxy } from './proxy.js';
import { acceptServiceUrl } from './replica-url.js';

export interface GatewayLegacyApiOptions {
  config: ServeConfig;
  broker: Broker;
  metrics: ExecserverMetrics;
  source: GatewaySlotSource;
  tokens: GatewayTokens;
  proxy: LegacyProxy;
}

function rawLegacyError(res: ServerResponse, status: number, error: string): void {
  const text = JSON.stringify({ Error: error, Status: status });
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), connection: 'close' });
  res.end(text);
}

export function gatewayLegacyApi(opts: GatewayLegacyApiOptions): FastifyPluginAsync {
  const { config, broker, metrics, source, tokens, proxy } = opts;
  const urls = source.backends.map((b) => b.url);
  let cursor = 0;

  /** The backends with slots in the waitgroup, starting with the next one in turn. */
  const candidates = (waitgroup: string): Backend[] => {
    const all = source.backends.filter((b) => b.processes(waitgroup) > 0);
    if (all.length === 0) return all;
    const start = cursor++ % all.length;
    return [...all.slice(start), ...all.slice(0, start)];
  };

  const gated = (waitgroup: string): boolean => broker.draining || broker.hasParked(waitgroup);

  return async (app: FastifyInstance) => {
    app.addHook('onClose', async () => proxy.close());

    app.get<{ Params: { service: string } }>('/token/:service', async (req, reply) => {
      const service = req.params.service;
      const waitgroup = broker.waitgroupOf(service);
      if (waitgroup === undefined) {
        metrics.legacyTokens.inc({ service: '(unknown)', status: '404' });
        return legacyError(reply, 404, unknownServiceText(service));
      }
      const busy = () => {
        metrics.legacyTokens.inc({ service, status: '503' });
        return legacyError(reply, 503, ALL_WORKERS_BUSY, { 'retry-after': '1' });
      };
      if (gated(waitgroup)) return busy();
      for (const b of candidates(waitgroup)) {
        const askedAt = broker.clock.now();
        let answer;
        try {
          answer = await b.client.getToken(service);
        } catch (e) {
          b.lastError = (e as Error).message;
          continue;
        }
        if (answer.kind === 'busy') continue;
        const target = answer.serviceUrl === null ? b.url : acceptServiceUrl(answer.serviceUrl, b.url, urls);
        if (target === null) {
          b.lastError = `token response named ${JSON.stringify(answer.serviceUrl)}, which the gateway does not address (docs/gateway.md)`;
          continue;
        }
        b.sawReplica(target);
        if (gated(waitgroup)) {
          // A broker want parked while we asked: the slot is theirs (the broker offers it or the
          // source gives it back), the old fylr retries.
          source.adoptToken({ backend: b, waitgroup, service, token: answer.token, target, askedAt });
          return busy();
        }
        const sealed = tokens.seal({ backend: b.url, service, token: answer.token, ...(target !== b.url ? { target } : {}) });
        metrics.legacyTokens.inc({ service, status: '200' });
        const body: { token: string; service?: string } = { token: sealed };
        if (answer.serviceUrl !== null && config.gateway.advertised_url !== null) body.service = config.gateway.advertised_url;
        return reply.send(body);
      }
      return busy();
    });

    app.route<{ Params: { service: string } }>({
      method: ['GET', 'HEAD'],
      url: '/job/:service',
      exposeHeadRoute: false,
      handler: async (req, reply) => {
        const service = req.params.service;
        const waitgroup = broker.waitgroupOf(service);
        const b = waitgroup === undefined ? undefined : source.backends.find((x) => x.processes(waitgroup) > 0);
        if (b === undefined) return legacyError(reply, 404, unknownServiceText(service));
        reply.hijack();
        await proxy.forward(req.raw, reply.raw, b.url, `/job/${encodeURIComponent(service)}`, (err) => {
          rawLegacyError(reply.raw, 502, `backend ${b.url} unavailable: ${(err as NodeJS.ErrnoException).code ?? err.message}`);
        });
      },
    });

    app.put<{ Params: { service: string }; Querystring: Record<string, unknown> }>('/job/:service', async (req, reply) => {
      const put = legacyPutPrelude(req, reply, broker, metrics);
      if (!put) return reply;
      const { service, waitgroup, count } = put;
      const claims = tokens.open(put.job.token);
      const b = claims === null || claims.service !== service ? undefined : source.backendByUrl(claims.backend);
      const base = b === undefined || claims === null ? null : claims.target === undefined ? b.url : acceptServiceUrl(claims.target, b.url, urls);
      if (b === undefined || base === null || claims === null) {
        count(400);
        return legacyError(reply, 400, TOKEN_NOT_FOUND);
      }
      const job = { ...put.job, token: claims.token };
      reply.hijack();
      const outcome = await proxy.forward(req.raw, reply.raw, base, jobPath(service, job), (err) => {
        rawLegacyError(reply.raw, 502, `backend ${base} unavailable: ${(err as NodeJS.ErrnoException).code ?? err.message}`);
      });
      count(outcome.status ?? 502);
      source.legacyJobEnded(b, waitgroup);
    });
  };
}
