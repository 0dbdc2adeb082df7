/**
 * The dispatcher inside a whole fylr process: `startFylr` in-process (its listener: items, status,
 * pipes) and `slotgate fylr` child processes sharing one queue.
 */
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { request } from 'undici';
import { parseFylrConfig } from '../../src/config/load-config.js';
import { startFylr, timingsFromEnv, TIMINGS_ENV } from '../../src/fylr/fylr-process.js';
import { startCli } from '../helpers/spawn-cli.js';
import { type TestSchema, testSchema } from '../helpers/db.js';
import { countStates, insertItems, startObservedExec, waitFor } from './dispatcher-fixtures.js';

async function json(url: string, init?: Parameters<typeof request>[1]): Promise<{ status: number; body: any }> {
  const res = await request(url, init);
  return { status: res.statusCode, body: await res.body.json() };
}

function schemaUrl(db: TestSchema): string {
  return `${db.url}${db.url.includes('?') ? '&' : '?'}options=${encodeURIComponent(`-c search_path=${db.schema},public`)}`;
}

t.test('startFylr: items API, /status with transports, admission and the items here; graceful close', async (t) => {
  const db = await testSchema(t, 'proc');
  const ex = await startObservedExec(t, { slots: 2 });
  const config = parseFylrConfig({ listen: '127.0.0.1:0', name: 'inproc', execserver: { addresses: [ex.url] } });
  const fylr = await startFylr(config, { schema: db.schema, dispatcher: { heartbeatIntervalMs: 200, staleAfterMs: 1000 } });
  let closed = false;
  t.teardown(() => (closed ? undefined : fylr.close()));

  const created = await json(`${fylr.url}/items`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ action: 'noop', job: { commands: [] } }),
  });
  t.equal(created.status, 201);
  const id = created.body.id as number;
  await waitFor('done', async () => (await json(`${fylr.url}/items/${id}`)).body.state === 'done');
  t.match((await json(`${fylr.url}/items/${id}`)).body, { id, state: 'done', attempts: 1, receipt: { ok: true } });

  ex.source.hold = () => true;
  const held = await insertItems(db.pool, 5);
  await waitFor('two on their slots', () => ex.source.heldNow().length === 2);
  await waitFor('the share claimed', () => fylr.dispatcher.carried().length === 4);
  const s = (await json(`${fylr.url}/status`)).body;
  t.match(s, {
    kind: 'fylr',
    name: 'inproc',
    owner: fylr.owner,
    addresses: [{ address: ex.url, transport: 'broker', connections: 1, instances: [ex.exec.broker.instanceId] }],
    admission: { exec_share: 4, has_execserver: true, exec_carried: 4 },
    dispatcher: { timings: { poll_interval_ms: 1000, heartbeat_interval_ms: 200, stale_after_ms: 1000 } },
  });
  t.equal(s.items.claimed.length, 4, 'claimed here');
  t.equal(s.items.running.length, 2, 'running here (on a slot)');
  t.equal(s.items.waiting.length, 2, 'parked for a slot');
  t.ok(s.admission.local.size >= 2);
  t.equal((await request(`${fylr.url}/pipe/nope`)).statusCode, 404, 'the pipe server is mounted');

  const closing = fylr.close();
  await waitFor('waiting items given back', async () => (await countStates(db.pool)).queued === 3);
  ex.source.releaseAll();
  await closing;
  closed = true;
  t.same(await countStates(db.pool), { queued: 3, claimed: 0, done: 3, failed: 0 }, 'running ones finished, waiting ones went back');
  t.equal(held.size, 5);
});

t.test('SLOTGATE_DISPATCHER_TIMINGS: the test hook of child processes', async (t) => {
  t.same(timingsFromEnv({}), {});
  t.same(timingsFromEnv({ [TIMINGS_ENV]: '{"heartbeatIntervalMs":200,"staleAfterMs":1000}' }), { heartbeatIntervalMs: 200, staleAfterMs: 1000 });
  t.throws(() => timingsFromEnv({ [TIMINGS_ENV]: '{"parallel":3}' }), /unknown key parallel/);
  t.throws(() => timingsFromEnv({ [TIMINGS_ENV]: '{"staleAfterMs":"x"}' }), /must be a number/);
  t.throws(() => timingsFromEnv({ [TIMINGS_ENV]: 'nope' }), /not JSON/);
});

t.test('three `slotgate fylr` processes on one queue of 2,000 items: each done exactly once', async (t) => {
  const db = await testSchema(t, 'procs');
  const ex = await startObservedExec(t, { slots: 8 });
  const items = await insertItems(db.pool, 2000);
  const dir = await mkdtemp(join(tmpdir(), 'sg-fylrs-'));
  const started = Date.now();
  const children = await Promise.all(
    ['p1', 'p2', 'p3'].map(async (name) => {
      const file = join(dir, `${name}.yml`);
      // p1 runs on an old fylr.yml: its worker-pool sizes are read by legacy-fylr only.
      const legacyKeys = name === 'p1' ? ', parallel: 18, parallelHigh: 10' : '';
      await writeFile(file, `listen: 127.0.0.1:0\nname: ${name}\nexecserver: {addresses: ["${ex.url}"]${legacyKeys}}\ndatabase: "${schemaUrl(db)}"\n`);
      return startCli(['fylr', '--config', file], { t });
    }),
  );
  // stderr is a pipe of its own: the warning may arrive after the listening line on stdout.
  await waitFor('the warning on stderr', () => children[0]!.stderr().includes('parallelHigh'));
  t.match(children[0]!.stderr(), /"level":"warn".*execserver\.parallel is read only by slotgate legacy-fylr/, 'an old fylr.yml: warned that parallel is ignored');
  t.match(children[0]!.stderr(), /execserver\.parallelHigh is read only by slotgate legacy-fylr/);
  t.notMatch(children[1]!.stderr(), /legacy-fylr/, 'no warning without them');
  await waitFor('all done', async () => (await countStates(db.pool)).done === 2000, 90_000, 100);
  const ms = Date.now() - started;
  t.same(await countStates(db.pool), { queued: 0, claimed: 0, done: 2000, failed: 0 });
  const ok = ex.source.okByMarker();
  t.equal(ex.source.started.length, 2000, '2,000 executions at the execserver');
  t.ok(ok.size === 2000 && [...ok.values()].every((n) => n === 1) && [...items.keys()].every((m) => ok.has(m)), 'each item executed once');
  t.equal(await ex.jobsTotal(), 2000);
  const statuses = await Promise.all(children.map(async (c) => (await json(`${c.url}/status`)).body));
  const done = statuses.map((s) => s.dispatcher.counters.done as number);
  t.equal(done.reduce((a, b) => a + b, 0), 2000, `per process ${done.join('/')}`);
  t.ok(statuses.every((s) => s.items.claimed.length === 0 && s.addresses[0].transport === 'broker'));
  t.equal(new Set(statuses.map((s) => s.owner)).size, 3, 'an owner id per process');
  const anyId = items.get(1001)!;
  for (const c of children) t.match((await json(`${c.url}/items/${anyId}`)).body, { id: anyId, state: 'done' }, 'any fylr answers for any item');
  t.comment(`3 processes, 2000 items in ${ms} ms (including process start)`);
  for (const c of children) t.equal(await c.kill('SIGTERM'), 0, 'SIGTERM drains and exits 0');
});
