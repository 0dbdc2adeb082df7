/**
 * The seed's failure matrix, execserver-side rows, plus the gateway's own: crashes are real
 * (`slotgate serve` / `legacy-execserver` children killed with SIGKILL, with their job processes,
 * as when a pod dies), restarts come back on the same port.
 *
 *   execserver crashes              parked jobs keep waiting on the others; the reconnect re-registers wants
 *   old execserver (no /broker)     the fylr falls back to polling for that address
 *   gateway crash and restart       wants wait, the client reconnects, nothing is lost
 *   backend crash mid-job           DONE with backend_failed, the job is retried, the other backend serves
 *   half-open connection            ping/pong on both sides: the dead link is dropped, the work moves on
 */
import t from 'tap';
import { until } from '../fixtures/lib/cleanup.js';
import { getJson } from '../fixtures/lib/peers.js';
import { BrokerPeer } from '../test/helpers/broker-peer.js';
import { compatTest, transportOf } from './lib/harness.js';
import { freePort, metricsOf, metricValue, startFreezableProxy } from './lib/net-tools.js';

interface GatewayStatus {
  waitgroups: Record<string, { parked: number; running: number }>;
  gateway: { backends: { url: string; held: Record<string, number>; jobs_relayed: number; jobs_failed: number; last_error: string | null }[] };
}

