/**
 * docs/protocol.md "When the gateway asks a backend for a token": one request in flight per
 * (backend, service) until an answer is a token; then up to MAX_TOKEN_REQUESTS_IN_FLIGHT at once,
 * never more than the slots the gateway does not hold; a 503 drops it back to one, paused for the
 * poll interval. The backend holds every answer until the test releases it, so "in flight" is
 * exact; the gateway runs on a ManualClock, so the poll interval passes only when the test says.
 */
import t from 'tap';
import { ManualClock } from '../../src/clock.js';
import type { GatewaySlotSource } from '../../src/gateway/gateway-slot-source.js';
import { MAX_TOKEN_REQUESTS_IN_FLIGHT } from '../../src/gateway/token-pump.js';
import { BrokerPeer } from '../helpers/broker-peer.js';
import { eventually } from '../helpers/wait.js';
import { startFakeBackend, type TokenAnswer } from './fake-backend.js';
import { type RunningGateway, startGateway, turns } from './gateway-world.js';

/** Waits until every answer sent has reached the gateway. */
async function answersIn(gw: RunningGateway): Promise<void> {
  const source = gw.server.source as GatewaySlotSource;
  await eventually(() => source.status().token_requests_in_flight === 0, { what: 'the answers to reach the gateway' });
  await turns();
}

async function heldBackend(t: { teardown(fn: () => unknown): void }) {
  const pending: ((a: TokenAnswer) => void)[] = [];
  let n = 0;
  const fake = await startFakeBackend(() => new Promise<TokenAnswer>((resolve) => pending.push(resolve)));
  t.teardown(() => fake.close());
  const tokenRequests = (): number => fake.requests.filter((r) => r.url.startsWith('/token/')).length;
  return {
    fake,
    tokenRequests,
    pending: () => pending.length,
    /** Answers the oldest pending request. */
    answer(kind: 'token' | 'busy') {
      const r = pending.shift();
      if (!r) throw new Error('no token request pending');
      r(kind === 'token' ? { status: 200, body: { token: `tok-${++n}` } } : { status: 503, body: { Error: 'no free slot', Status: 503 } });
    },
  };
}

t.test('one request at first, several while tokens come, one again after a 503', async (t) => {
  const clock = new ManualClock();
  const b = await heldBackend(t);
  const gw = await startGateway(t, { backends: [{ url: b.fake.url, waitgroups: { w: 6 } }], waitgroups: { w: 6 }, clock, gateway: { poll_interval_ms: 1000 } });
  const p = await BrokerPeer.connect(gw.url);
  t.teardown(() => p.close());
  for (let i = 1; i <= 10; i++) p.want(`j${i}`, 'echo');

  await eventually(() => b.pending() === 1, { what: 'the first token request' });
  await turns();
  t.equal(b.tokenRequests(), 1, 'before any answer, one request in flight for (backend, echo)');

  b.answer('token');
  await p.next('OFFER', 'j1');
  const cap = Math.min(MAX_TOKEN_REQUESTS_IN_FLIGHT, 6 - 1);
  await eventually(() => b.pending() === cap, { what: `${cap} requests in flight after a token` });
  await turns();
  t.equal(b.pending(), cap, `after a token: ${cap} in flight at once (the limit, below the ${6 - 1} slots not held)`);
  t.equal(b.tokenRequests(), 1 + cap);

  // The backend is full after all: the first 503 ends the streak, the others still in flight answer too.
  for (let i = 0; i < cap; i++) b.answer('busy');
  await answersIn(gw);
  t.equal(b.tokenRequests(), 1 + cap, 'after the 503s: paused, nothing more is asked');

  clock.advance(1000);
  await eventually(() => b.pending() === 1, { what: 'one request after the pause' });
  await turns(20);
  t.equal(b.pending(), 1, 'after the pause: one request at a time again');
  t.equal(b.tokenRequests(), 2 + cap);
});

t.test('never more requests in flight than slots the gateway does not hold', async (t) => {
  const b = await heldBackend(t);
  const gw = await startGateway(t, { backends: [{ url: b.fake.url, waitgroups: { w: 3 } }], waitgroups: { w: 3 }, clock: new ManualClock() });
  const p = await BrokerPeer.connect(gw.url);
  t.teardown(() => p.close());
  for (let i = 1; i <= 10; i++) p.want(`j${i}`, 'echo');
  await eventually(() => b.pending() === 1, { what: 'the first token request' });
  b.answer('token');
  await p.next('OFFER', 'j1');
  await eventually(() => b.pending() === 2, { what: 'two more requests' });
  b.answer('token');
  b.answer('token');
  await p.next('OFFER', 'j2');
  await p.next('OFFER', 'j3');
  await answersIn(gw);
  t.equal(b.tokenRequests(), 3, 'three slots, three tokens held: no fourth request');
});
