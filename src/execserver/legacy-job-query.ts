/** Parses the `?job=` of a legacy `PUT /job/{service}` into a job, or says why not. */
import { isFieldProblem, type JobSpec, validateJob } from '../protocol/job.js';

export type ParsedLegacyJob = { job: JobSpec } | { status: 400; error: string };

export function parseLegacyJobQuery(query: unknown, service: string): ParsedLegacyJob {
  const raw = typeof query === 'object' && query !== null ? (query as Record<string, unknown>).job : undefined;
  if (typeof raw !== 'string' || raw === '') return { status: 400, error: 'Missing job parameter' };
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    return { status: 400, error: 'job parameter is not valid JSON' };
  }
  if (typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed) && (parsed as { service?: unknown }).service === undefined) {
    // Old clients may leave the service to the path.
    (parsed as { service: string }).service = service;
  }
  const job = validateJob(parsed);
  if (isFieldProblem(job)) return { status: 400, error: `invalid job: ${job.message}` };
  if (job.service !== service) return { status: 400, error: `job.service ${JSON.stringify(job.service)} does not match the path's ${JSON.stringify(service)}` };
  return { job };
}
