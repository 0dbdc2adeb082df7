/**
 * Several replicas behind one balancer (test/helpers/balancer.ts, round-robin, every request and
 * every websocket upgrade to the next replica):
 *  - gateways: two gateway replicas (one shared secret) in front of two old execservers, with an
 *    old and a new fylr on the balanced address: no "Token not found" although the token request
 *    and the PUT of an old fylr land on different replicas;
 *  - native execservers: three replicas with one slot each; under backpressure the new fylr's
 *    pool grows through the balancer until it reaches more than one replica, and jobs run on
 *    several of them.
 */
import t from 'tap';
import { startBalancer } from '../test/helpers/balancer.js';
import { compatTest, transportOf } from './lib/harness.js';

compatTest(t, { kind: 'scenario', id: 'scenario:gateway-replicas', title: 'two gateway replicas behind one balancer, old and new fylr on the balanced address' }, async (s) => {
  const b1 = await s.legacy({ processes: 2, name: 'backend-1' });
  const b2 = await s.legacy({ processes: 2, name: 'backend-2' });
  const g1 = await s.gateway([b1.url, b2.url], { processes: 2, name: 'gateway-1' });
  const g2 = await s.gateway([b1.url, b2.url], { processes: 2, name: 'gateway-2' });
  const lb = await startBalancer([g1.url, g2.url]);
  s.t.teardown(() => lb.close());
  const oldFylr = await s.oldFylr([lb.url]);
  const newFylr = await s.newFylr([lb.url]);
  s.t.equal(await transportOf(newFylr, lb.url), 'broker');
  await s.submit(oldFylr.url, 20, { service: 'slow', secs: 0.05 });
  await s.submit(newFylr.url, 20, { service: 'slow', secs: 0.05 });
  await s.waitDone();
  await s.verify();
  const c = oldFylr.fylr.counters.snapshot();
  s.t.equal(c.token_not_found, 0, `no "Token not found" for the old fylr (${c.puts.total} PUTs through the balancer)`);
  s.t.ok((lb.counts[g1.url] ?? 0) > 0 && (lb.counts[g2.url] ?? 0) > 0, `the balancer used both replicas (${JSON.stringify(lb.counts)})`);
  const ran1 = b1.server.counters.jobs.slow ?? 0;
  const ran2 = b2.server.counters.jobs.slow ?? 0;
  s.t.ok(ran1 > 0 && ran2 > 0, `both old execservers ran jobs (${ran1} + ${ran2})`);
  s.notes.push(`0 Token not found in ${c.puts.total} old-fylr PUTs; backends ran ${ran1} + ${ran2}`);
});

compatTest(t, { kind: 'scenario', id: 'scenario:native-replicas', title: 'three native execserver replicas behind one balancer: the pool grows to reach them' }, async (s) => {
  const natives = [];
  for (let i = 1; i <= 3; i++) natives.push(await s.native({ processes: 1, soloProcesses: 0, name: `native-${i}` }));
  const lb = await startBalancer(natives.map((n) => n.url));
  s.t.teardown(() => lb.close());
  // Backpressure is a want still parked after a full retry tick; shorter ticks make it quick.
  const fylr = await s.newFylr([lb.url], { client: { retryTickMs: 200, growthMinIntervalMs: 300 } });
  await s.submit(fylr.url, 24, { service: 'slow', secs: 0.25 });
  await s.waitDone();
  await s.verify();
  const ran = await Promise.all(natives.map((n) => n.executions()));
  s.t.ok(ran.filter((n) => n > 0).length >= 2, `jobs ran on more than one replica (${ran.join(' + ')})`);
  const status = await fylr.status();
  const address = (status.addresses as { instances: string[]; connections: number }[])[0]!;
  s.t.ok(address.instances.length >= 2, `the pool reached ${address.instances.length} distinct instances through one address`);
  s.t.ok(address.connections <= 8, 'and stayed within its cap');
  s.notes.push(`pool reached ${address.instances.length} replicas; jobs per replica ${ran.join('/')}`);
});
