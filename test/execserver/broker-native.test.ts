/**
 * What only the native execserver can show beyond the contract: the OFFER goes out in the same
 * step as the WANT, a stopped job's process really dies, and the admin routes (/status,
 * /queue/{job_id}, /metrics) report the broker's state.
 */
import { readdir, readFile } from 'node:fs/promises';
import t, { type Test } from 'tap';
import { jobs } from '../helpers/broker-peer.js';
import { serveNative, type ServedNative } from '../helpers/serve-native.js';
import { eventually } from '../helpers/wait.js';
import { contractServeConfig } from './broker-contract.js';

const WG = 'main';

function serve(t: Test, processes: number, broker = {}): Promise<ServedNative> {
  return serveNative(t, contractServeConfig({ processes, broker }));
}

/** Pids of processes whose command line is exactly `argv` (Linux /proc). */
async function pidsOf(argv: string[]): Promise<number[]> {
  const want = `${argv.join('\0')}\0`;
  const out: number[] = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const cmdline = await readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '');
    if (cmdline === want) out.push(Number(name));
  }
  return out;
}

t.test('rule 3 (native): the OFFER is sent while the WANT is handled, before any later frame', async (t) => {
  const s = await serve(t, 1);
  const p = await s.peer();
  p.want('j1', 'echo');
  await p.sync();
  t.same(p.received.map((f) => f.type), ['HELLO', 'OFFER'], 'the OFFER arrived before the pong of a ping sent right after the WANT');
});

t.test('rule 6 (native): closing the connection kills the running process', async (t) => {
  const s = await serve(t, 1);
  const p = await s.peer();
  const marker = '31.4159';
  await p.acquire('j1', jobs.sleep(marker));
  const pids = await eventually(async () => {
    const found = await pidsOf(['sleep', marker]);
    return found.length > 0 ? found : undefined;
  }, { what: 'the sleep process to start' });
  t.equal(pids.length, 1, 'one process');
  p.terminate();
  await eventually(async () => (await pidsOf(['sleep', marker])).length === 0, { what: 'the process to die', timeoutMs: 5000 });
  t.pass('the process is gone');
  await eventually(() => s.server.source.inUse(WG) === 0, { what: 'the slot to come home' });
});

t.test('CANCEL stops the process group; DONE says stopped: true', async (t) => {
  const s = await serve(t, 1);
  const p = await s.peer();
  const marker = '27.1828';
  await p.acquire('j1', jobs.sleep(marker));
  await eventually(async () => (await pidsOf(['sleep', marker])).length === 1, { what: 'the sleep process to start' });
  p.cancel('j1');
  const done = await p.next('DONE', 'j1');
  t.equal(done.receipt.stopped, true);
  t.equal(done.receipt.ok, false);
  t.equal(done.receipt.error?.code, 'stopped');
  t.same(await pidsOf(['sleep', marker]), [], 'no process is left when DONE arrives');
});

t.test('GET /queue/{job_id} answers the POSITION of a parked want as JSON; 404 for an unknown job', async (t) => {
  const s = await serve(t, 1);
  const p = await s.peer();
  await p.acquire('hold', jobs.sleep(60));
  await p.park('w1', 'echo', 0);
  await p.park('w2', 'echo', 0);
  const res = await fetch(`${s.url}/queue/w2`);
  t.equal(res.status, 200);
  t.same(await res.json(), { type: 'POSITION', job_id: 'w2', running: 1, ahead: 1, capacity: 1, parked: 2, eta_ms: null });
  const none = await fetch(`${s.url}/queue/nope`);
  t.equal(none.status, 404);
  t.equal(((await none.json()) as { error: { code: string } }).error.code, 'unknown_job');
});

t.test("POSITION's eta_ms comes from the rolling mean of the service's recent run times", async (t) => {
  const s = await serve(t, 1);
  const p = await s.peer();
  await p.acquire('hold', jobs.sleep(60));
  t.equal((await p.park('w1', 'sleep')).eta_ms, null, 'no run of the service yet: null');
  p.unwant('w1');
  p.cancel('hold');
  await p.next('DONE', 'hold');
  for (let i = 0; i < 2; i++) t.equal((await p.run(`s${i}`, jobs.sleep('0.05'))).receipt.ok, true);
  await p.acquire('hold2', jobs.sleep(60));
  const pos = await p.park('w2', 'sleep');
  t.type(pos.eta_ms, 'number');
  // The mean is at least the 50 ms slept; one run to wait for the slot, one to run.
  t.ok((pos.eta_ms as number) >= 2 * 50, `eta ${pos.eta_ms} ms >= wait + run`);
  t.ok((pos.eta_ms as number) < 10_000, 'and in proportion');
});

