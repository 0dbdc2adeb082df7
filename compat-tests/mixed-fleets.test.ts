/**
 * Mixed fleets:
 *  - a new fylr whose addresses are [old execserver, gateway]: polling on one, the broker on the
 *    other, both used, every job once;
 *  - an old and a new fylr on one database and one gateway: broker wants take precedence (the old
 *    fylr's token requests are answered 503 while they are parked), and priority holds across
 *    both fylrs.
 */
import t from 'tap';
import { until } from '../fixtures/lib/cleanup.js';
import { compatTest, transportOf } from './lib/harness.js';

compatTest(t, { kind: 'scenario', id: 'scenario:new-fylr-old-and-gateway', title: 'new fylr with addresses [old execserver, gateway]: polling on one, broker on the other' }, async (s) => {
  const oldExec = await s.legacy({ processes: 2, name: 'old-exec' });
  const backend = await s.legacy({ processes: 2, name: 'backend' });
  const gateway = await s.gateway([backend.url], { processes: 2 });
  const fylr = await s.newFylr([oldExec.url, gateway.url]);
  s.t.equal(await transportOf(fylr, oldExec.url), 'polling', 'the old execserver is polled');
  s.t.equal(await transportOf(fylr, gateway.url), 'broker', 'the gateway is reached over /broker');
  await s.submit(fylr.url, 40, { service: 'slow', secs: 0.05 });
  await s.waitDone();
  await s.verify();
  const direct = oldExec.server.counters.jobs.slow ?? 0;
  const viaGateway = backend.server.counters.jobs.slow ?? 0;
  s.t.ok(direct > 0, `the polled old execserver ran jobs (${direct})`);
  s.t.ok(viaGateway > 0, `the old execserver behind the gateway ran jobs (${viaGateway})`);
  s.notes.push(`${direct} jobs by polling, ${viaGateway} over the broker`);
});

async function gatewayParked(url: string): Promise<number> {
  const st = (await (await fetch(`${url}/status`)).json()) as { waitgroups: { w: { parked: number } } };
  return st.waitgroups.w.parked;
}

compatTest(
  t,
  { kind: 'scenario', id: 'scenario:old-and-new-fylr-one-gateway', title: 'an old and a new fylr on one database and one gateway: broker wants first, old fylr 503, priority holds' },
  async (s) => {
    const backend = await s.legacy({ processes: 1 });
    const gateway = await s.gateway([backend.url], { processes: 1 });
    const newFylr = await s.newFylr([gateway.url]);
    await until(() => newFylr.fylr.status().admission.exec_share > 0, 'the new fylr has a claim share');
    const share = newFylr.fylr.status().admission.exec_share;

    // 1. Broker wants take precedence. The new fylr fills its claim share with low-priority
    //    jobs (one runs, the others park at the gateway); then an old fylr claims an URGENT item.
    const [first] = await s.submit(newFylr.url, 1, { service: 'slow', secs: 0.6 });
    const parked = await s.submit(newFylr.url, share - 1, { service: 'slow', secs: 0.05 });
    await until(async () => newFylr.fylr.status().items.claimed.length === share && (await gatewayParked(gateway.url)) === share - 1, 'the share claimed, the rest parked');
    const oldFylr = await s.oldFylr([gateway.url], { parallel: 2, parallelHigh: 1 });
    const [urgent] = await s.submit(oldFylr.url, 1, { service: 'slow', secs: 0.05, priority: 9 });
    await s.waitDone();
    const { rows: carrier } = await s.db.pool.query<{ claimed_by: string }>(`SELECT claimed_by FROM file_queue WHERE id = $1`, [urgent!.id]);
    s.t.equal(carrier[0]?.claimed_by, oldFylr.fylr.owner, 'the old fylr carried the urgent item');
    s.t.same([...s.witnessed().keys()], [first!, ...parked, urgent!].map((i) => i.marker), 'every parked broker want ran before the old fylr got a slot');
    const busy = oldFylr.fylr.counters.snapshot().token_requests.by_status['503'] ?? 0;
    s.t.ok(busy > 0, `the old fylr was answered 503 meanwhile (${busy} times)`);
    s.notes.push(`old fylr's priority-9 item waited behind ${share} parked broker wants (${busy} x 503)`);

    // 2. Priority holds across both fylrs where they compete: the queue. With both claiming,
    //    urgent items are claimed before every low one still queued when they arrived.
    const lows = await s.submit(newFylr.url, 20, { service: 'slow', secs: 0.03 });
    await until(() => oldFylr.fylr.workers.status().waiting + oldFylr.fylr.workers.status().running > 0, 'the old fylr carries low items too');
    const highs = await s.submit(oldFylr.url, 3, { service: 'slow', secs: 0.03, priority: 5 });
    await s.waitDone();
    await s.verify();
    const { rows } = await s.db.pool.query<{ id: string; claimed_at: Date; claimed_by: string }>(`SELECT id, claimed_at, claimed_by FROM file_queue WHERE id = ANY($1)`, [[...lows, ...highs].map((i) => i.id)]);
    const at = new Map(rows.map((r) => [Number(r.id), r.claimed_at.getTime()]));
    const highsArrived = Math.max(...(await s.db.pool.query<{ t: Date }>(`SELECT created_at AS t FROM file_queue WHERE id = ANY($1)`, [highs.map((h) => h.id)])).rows.map((r) => r.t.getTime()));
    const lastHighClaim = Math.max(...highs.map((h) => at.get(h.id)!));
    const overtaking = lows.filter((l) => at.get(l.id)! > highsArrived && at.get(l.id)! < lastHighClaim).length;
    s.t.equal(overtaking, 0, 'no low item queued when the urgent ones arrived was claimed before them, by either fylr');
    const owners = new Set(rows.map((r) => r.claimed_by));
    s.t.equal(owners.size, 2, 'both fylrs claimed items');
    const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
    s.t.match(metrics, /slotgate_legacy_tokens_total\{service="slow",status="503"\} [1-9]/, 'the gateway counted its 503s for old fylrs');
  },
);
