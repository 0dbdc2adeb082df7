/**
 * What an idle fylr costs the database, counted (every statement its pool sends), against the
 * old worker pool of legacy/ on the same empty queue; and a fylr with no execserver reachable.
 */
import { createServer } from 'node:net';
import t from 'tap';
import type pg from 'pg';
import { LegacyCounters } from '../../legacy/fylr/counters.js';
import { LegacyWorkerPool } from '../../legacy/fylr/worker-pool.js';
import { systemClock } from '../../src/clock.js';
import { enqueue, getItem } from '../../src/db/file-queue-store.js';
import { Dispatcher } from '../../src/fylr/dispatcher.js';
import { ExecClient } from '../../src/fylr/exec-client.js';
import { testSchema } from '../helpers/db.js';
import { countStates, execClientConfig, startObservedExec, until, waitFor } from './dispatcher-fixtures.js';

/** Counts every statement any client of the pool sends (register before the first query). */
function countStatements(pool: pg.Pool): { n: number } {
  const c = { n: 0 };
  pool.on('connect', (client) => {
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      c.n++;
      return query(...args);
    };
  });
  return c;
}

t.test('idle: one claim query per second per fylr server, against the old pool\'s one per worker per second', async (t) => {
  const db = await testSchema(t, 'idle');
  const ex = await startObservedExec(t, { slots: 8 });
  const client = new ExecClient(execClientConfig([ex.url]), { name: 'new' });
  await client.start();
  t.ok(client.hasExecserver() && client.admission() > 0, 'an execserver is connected: exec-bound claims are allowed');
  const ourPool = db.newPool(5);
  const ours = countStatements(ourPool);
  const d = new Dispatcher({ pool: ourPool, client, name: 'new' });
  const legacyPool = db.newPool(10);
  const theirs = countStatements(legacyPool);
  const counters = new LegacyCounters();
  const parallel = 4;
  const parallelHigh = 2;
  const legacy = new LegacyWorkerPool({
    pool: legacyPool, owner: 'legacy-idle', addresses: [ex.url], connectTimeoutSec: 60, parallel, parallelHigh, clock: systemClock, counters,
  });
  t.teardown(async () => {
    await d.stop();
    await legacy.stop();
    await client.close();
  });
  const t0 = Date.now();
  d.start();
  legacy.start();
  await until(d, 'four polls (three seconds)', () => d.counters.claim_queries >= 4, 10_000);
  const elapsedS = (Date.now() - t0) / 1000;
  const oursClaims = d.counters.claim_queries;
  const oursStatements = ours.n;
  const theirClaims = counters.claimQueries;
  const theirStatements = theirs.n;

  t.ok(oursClaims <= Math.floor(elapsedS) + 1, `ours: ${oursClaims} claim queries in ${elapsedS.toFixed(2)} s (one at start, then one per second)`);
  t.equal(oursStatements, oursClaims + d.counters.sweep_queries + d.counters.heartbeat_queries, 'ours: each claim is one statement, nothing else ran but sweeps');
  t.equal(d.counters.heartbeat_queries, 0, 'nothing carried: no heartbeats');
  const workers = parallel + parallelHigh;
  t.ok(theirClaims >= workers * Math.floor(elapsedS), `old pool: ${theirClaims} claim queries (${workers} workers, one each per second)`);
  t.ok(theirStatements >= 3 * theirClaims, `old pool: ${theirStatements} statements (BEGIN, SELECT, COMMIT per claim)`);
  t.ok(theirClaims / oursClaims >= workers - 2, `ratio of claim queries: ${(theirClaims / oursClaims).toFixed(1)}`);
  t.comment(
    `idle over ${elapsedS.toFixed(2)} s: new ${oursClaims} claim queries / ${oursStatements} statements; ` +
      `old (${parallel}+${parallelHigh} workers) ${theirClaims} claim queries / ${theirStatements} statements: ` +
      `${(theirStatements / oursStatements).toFixed(1)}x the statements`,
  );
  t.same(await countStates(db.pool), { queued: 0, claimed: 0, done: 0, failed: 0 });
});

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return port;
}

t.test('no execserver: nothing exec-bound is claimed, local-bound work still runs; once one is up, exec-bound work flows', async (t) => {
  const db = await testSchema(t, 'noexec');
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const client = new ExecClient(execClientConfig([url]), { name: 'lonely', backoff: { initialMs: 100, maxMs: 300 } });
  await client.start();
  t.notOk(client.hasExecserver(), 'nothing listens there');
  t.equal(client.status().addresses[0]!.transport, 'down');
  const exec = [];
  for (let i = 0; i < 3; i++) exec.push(await enqueue(db.pool, { action: 'noop', payload: { service: 'noop', commands: [] } }));
  const local = [
    await enqueue(db.pool, { action: 'checksum', payload: { data: 'abc' } }),
    await enqueue(db.pool, { action: 'sync', payload: {} }),
    await enqueue(db.pool, { action: 'copy_move', payload: { hold_ms: 10 } }),
  ];
  const d = new Dispatcher({ pool: db.newPool(4), client, name: 'lonely' });
  t.teardown(async () => {
    await d.stop();
    await client.close();
  });
  d.start();
  await until(d, 'local work done', () => d.counters.done === 3);
  const q = d.counters.claim_queries;
  await until(d, 'two more timer polls', () => d.counters.claim_queries >= q + 2, 10_000);
  for (const id of exec) t.match(await getItem(db.pool, id), { state: 'queued', attempts: 0 }, `exec item ${id} never claimed`);
  for (const id of local) t.match(await getItem(db.pool, id), { state: 'done', attempts: 1 }, `local item ${id} done`);
  t.equal((await getItem(db.pool, local[0]!))!.receipt && ((await getItem(db.pool, local[0]!))!.receipt as { stdout_prefix: string }).stdout_prefix,
    'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', 'sha256("abc")');

  const ex = await startObservedExec(t, { slots: 2, listen: `127.0.0.1:${port}` });
  await waitFor('the exec items ran once the execserver came up', async () => (await countStates(db.pool)).done === 6, 30_000);
  t.equal(ex.source.started.length, 3);
});
