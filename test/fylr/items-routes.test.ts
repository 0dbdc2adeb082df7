import Fastify from 'fastify';
import t from 'tap';
import { request } from 'undici';
import { claimOne, finish } from '../../src/db/file-queue-store.js';
import { itemsRoutes, parseItemRequest } from '../../src/fylr/items-routes.js';
import { isFieldProblem } from '../../src/protocol/job.js';
import { testSchema } from '../helpers/db.js';

async function app(t: { teardown(fn: () => unknown): void }, pool: import('pg').Pool): Promise<string> {
  const a = Fastify({ logger: false });
  await a.register(itemsRoutes, { pool });
  await a.listen({ host: '127.0.0.1', port: 0 });
  t.teardown(() => a.close());
  const addr = a.server.address() as { port: number };
  return `http://127.0.0.1:${addr.port}`;
}

async function post(url: string, body: unknown, raw?: string): Promise<{ status: number; json: any }> {
  const res = await request(`${url}/items`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: raw ?? JSON.stringify(body),
  });
  return { status: res.statusCode, json: await res.body.json() };
}

async function get(url: string, path: string): Promise<{ status: number; json: any }> {
  const res = await request(`${url}${path}`);
  return { status: res.statusCode, json: await res.body.json() };
}

const job = { commands: [{ prog: 'echo', args: [{ type: 'value', value: 'hi' }] }] };

t.test('parseItemRequest: defaults and normalisation', async (t) => {
  const r = parseItemRequest({ action: 'echo', job });
  t.notOk(isFieldProblem(r));
  if (isFieldProblem(r)) return;
  t.equal(r.priority, 0);
  t.equal(r.job.service, 'echo', 'job.service defaults to action');
  t.same(r.job.commands, job.commands);
  const same = parseItemRequest({ action: 'echo', priority: 7, job: { ...job, service: 'echo', extra: 1 } });
  t.notOk(isFieldProblem(same));
  if (!isFieldProblem(same)) {
    t.equal(same.priority, 7);
    t.notOk('extra' in same.job, 'unknown job fields are dropped');
  }
});

t.test('POST /items validation: 400 invalid_job naming the field', async (t) => {
  const { pool } = await testSchema(t, 'items_val');
  const url = await app(t, pool);
  const cases: [string, unknown, string][] = [
    ['not an object', [1, 2], '(body)'],
    ['no action', { job }, 'action'],
    ['empty action', { action: '', job }, 'action'],
    ['priority not integer', { action: 'echo', priority: 1.5, job }, 'priority'],
    ['priority a string', { action: 'echo', priority: '1', job }, 'priority'],
    ['no job', { action: 'echo' }, 'job'],
    ['job with token', { action: 'echo', job: { ...job, token: 'T' } }, 'job.token'],
    ['job with pipes', { action: 'echo', job: { ...job, pipes: { in: 'http://x/pipe/1' } } }, 'job.pipes'],
    ['job.service differs', { action: 'echo', job: { ...job, service: 'convert' } }, 'job.service'],
    ['bad command', { action: 'echo', job: { commands: [{ prog: 'echo', args: [{ type: 'file_in', file: { url: 'ftp://x', name: 'a' } }] }] } }, 'job.commands[0].args[0].file.url'],
    ['bad timeout', { action: 'echo', job: { ...job, timeout_sec: -1 } }, 'job.timeout_sec'],
  ];
  for (const [name, body, field] of cases) {
    const r = await post(url, body);
    t.equal(r.status, 400, `${name}: 400`);
    t.equal(r.json.error?.code, 'invalid_job', `${name}: code`);
    t.equal(r.json.error?.field, field, `${name}: field`);
    const named = field === '(body)' ? 'body' : field;
    t.ok(String(r.json.error?.message).includes(named), `${name}: the message names ${named}: ${r.json.error?.message}`);
  }
  const bad = await post(url, undefined, '{"action": ');
  t.equal(bad.status, 400, 'bad JSON: 400');
  t.equal(bad.json.error?.code, 'invalid_job');
  const { rows } = await pool.query<{ n: string }>('SELECT count(*) AS n FROM file_queue');
  t.equal(Number(rows[0]!.n), 0, 'nothing was enqueued');
});

t.test('POST /items → 201 {id}; GET /items/:id round trip', async (t) => {
  const { pool } = await testSchema(t, 'items_rt');
  const url = await app(t, pool);
  const r = await post(url, { action: 'echo', priority: 2, job });
  t.equal(r.status, 201);
  t.type(r.json.id, 'number');
  const id = r.json.id as number;
  t.same(await get(url, `/items/${id}`), { status: 200, json: { id, state: 'queued', attempts: 0, receipt: null } });
  const row = await pool.query<{ action: string; priority: number; payload: unknown }>('SELECT action, priority, payload FROM file_queue WHERE id = $1', [id]);
  t.same(row.rows[0], { action: 'echo', priority: 2, payload: { service: 'echo', commands: job.commands } });

  // Any fylr of the database answers for any item: finish it through the store, read it back.
  const claimed = await claimOne(pool, 'elsewhere');
  t.equal(claimed?.id, id);
  t.same((await get(url, `/items/${id}`)).json, { id, state: 'claimed', attempts: 1, receipt: null });
  await finish(pool, id, 'elsewhere', { ok: true, exit_code: 0 }, true);
  t.same((await get(url, `/items/${id}`)).json, { id, state: 'done', attempts: 1, receipt: { ok: true, exit_code: 0 } });

  for (const path of [`/items/${id + 1}`, '/items/abc', '/items/0', '/items/-1', '/items/99999999999999999999']) {
    const nf = await get(url, path);
    t.equal(nf.status, 404, `${path}: 404`);
    t.equal(nf.json.error?.code, 'not_found', `${path}: not_found`);
  }
});
