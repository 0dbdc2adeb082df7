/**
 * The operator/test API on every fylr listener, old and new (PROTOCOL.md §7):
 *
 *   POST /items      {"action": "<service>", "priority": 0, "job": {...}}  -> 201 {"id": N}
 *   GET  /items/:id  -> {"id", "state", "attempts", "receipt"}
 *
 * Items live in the shared database, so any fylr of that database answers for any item. Errors
 * answer `{"error": {"code", "message", "field"?}}` with a code of src/errors.ts.
 */
import type { FastifyError, FastifyPluginAsync, FastifyReply } from 'fastify';
import type pg from 'pg';
import { type ErrorCode, httpStatusOf } from '../errors.js';
import { enqueue, getItem } from '../db/file-queue-store.js';
import { FieldProblem, isFieldProblem, isPlainObject, type JobSpec, LIMITS, validateJob } from '../protocol/job.js';

export interface ItemsRoutesOptions {
  pool: pg.Pool;
}

export interface ItemRequest {
  action: string;
  priority: number;
  job: JobSpec;
}

/** Postgres `integer`. */
const PRIORITY_MIN = -(2 ** 31);
const PRIORITY_MAX = 2 ** 31 - 1;

/**
 * Validates a `POST /items` body. The job is the job JSON of §3 without `token` or `pipes` (the
 * transport adds those); `job.service` defaults to `action` and, when given, must equal it.
 */
export function parseItemRequest(body: unknown): ItemRequest | FieldProblem {
  if (!isPlainObject(body)) return new FieldProblem('(body)', 'the body must be a JSON object');
  const { action } = body;
  if (typeof action !== 'string' || action.length === 0) return new FieldProblem('action', 'action must be a non-empty string (the service)');
  if (action.length > LIMITS.serviceChars) return new FieldProblem('action', `action is longer than ${LIMITS.serviceChars} characters`);
  const priority = body.priority ?? 0;
  if (typeof priority !== 'number' || !Number.isInteger(priority) || priority < PRIORITY_MIN || priority > PRIORITY_MAX) {
    return new FieldProblem('priority', 'priority must be an integer (higher first)');
  }
  const rawJob = body.job;
  if (!isPlainObject(rawJob)) return new FieldProblem('job', 'job must be an object (the job JSON)');
  for (const k of ['token', 'pipes'] as const) {
    if (rawJob[k] !== undefined) return new FieldProblem(`job.${k}`, `job.${k} must not be given: the transport adds it`);
  }
  if (rawJob.service !== undefined && rawJob.service !== action) {
    return new FieldProblem('job.service', `job.service must equal action (${JSON.stringify(action)}) or be left out`);
  }
  const job = validateJob({ ...rawJob, service: action }, 'job');
  if (isFieldProblem(job)) return job;
  return { action, priority, job };
}

function sendError(reply: FastifyReply, code: ErrorCode, message: string, field?: string, status = httpStatusOf(code)): FastifyReply {
  return reply.code(status).send({ error: field === undefined ? { code, message } : { code, message, field } });
}

export const itemsRoutes: FastifyPluginAsync<ItemsRoutesOptions> = async (app, opts) => {
  const { pool } = opts;

  // Body-parser failures (bad JSON, wrong content type) answer in our error shape too.
  app.setErrorHandler((err: FastifyError, req, reply) => {
    const status = typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : 500;
    if (status === 500) {
      req.log.error({ err }, 'items route failed');
      return sendError(reply, 'internal', 'internal error');
    }
    if (err.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || err.code === 'FST_ERR_CTP_EMPTY_JSON_BODY' || err instanceof SyntaxError) {
      return sendError(reply, 'invalid_job', `the body is not valid JSON: ${err.message}`, '(body)');
    }
    return sendError(reply, 'bad_request', err.message, undefined, status);
  });

  app.post('/items', async (req, reply) => {
    const parsed = parseItemRequest(req.body);
    if (isFieldProblem(parsed)) return sendError(reply, 'invalid_job', parsed.message, parsed.field);
    const id = await enqueue(pool, { action: parsed.action, priority: parsed.priority, payload: parsed.job });
    return reply.code(201).send({ id });
  });

  app.get<{ Params: { id: string } }>('/items/:id', async (req, reply) => {
    const id = /^[1-9][0-9]{0,15}$/.test(req.params.id) ? Number(req.params.id) : NaN;
    const item = Number.isSafeInteger(id) ? await getItem(pool, id) : null;
    if (item === null) return sendError(reply, 'not_found', `no item ${JSON.stringify(req.params.id)}`);
    return { id: item.id, state: item.state, attempts: item.attempts, receipt: item.receipt };
  });
};
