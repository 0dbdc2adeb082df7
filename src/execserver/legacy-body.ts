/** The legacy API's error bodies (PROTOCOL.md §5): `{"Error": "...", "Status": N}`. */
import type { FastifyReply } from 'fastify';

export function legacyError(reply: FastifyReply, status: number, error: string, headers: Record<string, string> = {}): FastifyReply {
  for (const [k, v] of Object.entries(headers)) reply.header(k, v);
  return reply.code(status).type('application/json').send(JSON.stringify({ Error: error, Status: status }));
}

export const ALL_WORKERS_BUSY = 'All workers busy';
export const TOKEN_NOT_FOUND = 'Token not found';

export function unknownServiceText(service: string): string {
  return `Unknown service ${JSON.stringify(service)}`;
}
