/**
 * The first steps of every legacy `PUT /job/{service}` on the new side (native execserver and
 * gateway alike): the service must be known and `?job=` must parse; each answer is counted.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { JobSpec } from '../protocol/job.js';
import type { Broker } from './broker.js';
import { legacyError, unknownServiceText } from './legacy-body.js';
import { parseLegacyJobQuery } from './legacy-job-query.js';
import type { ExecserverMetrics } from './metrics.js';

export interface LegacyPut {
  service: string;
  waitgroup: string;
  job: JobSpec;
  /** Counts the final answer of this PUT. */
  count(status: number | string): void;
}

type PutRequest = FastifyRequest<{ Params: { service: string }; Querystring: Record<string, unknown> }>;

/** The parsed PUT, or undefined once the refusal has been answered. */
export function legacyPutPrelude(req: PutRequest, reply: FastifyReply, broker: Broker, metrics: ExecserverMetrics): LegacyPut | undefined {
  const service = req.params.service;
  const waitgroup = broker.waitgroupOf(service);
  const count = (status: number | string): void => {
    metrics.legacyJobs.inc({ service: waitgroup === undefined ? '(unknown)' : service, status: String(status) });
  };
  if (waitgroup === undefined) {
    count(404);
    void legacyError(reply, 404, unknownServiceText(service));
    return undefined;
  }
  const parsed = parseLegacyJobQuery(req.query, service);
  if ('error' in parsed) {
    count(400);
    void legacyError(reply, 400, parsed.error);
    return undefined;
  }
  return { service, waitgroup, job: parsed.job, count };
}