t.test('GET /status: waitgroups with processes, running, parked, offered; connections with their counts', async (t) => {
  const s = await serve(t, 2, { offer_timeout_ms: 8000 });
  const a = await s.peer();
  const b = await s.peer();
  await a.acquire('run', jobs.sleep(60));
  a.want('off', 'echo');
  await a.next('OFFER', 'off');
  await b.park('park', 'echo', 7);
  const st = (await (await fetch(`${s.url}/status`)).json()) as Record<string, unknown> & { waitgroups: Record<string, Record<string, unknown>>; connections: Record<string, unknown>[] };
  t.match(st.waitgroups[WG], { processes: 2, running: 1, in_use: 2, parked: 1, offered: 1, parked_by_priority: { '7': 1 } });
  t.equal(st.draining, false);
  t.equal(st.kind, 'local');
  t.same(
    st.connections.map((c) => [c.parked, c.offered, c.running]),
    [
      [0, 1, 1],
      [1, 0, 0],
    ],
  );
  t.match(st.connections[0], { remote_address: '127.0.0.1', local_address: '127.0.0.1' });
  t.match(st.legacy_tokens, { outstanding: 0 });
});

t.test('GET /metrics: parked and running by waitgroup and priority, offers by outcome, latencies, refusals, legacy tokens, connections', async (t) => {
  const s = await serve(t, 1, { offer_timeout_ms: 300 });
  const a = await s.peer();
  const b = await s.peer();
  await a.acquire('run', jobs.sleep(60), 3);
  await b.park('p5', 'echo', 5);
  await b.park('p0', 'echo', 0);
  b.sendRaw('garbage');
  await b.error('bad_frame');
  await fetch(`${s.url}/token/echo`); // 503: wants are parked
  const metrics = async (): Promise<string> => (await fetch(`${s.url}/metrics`)).text();
  let m = await metrics();
  t.match(m, /slotgate_parked_wants\{waitgroup="main",priority="5"\} 1/);
  t.match(m, /slotgate_parked_wants\{waitgroup="main",priority="0"\} 1/);
  t.match(m, /slotgate_running_jobs\{waitgroup="main",priority="3"\} 1/);
  t.match(m, /slotgate_refused_frames_total\{code="bad_frame"\} 1/);
  t.match(m, /slotgate_legacy_tokens_total\{service="echo",status="503"\} 1/);
  t.match(m, /slotgate_broker_connections 2/);
  t.match(m, /slotgate_offer_to_job_seconds_count\{waitgroup="main"\} 1/);
  a.cancel('run');
  await a.next('DONE', 'run');
  const o1 = await b.next('OFFER', 'p5');
  b.decline('p5', o1.token);
  await b.next('OFFER', 'p0');
  await b.error('offer_expired', 'p0');
  await b.sync();
  b.unwant('none');
  await b.error('unknown_job');
  const tok = await fetch(`${s.url}/token/echo`);
  t.equal(tok.status, 200);
  m = await metrics();
  t.match(m, /slotgate_offers_total\{waitgroup="main",outcome="made"\} 3/);
  t.match(m, /slotgate_offers_total\{waitgroup="main",outcome="accepted"\} 1/);
  t.match(m, /slotgate_offers_total\{waitgroup="main",outcome="declined"\} 1/);
  t.match(m, /slotgate_offers_total\{waitgroup="main",outcome="expired"\} 1/);
  t.match(m, /slotgate_slot_free_to_offer_seconds_count\{waitgroup="main"\} 2/, 'the cancelled job and the declined offer freed the slot while wants waited');
  t.match(m, /slotgate_refused_frames_total\{code="unknown_job"\} 1/);
  t.match(m, /slotgate_legacy_tokens_total\{service="echo",status="200"\} 1/);
  t.notMatch(m, /slotgate_parked_wants\{/, 'nothing parked any more');
  t.notMatch(m, /slotgate_running_jobs\{[^}]*\} [1-9]/, 'no job running');
  await b.close();
  m = await metrics();
  t.match(m, /slotgate_broker_connections 1/);
  t.match(m, /slotgate_broker_connections_closed_total\{reason="close 1000"\} 1/);
});
