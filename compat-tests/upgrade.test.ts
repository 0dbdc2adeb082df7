/**
 * Upgrade in place and downgrade, behind the test balancer: the fylr's configured address stays
 * the same while what answers behind it changes from an old execserver to a gateway (in front of
 * the same old execserver) and back, with work flowing. The client must switch transports by
 * itself (re-probe), without a restart, and no job may be lost or run twice.
 */
import t from 'tap';
import { until } from '../fixtures/lib/cleanup.js';
import { startBalancer } from '../test/helpers/balancer.js';
import { compatTest, transportOf } from './lib/harness.js';

compatTest(t, { kind: 'scenario', id: 'scenario:upgrade-in-place', title: 'upgrade in place: the address changes from an old execserver to a gateway while work flows' }, async (s) => {
  const oldExec = await s.legacy({ processes: 3 });
  const lb = await startBalancer([oldExec.url]);
  s.t.teardown(() => lb.close());
  const fylr = await s.newFylr([lb.url], { reprobeIntervalMs: 300 });
  const owner = fylr.fylr.owner;
  s.t.equal(await transportOf(fylr, lb.url), 'polling', 'before: the address is polled');

  const before = await s.submit(fylr.url, 20, { service: 'slow', secs: 0.05 });
  await until(async () => ((await s.states(before)).done ?? 0) >= 5, 'work flowing');
  const gateway = await s.gateway([oldExec.url], { processes: 3 });
  lb.setTargets([gateway.url]);
  await until(async () => (await transportOf(fylr, lb.url)) === 'broker', 'the client switched to the broker', 15_000);
  const during = await s.submit(fylr.url, 20, { service: 'slow', secs: 0.05 });
  await s.waitDone();
  await s.verify();
  s.t.equal(fylr.fylr.owner, owner, 'the same fylr process throughout (no restart)');
  const st = (await (await fetch(`${gateway.url}/status`)).json()) as { gateway: { backends: { jobs_relayed: number }[] } };
  s.t.ok((st.gateway.backends[0]?.jobs_relayed ?? 0) > 0, `jobs went through the gateway after the switch (${st.gateway.backends[0]?.jobs_relayed})`);
  const retried = fylr.fylr.status().dispatcher.counters.retried;
  s.notes.push(`${before.length} jobs submitted before, ${during.length} after the switch; ${retried} attempts retried${retried > 0 ? ' (legacy tokens redeemed across the switch)' : ''}`);
});

compatTest(t, { kind: 'scenario', id: 'scenario:downgrade', title: 'downgrade: the address changes from a gateway back to the old execserver while work flows' }, async (s) => {
  const oldExec = await s.legacy({ processes: 3 });
  const gateway = await s.gateway([oldExec.url], { processes: 3 });
  const lb = await startBalancer([gateway.url]);
  s.t.teardown(() => lb.close());
  const fylr = await s.newFylr([lb.url], { reprobeIntervalMs: 300 });
  s.t.equal(await transportOf(fylr, lb.url), 'broker', 'before: the broker through the gateway');

  const before = await s.submit(fylr.url, 12, { service: 'slow', secs: 0.05 });
  await until(async () => ((await s.states(before)).done ?? 0) >= 4, 'work flowing');
  // Roll back: the balancer points at the old execserver again, the gateway drains and goes.
  lb.setTargets([oldExec.url]);
  await gateway.server.drainAndClose();
  await until(async () => (await transportOf(fylr, lb.url)) === 'polling', 'the client fell back to polling', 15_000);
  // Polling is slow by nature (a token round per second per waiting job): a small batch.
  await s.submit(fylr.url, 8, { service: 'slow', secs: 0.05 });
  await s.waitDone();
  await s.verify();
  s.t.ok((oldExec.server.counters.requests.token['200'] ?? 0) > 0, 'after the downgrade the old execserver hands out tokens directly');
  s.notes.push(`drained the gateway with jobs in flight; ${fylr.fylr.status().dispatcher.counters.retried} attempts retried`);
});