compatTest(
  t,
  { kind: 'failure', id: 'failure:execserver-crash', seedRow: 'Execserver crashes', title: 'execserver crashes: parked jobs keep waiting on the other, the restarted one gets the wants again' },
  async (s) => {
    const port = await freePort();
    const listen = `127.0.0.1:${port}`;
    // exec-a alone has a slot for `solomark` (exec-b announces the service with 0 processes):
    // those jobs can only wait for exec-a to come back.
    const crashing = await s.spawnExec('native', 'exec-a', { processes: 1, soloProcesses: 1, listen });
    const other = await s.native({ processes: 1, soloProcesses: 0, name: 'exec-b' });
    const fylr = await s.newFylr([crashing.url, other.url]);
    await s.submit(fylr.url, 10, { service: 'slow', secs: 0.3 });
    const onlyA = await s.submit(fylr.url, 3, { service: 'solomark', secs: 0.3 });
    type St = { waitgroups: Record<string, { running: number }> };
    await until(async () => {
      const st = await getJson<St>(`${crashing.url}/status`);
      return st.waitgroups.w!.running + st.waitgroups.one!.running >= 1;
    }, 'a job running on exec-a');
    await crashing.crash();
    const doneAtCrash = (await s.states()).done ?? 0;
    await until(async () => (await transportOf(fylr, crashing.url)) !== 'broker', 'the client noticed the crash');
    await until(async () => ((await s.states()).done ?? 0) >= doneAtCrash + 2, 'work went on on exec-b meanwhile');
    const waitingForA = 3 - (s.witnessed().size === 0 ? 0 : onlyA.filter((i) => s.witnessed().has(i.marker)).length);
    s.t.ok(waitingForA >= 1, `${waitingForA} jobs only exec-a can run wait for it`);
    const restarted = await s.spawnExec('native', 'exec-a', { processes: 1, soloProcesses: 1, listen });
    await until(async () => (await transportOf(fylr, crashing.url)) === 'broker', 'the client reconnected to the restarted exec-a', 15_000);
    await s.waitDone();
    // exec-a has 2 slots (w: 1, one: 1): a job that finished there in the instant of the crash
    // lost its DONE with it and ran again; every other job ran exactly once.
    await s.verify({ inProcessExecutions: null, crashRerunsAllowed: 2 });
    const ranAfterRestart = metricValue(await metricsOf(restarted.url), 'slotgate_jobs_total', { result: 'ok' });
    s.t.ok(ranAfterRestart >= waitingForA, `the restarted exec-a got the re-registered wants and ran ${ranAfterRestart} jobs`);
    s.notes.push(`exec-b kept serving during the outage; the restarted exec-a ran ${ranAfterRestart} jobs`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:old-execserver-no-broker', seedRow: 'Old execserver (no /broker)', title: 'old execserver without /broker: the new fylr polls that address, and keeps probing' },
  async (s) => {
    const old = await s.legacy({ processes: 2 });
    const fylr = await s.newFylr([old.url], { reprobeIntervalMs: 300 });
    s.t.equal(await transportOf(fylr, old.url), 'polling', 'the address is served by polling');
    await s.submit(fylr.url, 10);
    await s.waitDone();
    await s.verify();
    await until(() => (old.server.counters.requests.other[404] ?? 0) >= 2, 'a second /broker probe', 5000);
    s.t.ok((old.server.counters.requests.token[200] ?? 0) >= 10, 'tokens were requested the old way');
    s.t.equal(old.server.counters.requests.job[200], 10, 'one PUT per job');
    s.notes.push(`${old.server.counters.requests.other[404]} refused /broker probes (re-probe every 300 ms)`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:gateway-crash-restart', title: 'gateway crash and restart: the wants wait, the client reconnects, nothing is lost' },
  async (s) => {
    const backend = await s.legacy({ processes: 2 });
    const port = await freePort();
    const listen = `127.0.0.1:${port}`;
    const gateway = await s.spawnExec('gateway', 'gateway', { processes: 2, backends: [backend.url], listen });
    const fylr = await s.newFylr([gateway.url]);
    await s.submit(fylr.url, 14, { service: 'slow', secs: 0.3 });
    await until(() => (backend.server.counters.running.w ?? 0) >= 1, 'a job relayed to the backend');
    await gateway.crash();
    await until(async () => (await transportOf(fylr, gateway.url)) === 'down', 'the client saw the gateway go');
    const restarted = await s.spawnExec('gateway', 'gateway', { processes: 2, backends: [backend.url], listen });
    await until(async () => (await transportOf(fylr, gateway.url)) === 'broker', 'the client reconnected', 15_000);
    await s.waitDone(s.submitted, 90_000);
    await s.verify({ inProcessExecutions: null });
    const st = await getJson<GatewayStatus>(`${restarted.url}/status`);
    s.t.ok(st.gateway.backends[0]!.jobs_relayed >= 1, `the restarted gateway relayed the rest (${st.gateway.backends[0]!.jobs_relayed})`);
    s.notes.push(`retried ${fylr.fylr.status().dispatcher.counters.retried} attempts; the backend's tokens held by the dead gateway lapsed (${backend.server.counters.tokensExpired})`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:backend-crash-mid-job', title: 'backend crash mid-job: DONE says backend_failed, the job is retried, the other backend serves' },
  async (s) => {
    const crashing = await s.spawnExec('legacy', 'backend-1', { processes: 2 });
    const survivor = await s.legacy({ processes: 2, name: 'backend-2' });
    const gateway = await s.gateway([crashing.url, survivor.url], { processes: 2 });
    const failures: string[] = [];
    const fylr = await s.newFylr([gateway.url], {
      observer: {
        frameIn: (_a, _i, m) => {
          if (m.type === 'DONE' && m.receipt.error) failures.push(m.receipt.error.code);
        },
      },
    });
    await s.submit(fylr.url, 16, { service: 'slow', secs: 0.3 });
    const onCrashing = async (): Promise<number> => {
      const st = await getJson<GatewayStatus>(`${gateway.url}/status`);
      return st.gateway.backends.find((b) => b.url === crashing.url.replace(/\/+$/, ''))?.held.w ?? 0;
    };
    await until(async () => (await onCrashing()) >= 1, 'a job on backend-1');
    const onCrashingWhenKilled = await onCrashing();
    await crashing.crash();
    await s.waitDone(s.submitted, 60_000);
    // A job that finished on backend-1 in the instant of the crash lost its result with it: it
    // is retried and may have run twice. At most the jobs held there when it died.
    await s.verify({ inProcessExecutions: null, crashRerunsAllowed: onCrashingWhenKilled });
    s.t.ok(failures.includes('backend_failed'), `the job running on the dead backend ended with DONE backend_failed (${failures.join(', ')})`);
    s.t.ok(fylr.fylr.status().dispatcher.counters.retried >= 1, 'and was retried');
    s.t.ok((survivor.server.counters.jobs.slow ?? 0) >= 1, `backend-2 kept serving (${survivor.server.counters.jobs.slow})`);
    const st = await getJson<GatewayStatus>(`${gateway.url}/status`);
    const dead = st.gateway.backends.find((b) => b.url === crashing.url.replace(/\/+$/, ''));
    s.notes.push(`DONE errors: ${failures.join(', ') || 'none'}; gateway's last error for backend-1: ${dead?.last_error ?? 'none'}`);
  },
);

compatTest(
  t,
  { kind: 'failure', id: 'failure:half-open-connection', title: 'half-open connection: both sides ping, the dead link is dropped and the wants move on' },
  async (s) => {
    const exec = await s.native({ processes: 1, pingIntervalMs: 200, offerTimeoutMs: 2500 });
    const proxy = await startFreezableProxy(exec.url);
    s.t.teardown(() => proxy.close());
    // The only slot is held by an OFFER nobody answers (it lapses after 2.5 s): the fylr's wants
    // are parked, none of its jobs runs while its link dies.
    const holder = await BrokerPeer.connect(exec.url);
    s.t.teardown(() => holder.terminate());
    holder.want('holder', 'mark');
    await holder.next('OFFER', 'holder');
    const fylr = await s.newFylr([proxy.url], { pingIntervalMs: 200 });
    await s.submit(fylr.url, 6);
    await until(async () => (await getJson<{ waitgroups: { w: { parked: number } } }>(`${exec.url}/status`)).waitgroups.w.parked >= 1, 'wants parked through the proxy');
    const frozen = proxy.freeze();
    s.t.equal(frozen, 1, 'one broker connection frozen (open, silent both ways)');
    await until(async () => metricValue(await metricsOf(exec.url), 'slotgate_broker_connections_closed_total', { reason: 'ping_timeout' }) >= 1, 'the execserver dropped the silent connection', 5000);
    await until(() => proxy.accepted >= 2, 'the fylr dialled again', 10_000);
    await s.waitDone();
    await s.verify();
    s.t.equal(await transportOf(fylr, proxy.url), 'broker', 'back on the broker');
    s.notes.push('dropped by ping timeout at the execserver; the fylr re-dialled and re-registered its wants');
  },
);
