/**
 * The broker contract: PROTOCOL.md §1 (rules 1–7 and the frame/liveness rules above them), §2
 * (body-mode pipes, as the execserver side sees them) and the §5 gate that both new servers
 * share, as ONE named test each, over real 127.0.0.1 sockets and real processes. It is run for
 * every server that serves `/broker`:
 *
 *   test/execserver/broker-contract-native.test.ts   the native execserver (local slots)
 *   test/gateway/broker-contract-gateway.test.ts     the gateway (slots of legacy backends)
 *
 * ## The factory
 *
 *   brokerContract(t, factory)
 *   factory(opts: ContractOptions) => Promise<ContractServer>
 *
 * `opts.processes` is the number of slots of ONE waitgroup named `main`, which must hold exactly
 * the services of CONTRACT_SERVICES (`sleep`, `echo`, `cat`, `fail`), running the commands of
 * CONTRACT_COMMANDS under the same names (a gateway configures its legacy backends with them:
 * `contractServeConfig(opts)` builds a full `slotgate serve` config). `opts.broker` overrides the
 * broker settings of §6 (short ping intervals and offer timeouts keep the tests fast).
 *
 * The server must listen on 127.0.0.1 (port 0) and return:
 *   url           `http://127.0.0.1:PORT`; the broker is `url + '/broker'`, and the admin routes
 *                 of §7 (`/status`, `/readyz`, `POST /drain`) and the legacy API of §5 are there
 *   runningCount  jobs of the waitgroup running right now (processes, or PUTs to a backend)
 *   close()       stops everything; must also work after the server closed itself (drain)
 *
 * Nothing else is assumed: slots are "held busy" with `sleep` jobs (freed with CANCEL) or with
 * unanswered offers, never with hooks into a particular slot source. No test sleeps: each waits
 * for a frame, a close, or (where nothing announces it) polls a condition with a deadline.
 */
import type { Test } from 'tap';
import type { BrokerConfig, CommandConfig, ServeConfig, ServiceConfig } from '../../src/config/types.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { JobSpec } from '../../src/protocol/job.js';
import type { ExecMessage } from '../../src/protocol/messages.js';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { startPipeServer } from '../helpers/pipe-server.js';
import { eventually, within } from '../helpers/wait.js';

export const CONTRACT_WAITGROUP = 'main';

export const CONTRACT_COMMANDS: Record<string, CommandConfig> = {
  sleep: { prog: 'sleep', args: [], env: [] },
  echo: { prog: 'echo', args: [], env: [] },
  cat: { prog: 'cat', args: [], env: [] },
  // Writes $0 bytes of "x\n" to stdout, then fails with exit code 3.
  fail: { prog: 'sh', args: ['-c', 'yes x | head -c "$0"; exit 3'], env: [] },
};

export const CONTRACT_SERVICES: Record<string, ServiceConfig> = {
  sleep: { waitgroup: CONTRACT_WAITGROUP, commands: ['sleep'] },
  echo: { waitgroup: CONTRACT_WAITGROUP, commands: ['echo'] },
  cat: { waitgroup: CONTRACT_WAITGROUP, commands: ['cat'] },
  fail: { waitgroup: CONTRACT_WAITGROUP, commands: ['fail'] },
};

export interface ContractOptions {
  /** Slots of the waitgroup `main`. */
  processes: number;
  /** Overrides of the `broker:` settings (§6). */
  broker: Partial<BrokerConfig>;
}

export interface ContractServer {
  /** `http://127.0.0.1:PORT`, no trailing slash. */
  url: string;
  /** Jobs of the waitgroup running now. */
  runningCount(waitgroup: string): number | Promise<number>;
  /** Idempotent; also after the server closed itself. */
  close(): Promise<void>;
}

export type ContractFactory = (opts: ContractOptions) => Promise<ContractServer>;

/** A full native `slotgate serve` configuration for the contract (listen 127.0.0.1:0). */
export function contractServeConfig(opts: ContractOptions): ServeConfig {
  return parseServeConfig({
    listen: '127.0.0.1:0',
    name: 'contract',
    waitgroups: { [CONTRACT_WAITGROUP]: opts.processes },
    commands: CONTRACT_COMMANDS,
    services: CONTRACT_SERVICES,
    broker: opts.broker,
  });
}

const WG = CONTRACT_WAITGROUP;

/** Records the OFFERs of several peers in one arrival order. */
class OfferLog {
  readonly entries: { peer: string; jobId: string; token: string; peerRef: BrokerPeer }[] = [];
  #waiters: { n: number; resolve: () => void }[] = [];

  constructor(peers: Record<string, BrokerPeer>) {
    for (const [name, peer] of Object.entries(peers)) this.add(name, peer);
  }

