/**
 * docs/protocol.md "A higher-priority want for another service, while a token request is in
 * flight": the request in flight is not aborted, the new head is asked for at once, and the late
 * token goes to a want of its own service, or is given back.
 */
import t from 'tap';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { eventually } from '../helpers/wait.js';
import { startFakeBackend, type TokenAnswer } from './fake-backend.js';
import { startGateway } from './gateway-world.js';

/** A backend whose token answers wait until the test releases them, one per service. */
async function heldBackend(t: { teardown(fn: () => unknown): void }) {
  const pending = new Map<string, (a: TokenAnswer) => void>();
  let n = 0;
  const fake = await startFakeBackend(
    (service) =>
      new Promise<TokenAnswer>((resolve) => {
        pending.set(service, resolve);
      }),
  );
  t.teardown(() => fake.close());
  return {
    fake,
    asked: (service: string) => fake.requests.some((r) => r.url === `/token/${service}`),
    release(service: string) {
      const r = pending.get(service);
      if (!r) throw new Error(`no token request for ${service} pending`);
      pending.delete(service);
      r({ status: 200, body: { token: `${service}-token-${++n}` } });
    },
  };
}

t.test('the new head is asked for at once; the late token goes to the best want of its own service', async (t) => {
  const b = await heldBackend(t);
  const gw = await startGateway(t, { backends: [b.fake.url], waitgroups: { w: 2 } });
  const low = await BrokerPeer.connect(gw.url);
  const high = await BrokerPeer.connect(gw.url);
  t.teardown(() => Promise.all([low.close(), high.close()]));

  low.want('e1', 'echo', 0);
  await eventually(() => b.asked('echo'), { what: 'the echo token request' });
  high.want('s1', 'sleep', 10);
  await eventually(() => b.asked('sleep'), { what: 'a sleep token request while the echo one is in flight' });
  t.equal(b.fake.requests.filter((r) => r.url === '/token/echo').length, 1, 'the echo request was not repeated or aborted');

  b.release('sleep');
  const os = await high.next('OFFER', 's1');
  b.release('echo');
  const oe = await low.next('OFFER', 'e1');
  high.job('s1', os.token, jobs.sleep(0));
  low.job('e1', oe.token, jobs.echo('late'));
  await high.next('DONE', 's1');
  await low.next('DONE', 'e1');
  const puts = b.fake.requests.filter((r) => r.method === 'PUT');
  t.same(
    puts.map((r) => `${r.job?.service}:${r.job?.token}`).sort(),
    ['echo:echo-token-2', 'sleep:sleep-token-1'],
    'each token redeemed for its own service, by the want of that service',
  );
  t.equal(puts.length, 2);
});

t.test('a late token whose service nobody wants any more is given back at once', async (t) => {
  const b = await heldBackend(t);
  const gw = await startGateway(t, { backends: [b.fake.url], waitgroups: { w: 2 } });
  const p = await BrokerPeer.connect(gw.url);
  t.teardown(() => p.close());
  p.want('e1', 'echo', 0);
  await eventually(() => b.asked('echo'), { what: 'the echo token request' });
  p.unwant('e1');
  await p.sync();
  b.release('echo');
  await eventually(() => b.fake.requests.some((r) => r.method === 'PUT'), { what: 'the give-back' });
  const put = b.fake.requests.find((r) => r.method === 'PUT');
  t.same(put?.job, { service: 'echo', commands: [], token: 'echo-token-1' }, 'redeemed with a job that has no commands');
  t.same(p.all('OFFER'), [], 'nobody was offered it');
});
