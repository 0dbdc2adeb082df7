/**
 * The seed's failure matrix, fylr-side rows (one named test per row; execserver-side rows are in
 * failures-exec.test.ts). Crashes are real: `slotgate fylr` child processes killed with SIGKILL.
 *
 *   fylr crashes with parked wants        its socket closes -> the execserver drops its book entries
 *   fylr crashes with claimed queue items claim heartbeat goes stale -> a survivor requeues the orphans
 *   OFFER never answered                  offer timeout -> next candidate
 *   two OFFERs for one job race           first wins; the loser gets DECLINE immediately
 *   no slot within connectTimeoutSec      requeue with start_after +1 min, silent while waiting
 *   old fylr, new execserver              legacy GET /token still served, 503 while wants are parked
 */
import t from 'tap';
import { until } from '../fixtures/lib/cleanup.js';
import { getJson } from '../fixtures/lib/peers.js';
import { BrokerPeer } from '../test/helpers/broker-peer.js';
import { compatTest, FAST_TIMINGS } from './lib/harness.js';
import { metricsOf, metricValue } from './lib/net-tools.js';

interface ExecStatus {
  waitgroups: Record<string, { processes: number; running: number; parked: number; offered: number }>;
  connections: { id: string; parked: number; offered: number; running: number; frames_in: number }[];
}

const execStatus = (url: string): Promise<ExecStatus> => getJson<ExecStatus>(`${url}/status`);

