/** Operator routes on the execserver's listener (PROTOCOL.md §7, and the admin drain of §1 rule 7). */
import type { FastifyInstance } from 'fastify';
import type { Broker } from './broker.js';
import type { ExecserverMetrics } from './metrics.js';

export interface AdminRoutesOptions {
  broker: Broker;
  metrics: ExecserverMetrics;
  /** Extra sections for /status (the gateway's backends, legacy tokens). */
  extraStatus?: () => Record<string, unknown>;
  /** `POST /drain`: start draining (rule 7); the server closes once drained. */
  drain?: () => void;
}

export async function adminRoutes(app: FastifyInstance, opts: AdminRoutesOptions): Promise<void> {
  const { broker, metrics } = opts;
  app.get('/healthz', async () => ({ ok: true }));
  app.get('/readyz', async (_req, reply) => {
    if (broker.draining) return reply.code(503).send({ ready: false, draining: true });
    return { ready: true };
  });
  app.get('/status', async () => ({ ...broker.status(), ...(opts.extraStatus?.() ?? {}) }));
  app.get('/metrics', async (_req, reply) => {
    reply.type(metrics.registry.contentType);
    return metrics.registry.metrics();
  });
  app.get<{ Params: { jobId: string } }>('/queue/:jobId', async (req, reply) => {
    const pos = broker.positionAnywhere(req.params.jobId);
    if (!pos) return reply.code(404).send({ error: { code: 'unknown_job', message: 'no want, offer or running job with this job_id' } });
    return pos;
  });
  const drain = opts.drain;
  if (drain) {
    app.post('/drain', async (_req, reply) => {
      drain();
      return reply.code(202).send({ draining: true });
    });
  }
}