  add(name: string, peer: BrokerPeer): void {
    peer.onFrame((f) => {
      if (f.type !== 'OFFER') return;
      this.entries.push({ peer: name, jobId: f.job_id, token: f.token, peerRef: peer });
      this.#waiters = this.#waiters.filter((w) => {
        if (this.entries.length < w.n) return true;
        w.resolve();
        return false;
      });
    });
  }

  /** Resolves with the n-th offer (1-based) once it arrived. */
  async nth(n: number, ms = 10_000): Promise<{ peer: string; jobId: string; token: string; peerRef: BrokerPeer }> {
    if (this.entries.length < n) {
      await within(new Promise<void>((resolve) => this.#waiters.push({ n, resolve })), ms, `offer #${n} (have ${this.labels().join(' ')})`);
    }
    return this.entries[n - 1]!;
  }

  labels(): string[] {
    return this.entries.map((e) => `${e.peer}:${e.jobId}`);
  }
}

function types(frames: ExecMessage[]): string[] {
  return frames.map((f) => (f.type === 'ERROR' ? `ERROR:${f.code}` : f.type));
}

export function brokerContract(t: Test, factory: ContractFactory): void {
  /** A server for one test, closed with its peers at the test's end. */
  async function serve(t: Test, processes: number, broker: Partial<BrokerConfig> = {}): Promise<ContractServer & { peer(opts?: Parameters<typeof BrokerPeer.connect>[1]): Promise<BrokerPeer> }> {
    const server = await factory({ processes, broker });
    const peers: BrokerPeer[] = [];
    t.teardown(async () => {
      for (const p of peers) p.terminate();
      await server.close();
    });
    return Object.assign(server, {
      async peer(opts?: Parameters<typeof BrokerPeer.connect>[1]) {
        const p = await BrokerPeer.connect(server.url, opts);
        peers.push(p);
        return p;
      },
    });
  }

  async function status(url: string): Promise<{ waitgroups: Record<string, { parked: number; offered: number; running: number }>; connections: unknown[] }> {
    const res = await fetch(`${url}/status`);
    return (await res.json()) as never;
  }

  /** Holds the one slot of `peer` busy with a sleep job; resolves once it runs. */
  async function hold(server: ContractServer, peer: BrokerPeer, jobId = 'hold'): Promise<void> {
    await peer.acquire(jobId, jobs.sleep(60));
    await eventually(async () => (await server.runningCount(WG)) >= 1, { what: 'the holding job to run' });
  }

  // ================================================================ §1 frames and liveness

  t.test('§1 HELLO is the first frame on every connection, with protocol, instance, services, waitgroups, clients, draining', async (t) => {
    const s = await serve(t, 2);
    const a = await s.peer();
    const b = await s.peer();
    for (const p of [a, b]) {
      const h = p.hello;
      t.equal(h.type, 'HELLO');
      t.equal(h.protocol, 1);
      t.type(h.instance_id, 'string');
      t.ok(h.instance_id.length > 0);
      t.type(h.name, 'string');
      t.same(h.services, { sleep: WG, echo: WG, cat: WG, fail: WG });
      t.equal(h.waitgroups[WG]?.processes, 2);
      t.equal(h.waitgroups[WG]?.running, 0);
      t.equal(h.waitgroups[WG]?.parked, 0);
      t.equal(h.draining, false);
    }
    t.equal(a.hello.clients, 1, 'the first connection was alone');
    t.equal(b.hello.clients, 2, 'the second sees two clients');
    t.equal(a.hello.instance_id, b.hello.instance_id, 'one instance');
  });

  t.test('§1 HELLO is re-sent when clients change, at most every 100 ms, with the latest state', async (t) => {
    const s = await serve(t, 2);
    const a = await s.peer();
    const arrivals: number[] = [Date.now()];
    a.onFrame((f) => {
      if (f.type === 'HELLO') arrivals.push(Date.now());
    });
    const others = [];
    for (let i = 0; i < 4; i++) others.push(await s.peer());
    await a.next('HELLO', (h) => h.clients === 5 && h !== a.hello);
    const hellos = a.all('HELLO');
    t.ok(hellos.length >= 2, 'HELLO was re-sent');
    t.ok(hellos.length <= 5, `4 quick changes make at most 4 re-sends (${hellos.length - 1})`);
    for (let i = 1; i < arrivals.length; i++) {
      // Arrival times carry network jitter on both ends; the server side spacing is >= 100 ms.
      t.ok(arrivals[i]! - arrivals[i - 1]! >= 80, `HELLO #${i + 1} came ${arrivals[i]! - arrivals[i - 1]!} ms after the one before`);
    }
    await others[0]!.close();
    const after = await a.next('HELLO', (h) => h.clients === 4);
    t.equal(after.clients, 4, 'a close is announced too');
    t.equal(after.draining, false);
  });

  t.test('§1 unknown fields are ignored', async (t) => {
    const s = await serve(t, 1);
    const p = await s.peer();
    p.send({ type: 'WANT', job_id: 'j1', service: 'echo', priority: 0, colour: 'blue', nested: { x: [1, 2] } });
    const offer = await p.next('OFFER', 'j1');
    p.send({ type: 'JOB', job_id: 'j1', token: offer.token, job: { ...jobs.echo('hi'), future_field: true }, extra: 1 });
    const done = await p.next('DONE', 'j1');
    t.equal(done.receipt.ok, true);
    t.equal(done.receipt.stdout_prefix, 'hi\n');
    t.same(types(p.all('ERROR')), [], 'nothing refused');
  });

  t.test('§1 the server pings every ping_interval_ms', async (t) => {
    const s = await serve(t, 1, { ping_interval_ms: 100 });
    const started = Date.now();
    const p = await s.peer();
    await p.waitPings(3);
    const took = Date.now() - started;
    t.ok(took >= 250, `3 pings took ${took} ms (>= 3 intervals, less jitter)`);
    t.ok(p.isOpen, 'a peer that answers stays connected');
  });

  t.test('§1 a half-open peer (stops answering pings) is dropped within 2 intervals, and its wants with it', async (t) => {
    const interval = 200;
    const s = await serve(t, 1, { ping_interval_ms: interval });
    const healthy = await s.peer();
    await hold(s, healthy);
    const silent = await s.peer({ autoPong: false });
    await silent.park('w1', 'echo');
    const lastSignOfLife = Date.now();
    const closed = await within(silent.closed, 10 * interval, 'the half-open peer to be dropped');
    const after = Date.now() - lastSignOfLife;
    t.equal(closed.code, 1006, 'terminated, no close handshake');
    t.ok(after >= 2 * interval - 50, `not before 2 intervals (${after} ms)`);
    // A check only at ping ticks would drop it up to a third interval later.
    t.ok(after <= 2 * interval + interval / 2, `within 2 intervals, plus half an interval of slack (${after} ms)`);
    t.ok(healthy.isOpen, 'the healthy peer stays');
    t.ok(healthy.pings >= 2, 'it was pinged meanwhile');
    const st = await eventually(async () => {
      const x = await status(s.url);
      return x.connections.length === 1 ? x : undefined;
    });
    t.equal(st.waitgroups[WG]!.parked, 0, "the dropped peer's want is gone");
  });

  // ================================================================ §1 rules

  t.test('rule 1: grant order — priority first, round-robin across connections (a newcomer before anyone twice), FIFO within one', async (t) => {
    const s = await serve(t, 1);
    const h = await s.peer();
    await hold(s, h);
    const a = await s.peer();
    const b = await s.peer();
    const c = await s.peer();
    const log = new OfferLog({ A: a, B: b, C: c });
    await a.park('a1', 'echo', 0);
    await a.park('a2', 'echo', 0);
    await b.park('b1', 'echo', 0);
    await c.park('c1', 'echo', 0);
    await c.park('c2', 'echo', 0);
    await b.park('b2', 'echo', 5);
    await a.park('a3', 'echo', 5);
    h.cancel('hold');
    t.equal((await h.next('DONE', 'hold')).receipt.stopped, true);

    const declineNth = async (n: number): Promise<void> => {
      const e = await log.nth(n);
      e.peerRef.decline(e.jobId, e.token);
    };
    await declineNth(1);
    await declineNth(2);
    const third = await log.nth(3);
    // A connection that first parks now is served before any connection of its class is served twice.
    const d = await s.peer();
    log.add('D', d);
    await d.park('d1', 'echo', 0);
    third.peerRef.decline(third.jobId, third.token);
    for (let n = 4; n <= 8; n++) await declineNth(n);
    t.same(log.labels(), ['B:b2', 'A:a3', 'A:a1', 'B:b1', 'C:c1', 'D:d1', 'A:a2', 'C:c2'], 'the exact order of offers');
    t.equal((await status(s.url)).waitgroups[WG]!.parked, 0);
  });

  t.test('rule 2: one taker per slot — each free slot is offered to exactly one want, which leaves the book', async (t) => {
    const s = await serve(t, 2, { offer_timeout_ms: 8000 });
    const peers = [await s.peer(), await s.peer(), await s.peer(), await s.peer()];
    const log = new OfferLog(Object.fromEntries(peers.map((p, i) => [`P${i}`, p])));
    peers.forEach((p, i) => {
      p.want(`x${i}`, 'sleep');
      p.want(`y${i}`, 'sleep');
    });
    await log.nth(2);
    for (const p of peers) await p.sync();
    const st = await status(s.url);
    t.equal(log.entries.length, 2, 'two slots, two offers');
    t.equal(new Set(log.labels()).size, 2, 'to two different wants');
    t.equal(st.waitgroups[WG]!.offered, 2);
    t.equal(st.waitgroups[WG]!.parked, 6, 'the offered wants left the book');
    const first = log.entries[0]!;
    first.peerRef.query(first.jobId);
    const pos = await first.peerRef.next('POSITION', first.jobId);
    t.equal(pos.ahead, 0, 'an offered job has nobody ahead');
    t.equal(pos.parked, 6);
    // JOB keeps the slot: no new offer while it runs.
    first.peerRef.job(first.jobId, first.token, jobs.sleep(60));
    await first.peerRef.sync();
    t.equal(log.entries.length, 2, 'JOB took the slot: nothing re-offered');
    const second = log.entries[1]!;
    second.peerRef.decline(second.jobId, second.token);
    await log.nth(3);
    for (const p of peers) await p.sync();
    t.equal(log.entries.length, 3, 'one freed slot, one offer');
    first.peerRef.cancel(first.jobId);
    await first.peerRef.next('DONE', first.jobId);
    await log.nth(4);
    for (const p of peers) await p.sync();
    t.equal(log.entries.length, 4);
  });

  t.test('rule 2: DECLINE ends the want and re-offers the slot at once', async (t) => {
    const s = await serve(t, 1);
    const a = await s.peer();
    const b = await s.peer();
    a.want('a1', 'echo');
    const offer = await a.next('OFFER', 'a1');
    await b.park('b1', 'echo');
    a.decline('a1', offer.token);
    const reoffer = await within(b.next('OFFER', 'b1'), 2000, 'the re-offer');
    t.type(reoffer.token, 'string');
    a.query('a1');
    await a.error('unknown_job', 'a1');
    t.pass('the declined want ended');
    b.job('b1', reoffer.token, jobs.echo('b'));
    t.equal((await b.next('DONE', 'b1')).receipt.ok, true);
  });

  t.test('rule 2: UNWANT of an offered job withdraws the offer and re-offers the slot at once', async (t) => {
    const s = await serve(t, 1);
    const a = await s.peer();
    const b = await s.peer();
    a.want('a1', 'echo');
    const offer = await a.next('OFFER', 'a1');
    await b.park('b1', 'echo');
    a.unwant('a1');
    await within(b.next('OFFER', 'b1'), 2000, 'the re-offer');
    a.job('a1', offer.token, jobs.echo('late'));
    await a.error('no_offer', 'a1');
    t.pass('the withdrawn offer cannot be accepted any more');
    // UNWANT of a parked want.
    await b.park('b2', 'echo');
    b.unwant('b2');
    b.query('b2');
    await b.error('unknown_job', 'b2');
  });

  t.test('rule 2: an unanswered offer expires with ERROR offer_expired, the want ends and the slot is re-offered', async (t) => {
    const s = await serve(t, 1, { offer_timeout_ms: 300 });
    const a = await s.peer();
    const b = await s.peer();
    a.want('a1', 'echo');
    const offer = await a.next('OFFER', 'a1');
    const offeredAt = Date.now();
    t.equal(offer.expires_ms, 300, 'the OFFER says how long it lives');
    await b.park('b1', 'echo');
    const expired = await a.error('offer_expired', 'a1');
    const after = Date.now() - offeredAt;
    t.ok(after >= 250, `not before offer_timeout_ms (${after} ms)`);
    t.match(expired.message, /300/);
    const reoffer = await within(b.next('OFFER', 'b1'), 2000, 'the re-offer');
    a.job('a1', offer.token, jobs.echo('late'));
    await a.error('no_offer', 'a1');
    a.query('a1');
    await a.error('unknown_job', 'a1');
    t.pass('the expired want ended');
    b.decline('b1', reoffer.token);
    t.ok(a.isOpen && b.isOpen, 'both connections stay open');
  });

  t.test('rule 3: a free slot answers a WANT with its OFFER immediately', async (t) => {
    const s = await serve(t, 2);
    const p = await s.peer();
    const sent = Date.now();
    p.want('j1', 'echo', 3);
    const offer = await within(p.next('OFFER', 'j1'), 1000, 'an immediate OFFER');
    t.ok(Date.now() - sent < 1000, `OFFER after ${Date.now() - sent} ms`);
    t.same(types(p.received), ['HELLO', 'OFFER'], 'the OFFER is the answer, nothing before it');
    p.job('j1', offer.token, jobs.empty('echo'));
    const done = await p.next('DONE', 'j1');
    t.equal(done.receipt.ok, true, 'a job with no commands succeeds at once');
    t.same(done.receipt.commands, []);
  });

  t.test('rule 4: idle means silent — no frames but ping/pong without wants or jobs, before and after work', async (t) => {
    const s = await serve(t, 1, { ping_interval_ms: 100 });
    const p = await s.peer();
    await p.waitPings(4);
    t.same(types(p.received), ['HELLO'], 'idle from the start: only HELLO');
    const done = await p.run('j1', jobs.echo('x'));
    t.equal(done.receipt.ok, true);
    const n = p.received.length;
    await p.waitPings(p.pings + 4);
    t.equal(p.received.length, n, `no frame in 4 idle intervals after the job (${types(p.received.slice(n)).join(' ')})`);
  });

  t.test('rule 5: every refused frame gets ERROR with its code, the connection stays open and nothing else changes', async (t) => {
    const s = await serve(t, 2, { offer_timeout_ms: 8000, max_wants_per_connection: 3 });
    const p = await s.peer();
    const other = await s.peer();
    // The HELLO that announces `other` (re-sent at most every 100 ms) must not count as a frame
    // sent in answer to the refusals below.
    await p.next('HELLO', (h) => h.clients === 2);
    await p.acquire('running', jobs.sleep(60));
    p.want('offered', 'echo');
    const offer = await p.next('OFFER', 'offered');
    await p.park('parked', 'echo');
    await other.park('o1', 'echo');
    const before = await status(s.url);
    p.query('parked');
    const posBefore = await p.next('POSITION', 'parked');

    const refusals: [string, () => void, string, string?][] = [
      ['not JSON', () => p.sendRaw('{"type": "WANT",'), 'bad_frame'],
      ['not an object', () => p.sendRaw('[1,2,3]'), 'bad_frame'],
      ['a JSON string', () => p.sendRaw('"WANT"'), 'bad_frame'],
      ['binary', () => p.sendRaw(Buffer.from(JSON.stringify({ type: 'WANT', job_id: 'bin', service: 'echo', priority: 0 })), { binary: true }), 'bad_frame'],
      ['unknown type', () => p.send({ type: 'GIMME', job_id: 'u1' }), 'unknown_type', 'u1'],
      ['a type of the other direction', () => p.send({ type: 'OFFER', job_id: 'u2', token: 't', expires_ms: 1 }), 'unknown_type', 'u2'],
      ['missing type', () => p.send({ job_id: 'u3' }), 'invalid_field', 'u3'],
      ['priority not an integer', () => p.send({ type: 'WANT', job_id: 'f1', service: 'echo', priority: 1.5 }), 'invalid_field', 'f1'],
      ['service missing', () => p.send({ type: 'WANT', job_id: 'f2', priority: 0 }), 'invalid_field', 'f2'],
      ['job not an object', () => p.send({ type: 'JOB', job_id: 'offered', token: offer.token, job: 'echo hi' }), 'invalid_field', 'offered'],
      ['job.service not the WANT\'s', () => p.job('offered', offer.token, jobs.sleep(1)), 'invalid_field', 'offered'],
      ['unknown service', () => p.want('s1', 'nope'), 'unknown_service', 's1'],
      ['duplicate of a parked want', () => p.want('parked', 'echo'), 'duplicate_job', 'parked'],
      ['duplicate of an offered job', () => p.want('offered', 'echo'), 'duplicate_job', 'offered'],
      ['duplicate of a running job', () => p.want('running', 'sleep'), 'duplicate_job', 'running'],
      ['UNWANT of an unknown job', () => p.unwant('zz'), 'unknown_job', 'zz'],
      ['UNWANT of a running job', () => p.unwant('running'), 'unknown_job', 'running'],
      ['CANCEL of an unknown job', () => p.cancel('zz'), 'unknown_job', 'zz'],
      ['CANCEL of a parked want', () => p.cancel('parked'), 'unknown_job', 'parked'],
      ['QUERY of an unknown job', () => p.query('zz'), 'unknown_job', 'zz'],
      ['JOB without an offer', () => p.job('parked', offer.token, jobs.echo()), 'no_offer', 'parked'],
      ['JOB with a forged token', () => p.job('offered', 'forged-token', jobs.echo()), 'no_offer', 'offered'],
      ['JOB of a running job (duplicate JOB)', () => p.job('running', offer.token, jobs.sleep(1)), 'no_offer', 'running'],
      ['DECLINE with a forged token', () => p.decline('offered', 'forged-token'), 'no_offer', 'offered'],
      ['DECLINE without an offer', () => p.decline('parked', offer.token), 'no_offer', 'parked'],
      ["a want over max_wants_per_connection", () => {
        p.want('m1', 'echo');
        p.want('m2', 'echo');
      }, 'too_many_wants', 'm2'],
    ];
    for (const [what, send, code, jobId] of refusals) {
      send();
      const e = await p.next('ERROR', undefined, 5000).catch((err: Error) => err);
      if (e instanceof Error) {
        t.fail(`${what}: ${e.message}`);
        continue;
      }
      t.equal(e.code, code, `${what}: ${code}`);
      if (jobId !== undefined) t.equal(e.job_id, jobId, `${what}: names its job`);
      t.type(e.message, 'string');
    }
    await p.sync();
    t.ok(p.isOpen, 'the connection stays open');
    t.same(types(p.unconsumed()), [], 'nothing but the ERRORs was sent');
    const after = await status(s.url);
    // m1 was parked (the one accepted WANT of the last case): 2 parked + 1 offered = 3 = the limit.
    t.equal(after.waitgroups[WG]!.parked, before.waitgroups[WG]!.parked + 1, 'parked wants unchanged but m1');
    t.equal(after.waitgroups[WG]!.offered, before.waitgroups[WG]!.offered, 'offers unchanged');
    t.equal(await s.runningCount(WG), 1, 'the running job still runs; nothing else started');
    p.query('parked');
    const pos = await p.next('POSITION', 'parked');
    t.equal(pos.ahead, posBefore.ahead, 'the parked want kept its place');
    p.job('offered', offer.token, jobs.echo('still valid'));
    const done = await p.next('DONE', 'offered');
    t.equal(done.receipt.stdout_prefix, 'still valid\n', 'the offer survived every refusal');
    p.cancel('running');
    t.equal((await p.next('DONE', 'running')).receipt.stopped, true, 'the running job was untouched until CANCEL');
  });

  t.test('rule 5: more than 100 refused frames within 10 s close the connection with 1008', async (t) => {
    const s = await serve(t, 1);
    const p = await s.peer();
    for (let i = 0; i < 100; i++) p.sendRaw('not json');
    await p.sync();
    t.equal(p.all('ERROR').length, 100, '100 refusals answered');
    t.ok(p.isOpen, '100 refusals are tolerated');
    p.sendRaw('not json');
    const closed = await within(p.closed, 5000, 'the 1008 close');
    t.equal(closed.code, 1008);
    t.equal(p.all('ERROR').length, 101, 'the 101st is answered, then the close');
    const q = await s.peer();
    t.ok(q.isOpen, 'the server takes new connections');
  });

  t.test('rule 5: a frame over max_payload_bytes closes the connection with 1009', async (t) => {
    const s = await serve(t, 1, { max_payload_bytes: 2048 });
    const p = await s.peer();
    p.send({ type: 'WANT', job_id: 'fits', service: 'echo', priority: 0, padding: 'x'.repeat(1900) });
    const offer = await p.next('OFFER', 'fits');
    t.ok(offer, 'a frame under the limit is fine');
    p.send({ type: 'WANT', job_id: 'big', service: 'echo', priority: 0, padding: 'x'.repeat(3000) });
    const closed = await within(p.closed, 5000, 'the 1009 close');
    t.equal(closed.code, 1009);
    const st = await eventually(async () => {
      const x = await status(s.url);
      return x.connections.length === 0 ? x : undefined;
    });
    t.equal(st.waitgroups[WG]!.offered, 0, "the closed connection's offer was withdrawn");
  });

  t.test("rule 6: a connection's close drops its wants, withdraws its offers, stops its running jobs; the slots are re-offered", async (t) => {
    const s = await serve(t, 2, { offer_timeout_ms: 8000 });
    const a = await s.peer();
    const b = await s.peer();
    await a.acquire('running', jobs.sleep(60));
    await eventually(async () => (await s.runningCount(WG)) === 1, { what: 'the job to run' });
    a.want('offered', 'echo');
    await a.next('OFFER', 'offered');
    await a.park('parked', 'echo');
    await b.park('b1', 'echo');
    await b.park('b2', 'echo');
    await b.park('b3', 'echo');
    a.terminate();
    const o1 = await within(b.next('OFFER', 'b1'), 3000, 'the withdrawn offer re-offered');
    const o2 = await within(b.next('OFFER', 'b2'), 5000, "the stopped job's slot re-offered");
    t.ok(o1 && o2);
    t.equal(await s.runningCount(WG), 0, 'the running job was stopped');
    await b.sync();
    t.same(b.all('OFFER').map((o) => o.job_id), ['b1', 'b2'], "a's parked want was dropped: b3 waits, nobody else got a slot");
    const st = await status(s.url);
    t.equal(st.waitgroups[WG]!.parked, 1, 'only b3 is parked');
    t.equal(st.connections.length, 1);
  });

  t.test('rule 7: drain (admin call) — HELLO draining, no new offers, new WANTs refused, /readyz 503, running jobs finish with DONE, then exit', async (t) => {
    const s = await serve(t, 1);
    const a = await s.peer();
    const b = await s.peer();
    await a.acquire('running', jobs.sleep(1.5));
    await eventually(async () => (await s.runningCount(WG)) === 1, { what: 'the job to run' });
    await b.park('parked', 'echo');
    t.equal((await fetch(`${s.url}/readyz`)).status, 200, 'ready before');
    const res = await fetch(`${s.url}/drain`, { method: 'POST' });
    t.equal(res.status, 202);
    const ha = await a.next('HELLO', (h) => h.draining);
    await b.next('HELLO', (h) => h.draining);
    t.equal(ha.draining, true, 'HELLO says draining');
    t.equal((await fetch(`${s.url}/readyz`)).status, 503, '/readyz answers 503 while draining');
    b.want('new', 'echo');
    await b.error('draining', 'new');
    const done = await a.next('DONE', 'running');
    t.equal(done.receipt.ok, true, 'the running job finished');
    t.equal(done.receipt.stopped, false, 'it was not stopped');
    const closed = await within(b.closed, 5000, 'the server to close after the drain');
    t.equal(closed.code, 1001, 'connections close with 1001 going away');
    t.same(b.all('OFFER'), [], 'no offer was made while draining, though a slot was free');
    await eventually(async () => fetch(`${s.url}/healthz`).then(() => false, () => true), { what: 'the listener to stop' });
    t.pass('the server stopped listening');
  });

  // ================================================================ §2 body-mode pipes

  t.test('§2 stdin is streamed from a GET of pipes.in, stdout PUT chunked to pipes.out, each exactly once', async (t) => {
    const s = await serve(t, 1);
    const pipes = await startPipeServer();
    t.teardown(() => pipes.close());
    const p = await s.peer();
    const src = pipes.source(3 * 1024 * 1024 + 17);
    const sink = pipes.sink();
    const done = await p.run('c1', jobs.cat({ in: src.url, out: sink.url }));
    t.equal(done.receipt.ok, true, done.receipt.error?.message ?? 'ok');
    const [sent, got] = await Promise.all([src.served, sink.received]);
    t.equal(got.bytes, sent.bytes, 'every byte arrived');
    t.equal(got.sha256, sent.sha256, 'unchanged');
    t.equal(got.complete, true);
    t.equal(got.chunked, true, 'the PUT is chunked');
    t.same(pipes.requests.map((r) => `${r.method} ${r.id === src.id ? 'in' : 'out'} ${r.status}`), ['GET in 200', 'PUT out 200'], 'each pipe requested once');
    t.equal(done.receipt.output_bytes, sent.bytes);
  });

  t.test("§2 pipe URLs on the broker connection's local address are reached", async (t) => {
    const s = await serve(t, 1);
    const p = await s.peer();
    const pipes = await startPipeServer({ host: p.localAddress });
    t.teardown(() => pipes.close());
    const src = pipes.source(10_000);
    const sink = pipes.sink();
    t.match(src.url, new RegExp(`^http://${p.localAddress.replace(/\./g, '\\.')}:`));
    const done = await p.run('c1', jobs.cat({ in: src.url, out: sink.url }));
    t.equal(done.receipt.ok, true);
    t.equal((await sink.received).sha256, (await src.served).sha256);
  });

  t.test('§2 a pipe that was served already (410) or never existed (404) fails the job with pipe_in_failed / pipe_out_failed, no hang', async (t) => {
    const s = await serve(t, 1);
    const pipes = await startPipeServer();
    t.teardown(() => pipes.close());
    const p = await s.peer();
    const used = pipes.source(100);
    await (await fetch(used.url)).arrayBuffer();
    t.equal((await fetch(used.url)).status, 410, 'the helper serves each pipe once');
    const sink = pipes.sink();
    const gone = await p.run('c410', jobs.cat({ in: used.url, out: sink.url }));
    t.equal(gone.receipt.ok, false);
    t.equal(gone.receipt.error?.code, 'pipe_in_failed');
    const missing = await p.run('c404', jobs.cat({ in: `${pipes.url}/pipe/AAAAAAAAAAAAAAAAAAAAAA`, out: pipes.sink().url }));
    t.equal(missing.receipt.error?.code, 'pipe_in_failed');
    t.equal(sink.started, false, 'nothing was PUT');
    const usedOut = pipes.sink();
    t.equal((await fetch(usedOut.url, { method: 'PUT', body: 'first' })).status, 200);
    const outGone = await p.run('o410', jobs.cat({ in: pipes.source(20_000).url, out: usedOut.url }));
    t.equal(outGone.receipt.ok, false, 'an out-pipe that answers 410 fails the job');
    t.equal(outGone.receipt.error?.code, 'pipe_out_failed');
  });

  t.test('§2 a command that fails with ≤ 4000 bytes of output never PUTs; DONE carries the failure and stdout_prefix', async (t) => {
    const s = await serve(t, 1);
    const pipes = await startPipeServer();
    t.teardown(() => pipes.close());
    const p = await s.peer();
    for (const bytes of [100, 4000]) {
      const sink = pipes.sink();
      const done = await p.run(`f${bytes}`, jobs.fail(bytes, { out: sink.url }));
      t.equal(done.receipt.ok, false, `${bytes} bytes: failed`);
      t.equal(done.receipt.exit_code, 3);
      t.equal(done.receipt.error?.code, 'command_failed');
      t.equal(done.receipt.stdout_prefix, 'x\n'.repeat(bytes / 2), `${bytes} bytes: the output is in stdout_prefix`);
      t.equal(sink.started, false, `${bytes} bytes: no PUT`);
    }
    t.same(pipes.requests, [], 'the pipe server saw nothing');
  });

  t.test('§2 output over 4000 bytes is committed; a failure after the commit aborts the PUT mid-stream, then DONE carries the error', async (t) => {
    const s = await serve(t, 1);
    const pipes = await startPipeServer();
    t.teardown(() => pipes.close());
    const p = await s.peer();
    for (const bytes of [4002, 1_000_000]) {
      const sink = pipes.sink();
      const done = await p.run(`f${bytes}`, jobs.fail(bytes, { out: sink.url }));
      t.equal(done.receipt.ok, false);
      t.equal(done.receipt.error?.code, 'command_failed');
      t.equal(done.receipt.stdout_prefix.length, 4000, 'the receipt keeps the first 4000 bytes');
      if (bytes > 500_000) {
        // Far more than every buffer on the way holds: the PUT certainly started before the end.
        const got = await within(sink.received, 5000, 'the PUT to end');
        t.equal(got.complete, false, `${bytes} bytes: the PUT was aborted, not ended`);
        t.ok(got.bytes > 4000 && got.bytes <= bytes, `${bytes} bytes: part of the output arrived (${got.bytes})`);
      } else if (sink.started) {
        // Just over the buffer: the aborted PUT may or may not have reached the server; never whole.
        t.equal((await within(sink.received, 5000, 'the PUT to end')).complete, false, `${bytes} bytes: the PUT was aborted`);
      } else {
        t.pass(`${bytes} bytes: the PUT was aborted before it reached the pipe`);
      }
    }
  });

  t.test('§2 a small successful output is PUT too (committed at the end)', async (t) => {
    const s = await serve(t, 1);
    const pipes = await startPipeServer();
    t.teardown(() => pipes.close());
    const p = await s.peer();
    const sink = pipes.sink();
    const job: JobSpec = { service: 'echo', commands: [{ prog: 'echo', args: [{ type: 'value', value: 'small' }], stdout: { type: 'body' } }], pipes: { out: sink.url } };
    const done = await p.run('e1', job);
    t.equal(done.receipt.ok, true);
    const got = await sink.received;
    t.equal(got.head, 'small\n');
    t.equal(got.complete, true);
  });

  // ================================================================ §5 (the gate both new servers share)

  t.test('§5 GET /token answers 503 with Retry-After: 1 while broker wants are parked in its waitgroup, 200 when not', async (t) => {
    const s = await serve(t, 2);
    const p = await s.peer();
    const free = await fetch(`${s.url}/token/echo`);
    t.equal(free.status, 200, 'a free slot and nobody parked: a token');
    t.type(((await free.json()) as { token?: unknown }).token, 'string');
    await p.acquire('running', jobs.sleep(60));
    await p.park('parked', 'echo');
    const gated = await fetch(`${s.url}/token/sleep`);
    t.equal(gated.status, 503, 'wants are parked: 503');
    t.equal(gated.headers.get('retry-after'), '1');
    t.same(await gated.json(), { Error: 'All workers busy', Status: 503 });
    p.unwant('parked');
    p.cancel('running');
    await p.next('DONE', 'running');
    await p.sync();
    const again = await fetch(`${s.url}/token/echo`);
    t.equal(again.status, 200, 'nobody parked any more: a token again');
  });
}