compatTest(
  t,
  { kind: 'failure', id: 'failure:fylr-crash-parked-wants', seedRow: 'fylr crashes with parked wants', title: 'fylr crashes with parked wants: the execserver drops its book entries' },
  async (s) => {
    const exec = await s.native({ processes: 1 });
    const doomed = await s.spawnNewFylr('doomed', [exec.url]);
    await s.submit(doomed.url, 6, { service: 'slow', secs: 0.4 });
    await until(async () => {
      const st = await execStatus(exec.url);
      return st.waitgroups.w!.running === 1 && st.waitgroups.w!.parked >= 1;
    }, 'one job running, wants parked');
    const parkedBefore = (await execStatus(exec.url)).waitgroups.w!.parked;
    await doomed.crash();
    await until(async () => {
      const st = await execStatus(exec.url);
      return st.connections.length === 0 && st.waitgroups.w!.parked === 0 && st.waitgroups.w!.offered === 0 && st.waitgroups.w!.running === 0;
    }, "the crashed fylr's wants, offers and running job gone", 5000);
    s.t.pass(`the ${parkedBefore} parked wants of the crashed fylr left the book when its socket closed`);
    // A survivor requeues the dead fylr's claims (stale heartbeats) and runs everything once.
    await s.newFylr([exec.url]);
    await s.waitDone();
    await s.verify({ inProcessExecutions: null });
    s.notes.push(`${parkedBefore} parked wants dropped at the crash`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:fylr-crash-claimed-items', seedRow: 'fylr crashes with claimed queue items', title: 'fylr crashes with claimed queue items: a survivor requeues the orphans after the heartbeat went stale' },
  async (s) => {
    const exec = await s.native({ processes: 2 });
    const doomed = await s.spawnNewFylr('doomed', [exec.url]);
    const items = await s.submit(doomed.url, 10, { service: 'slow', secs: 0.3 });
    const claimedByDoomed = async (): Promise<number> => {
      const { rows } = await s.db.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM file_queue WHERE state = 'claimed'`);
      return rows[0]!.n;
    };
    await until(async () => (await claimedByDoomed()) >= 3, 'the doomed fylr holds claims');
    const survivor = await s.newFylr([exec.url]);
    const orphans = await claimedByDoomed();
    const killedAt = Date.now();
    await doomed.crash();
    await until(() => survivor.fylr.status().dispatcher.counters.orphans_requeued > 0, 'the survivor requeued orphans', 10_000);
    const after = Date.now() - killedAt;
    s.t.ok(after >= FAST_TIMINGS.staleAfterMs! - FAST_TIMINGS.heartbeatIntervalMs! - 100, `not before the heartbeat went stale (${after} ms after the crash; stale after ${FAST_TIMINGS.staleAfterMs} ms)`);
    await s.waitDone(items);
    await s.verify({ inProcessExecutions: null });
    const { rows } = await s.db.pool.query<{ n: number }>(`SELECT count(*)::int AS n FROM file_queue WHERE attempts >= 2`);
    s.t.ok(rows[0]!.n >= 1, `the orphans were claimed again (${rows[0]!.n} items with 2+ attempts)`);
    s.notes.push(`${orphans} claims orphaned; requeued ${after} ms after the crash`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:offer-never-answered', seedRow: 'OFFER never answered (conn drop)', title: 'OFFER never answered: the offer times out and the slot goes to the next candidate' },
  async (s) => {
    const offerTimeoutMs = 400;
    const exec = await s.native({ processes: 1, offerTimeoutMs });
    // A fylr that stops answering (its process hangs) but keeps its socket: the OFFER lapses.
    const silent = await BrokerPeer.connect(exec.url);
    s.t.teardown(() => silent.terminate());
    silent.want('silent-job', 'mark');
    const offered = await silent.next('OFFER', 'silent-job');
    const offeredAt = Date.now();
    const fylr = await s.newFylr([exec.url]);
    const [item] = await s.submit(fylr.url, 1);
    const expired = await silent.error('offer_expired', 'silent-job', 5000);
    s.t.equal(expired.job_id, 'silent-job', 'the silent fylr is told its offer expired');
    await s.waitDone();
    const waited = Date.now() - offeredAt;
    s.t.ok(waited >= offerTimeoutMs, `the next candidate got the slot once the offer lapsed (${waited} ms after the OFFER, timeout ${offerTimeoutMs} ms)`);
    s.t.equal(offered.expires_ms, offerTimeoutMs, 'the OFFER announced its lifetime');
    await s.verify();
    const m = await metricsOf(exec.url);
    s.t.equal(metricValue(m, 'slotgate_offers_total', { outcome: 'expired' }), 1, 'one offer expired');
    s.notes.push(`item ${item!.id} served ${waited} ms after the unanswered OFFER`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:two-offers-race', seedRow: 'Two OFFERs for one job race', title: 'two OFFERs for one job race: the first wins, the loser is declined at once' },
  async (s) => {
    const a = await s.native({ processes: 2, name: 'exec-a' });
    const b = await s.native({ processes: 2, name: 'exec-b' });
    const fylr = await s.newFylr([a.url, b.url]);
    await s.submit(fylr.url, 20);
    await s.waitDone();
    await s.verify();
    const [ma, mb] = await Promise.all([metricsOf(a.url), metricsOf(b.url)]);
    const count = (outcome: string): number => metricValue(ma, 'slotgate_offers_total', { outcome }) + metricValue(mb, 'slotgate_offers_total', { outcome });
    s.t.equal(count('accepted'), 20, 'one accepted OFFER per job, over both execservers');
    // A losing OFFER that reached the fylr is DECLINEd; one that crossed the fylr's UNWANT is
    // withdrawn by it (rule 2). Either way its slot is free at once, never left to expire.
    const lost = count('declined') + count('withdrawn');
    s.t.ok(count('made') > 20, `both execservers offered for the same jobs (${count('made')} offers for 20 jobs)`);
    s.t.equal(lost, count('made') - 20, `every losing OFFER was declined or withdrawn at once (${count('declined')} declined, ${count('withdrawn')} withdrawn)`);
    s.t.equal(count('expired'), 0, 'no losing offer was left to expire');
    s.notes.push(`${count('made')} offers for 20 jobs: ${count('declined')} declined, ${count('withdrawn')} withdrawn, 0 expired`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:no-slot-in-time', seedRow: 'No slot within connectTimeoutSec', title: 'no slot within connectTimeoutSec: requeued with start_after +1 min, silent while waiting' },
  async (s) => {
    const exec = await s.native({ soloProcesses: 1, offerTimeoutMs: 8000 });
    // The only slot of waitgroup `one` is held by an OFFER nobody answers (for 8 s).
    const holder = await BrokerPeer.connect(exec.url);
    s.t.teardown(() => holder.terminate());
    holder.want('holder', 'solo');
    await holder.next('OFFER', 'holder');
    const frames: string[] = [];
    const fylr = await s.newFylr([exec.url], { connectTimeoutSec: 1, observer: { frameOut: (_a, _i, m) => frames.push(m.type) } });
    const [item] = await s.submit(fylr.url, 1, { service: 'solomark', secs: 0 });
    await until(async () => {
      const { rows } = await s.db.pool.query<{ state: string; attempts: number }>(`SELECT state, attempts FROM file_queue WHERE id = $1`, [item!.id]);
      return rows[0]!.state === 'queued' && rows[0]!.attempts === 1;
    }, 'the item back in the queue', 10_000);
    const { rows } = await s.db.pool.query<{ delay_s: number }>(`SELECT extract(epoch FROM start_after - now())::float AS delay_s FROM file_queue WHERE id = $1`, [item!.id]);
    const delay = rows[0]!.delay_s;
    s.t.ok(delay > 50 && delay <= 60, `start_after is about one minute ahead (${delay.toFixed(1)} s)`);
    s.t.same(frames, ['WANT', 'UNWANT'], 'while it waited the fylr sent nothing but its WANT, then UNWANT at the deadline');
    const st = await execStatus(exec.url);
    s.t.equal(st.waitgroups.one!.parked, 0, 'the want left the book');
    s.t.equal(s.witnessed().size, 0, 'nothing ran');
    s.t.equal(await s.claimedCount(), 0, 'nothing left claimed');
    s.notes.push(`requeued ${delay.toFixed(1)} s ahead after 2 frames`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:old-fylr-new-execserver', seedRow: 'Old fylr, new execserver', title: 'old fylr with a new execserver: GET /token still served, 503 while broker wants are parked' },
  async (s) => {
    const exec = await s.native({ processes: 2, soloProcesses: 1 });
    const newFylr = await s.newFylr([exec.url]);
    await until(() => newFylr.fylr.status().admission.exec_share > 0, 'the new fylr has a claim share');
    const share = newFylr.fylr.status().admission.exec_share;
    // The new fylr fills its claim share with jobs for the single slot of waitgroup `one`.
    const [first] = await s.submit(newFylr.url, 1, { service: 'solomark', secs: 0.6 });
    const parked = await s.submit(newFylr.url, share - 1, { service: 'solomark', secs: 0.05 });
    await until(async () => (await execStatus(exec.url)).waitgroups.one!.parked === share - 1, 'the rest parked');
    const oldFylr = await s.oldFylr([exec.url]);
    const [urgent] = await s.submit(oldFylr.url, 1, { service: 'solomark', secs: 0.05, priority: 9 });
    await s.waitDone();
    await s.verify();
    const { rows } = await s.db.pool.query<{ claimed_by: string }>(`SELECT claimed_by FROM file_queue WHERE id = $1`, [urgent!.id]);
    s.t.equal(rows[0]?.claimed_by, oldFylr.fylr.owner, 'the old fylr carried its item');
    s.t.same([...s.witnessed().keys()], [first!, ...parked, urgent!].map((i) => i.marker), 'the old fylr took no slot while broker wants were parked');
    const c = oldFylr.fylr.counters.snapshot();
    s.t.ok((c.token_requests.by_status['503'] ?? 0) > 0, `it was answered 503 meanwhile (${c.token_requests.by_status['503']} times)`);
    s.t.equal(c.token_requests.by_status['200'], 1, 'and got its token once they were served');
    const res = await fetch(`${exec.url}/token/nope`);
    s.t.equal(res.status, 404, 'the legacy API answers as before (404 for an unknown service)');
    s.notes.push(`${c.token_requests.by_status['503'] ?? 0} x 503 while ${share - 1} wants were parked`);
  },
);
