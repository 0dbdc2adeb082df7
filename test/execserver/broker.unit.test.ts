/**
 * Broker unit tests: the broker over an in-memory transport and a fake slot source, time from a
 * ManualClock (advanced, never slept). The same rules run over real sockets in the contract
 * (broker-contract.ts); here the time logic is pinned to the millisecond.
 */
import t, { type Test } from 'tap';
import { ManualClock } from '../../src/clock.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import type { BrokerConfig } from '../../src/config/types.js';
import { Broker, type BrokerSession } from '../../src/execserver/broker.js';
import type { BrokerObserver } from '../../src/execserver/broker-observer.js';
import type { BrokerTransport } from '../../src/execserver/broker-connection.js';
import { failedReceipt, type JobSpec, okReceipt, type Receipt } from '../../src/protocol/job.js';
import type { ExecMessage } from '../../src/protocol/messages.js';
import type { DemandView, JobIo, Slot, SlotSource } from '../../src/slots/slot-source.js';

// ---------------------------------------------------------------- fakes

interface Run {
  slot: Slot;
  job: JobSpec;
  io: JobIo;
  finish(receipt?: Receipt): void;
  fail(e: Error): void;
}

/** Slots counted in memory; a run ends when the test says so. */
class FakeSource implements SlotSource {
  readonly kind = 'local' as const;
  readonly #processes: Record<string, number>;
  readonly reserved = new Map<number, Slot>();
  readonly runs: Run[] = [];
  readonly demand: { wg: string; parked: number }[] = [];
  #next = 1;
  #listener: (wg: string) => void = () => undefined;

  constructor(processes: Record<string, number>) {
    this.#processes = { ...processes };
  }
  processes(wg: string): number {
    return this.#processes[wg] ?? 0;
  }
  setProcesses(wg: string, n: number): void {
    this.#processes[wg] = n;
    this.#listener(wg);
  }
  running(wg: string): number {
    return this.runs.filter((r) => r.slot.waitgroup === wg && !r.io.signal.aborted && !('ended' in r)).length;
  }
  inUse(wg: string): number {
    return [...this.reserved.values()].filter((s) => s.waitgroup === wg).length;
  }
  tryReserve(wg: string): Slot | null {
    if (this.inUse(wg) >= this.processes(wg)) return null;
    const slot: Slot = { id: this.#next++, waitgroup: wg, service: null };
    this.reserved.set(slot.id, slot);
    return slot;
  }
  spareServices(): string[] {
    return [];
  }
  release(slot: Slot): void {
    if (this.reserved.delete(slot.id)) this.#listener(slot.waitgroup);
  }
  run(slot: Slot, job: JobSpec, io: JobIo): Promise<Receipt> {
    return new Promise<Receipt>((resolve, reject) => {
      const end = (): void => {
        Object.assign(run, { ended: true });
        this.reserved.delete(slot.id);
        this.#listener(slot.waitgroup);
      };
      const run: Run = {
        slot,
        job,
        io,
        finish: (receipt = okReceipt(10)) => {
          end();
          resolve(receipt);
        },
        fail: (e) => {
          end();
          reject(e);
        },
      };
      this.runs.push(run);
      // A stopped process takes a moment to end: the run ends on a later microtask.
      io.signal.addEventListener('abort', () => queueMicrotask(() => run.finish({ ...failedReceipt('stopped', 'stopped'), stopped: true })), { once: true });
    });
  }
  onAvailable(listener: (wg: string) => void): void {
    this.#listener = listener;
  }
  demandChanged(wg: string, view: DemandView): void {
    this.demand.push({ wg, parked: view.parked(wg) });
  }
  async close(): Promise<void> {}
}

class FakePeer {
  readonly frames: ExecMessage[] = [];
  readonly closes: { code: number; reason: string }[] = [];
  terminated = false;
  pings = 0;
  readonly session: BrokerSession;
  #cursor = 0;

  /** `autoPong`: answer each ping at once, as a ws client does (default true). */
  constructor(broker: Broker, autoPong = true) {
    const transport: BrokerTransport = {
      send: (text) => this.frames.push(JSON.parse(text) as ExecMessage),
      close: (code, reason) => this.closes.push({ code, reason }),
      terminate: () => {
        this.terminated = true;
      },
      ping: () => {
        this.pings++;
        if (autoPong) this.session.alive();
      },
    };
    this.session = broker.open(transport, { remoteAddress: '127.0.0.1', localAddress: '127.0.0.1' });
  }

  send(frame: Record<string, unknown>): void {
    this.session.receive(JSON.stringify(frame), false);
  }
  want(jobId: string, service = 'echo', priority = 0): void {
    this.send({ type: 'WANT', job_id: jobId, service, priority });
  }
  /** Frames since the last call. */
  fresh(): ExecMessage[] {
    const out = this.frames.slice(this.#cursor);
    this.#cursor = this.frames.length;
    return out;
  }
  /** Frames since the last call, without HELLOs (re-sent whenever other peers come and go). */
  work(): ExecMessage[] {
    return this.fresh().filter((f) => f.type !== 'HELLO');
  }
  of<T extends ExecMessage['type']>(type: T): Extract<ExecMessage, { type: T }>[] {
    return this.frames.filter((f): f is Extract<ExecMessage, { type: T }> => f.type === type);
  }
  offer(jobId: string): Extract<ExecMessage, { type: 'OFFER' }> | undefined {
    return this.of('OFFER').find((o) => o.job_id === jobId);
  }
  get closed(): boolean {
    return this.terminated || this.closes.length > 0;
  }
}

function label(f: ExecMessage): string {
  if (f.type === 'ERROR') return `ERROR:${f.code}${f.job_id ? `(${f.job_id})` : ''}`;
  if (f.type === 'HELLO') return `HELLO(clients=${f.clients}${f.draining ? ',draining' : ''})`;
  return `${f.type}${'job_id' in f ? `(${f.job_id})` : ''}`;
}

function setup(opts: { processes?: number; broker?: Partial<BrokerConfig>; observer?: BrokerObserver } = {}) {
  const config = parseServeConfig({
    listen: '127.0.0.1:0',
    name: 'unit',
    waitgroups: { main: opts.processes ?? 1, other: 1 },
    commands: { echo: { prog: 'echo' }, sleep: { prog: 'sleep' } },
    services: { echo: { waitgroup: 'main', commands: ['echo'] }, sleep: { waitgroup: 'main', commands: ['sleep'] }, side: { waitgroup: 'other', commands: ['echo'] } },
    broker: { ping_interval_ms: 1000, offer_timeout_ms: 5000, ...opts.broker },
  });
  const clock = new ManualClock(0);
  const source = new FakeSource(config.waitgroups);
  const broker = new Broker({ config, source, clock, ...(opts.observer ? { observer: opts.observer } : {}) });
  return { clock, source, broker, connect: (autoPong = true) => new FakePeer(broker, autoPong) };
}

const echoJob: JobSpec = { service: 'echo', commands: [{ prog: 'echo', args: [] }] };

/** WANT + JOB on the offer: a running job holding a slot. */
function runJob(p: FakePeer, jobId: string, job: JobSpec = echoJob): void {
  p.want(jobId, job.service);
  const offer = p.offer(jobId);
  if (!offer) throw new Error(`no offer for ${jobId}: ${p.frames.map(label).join(' ')}`);
  p.send({ type: 'JOB', job_id: jobId, token: offer.token, job });
}

// ---------------------------------------------------------------- HELLO

t.test('HELLO is the first frame; re-sent on a change of clients at most every 100 ms, with the latest state', async (t) => {
  const { clock, connect } = setup();
  const a = connect();
  t.same(a.fresh().map(label), ['HELLO(clients=1)'], 'first frame, at once');
  clock.advance(10);
  const b = connect();
  t.same(b.fresh().map(label), ['HELLO(clients=2)']);
  clock.advance(40);
  const c = connect();
  t.same(a.fresh(), [], 'a change within 100 ms of the last HELLO waits');
  clock.advance(49); // t = 99
  t.same(a.fresh(), [], 'still within 100 ms');
  clock.advance(1); // t = 100
  t.same(a.fresh().map(label), ['HELLO(clients=3)'], 'one re-send with the latest count, not one per change');
  clock.advance(9); // t = 109
  t.same(b.fresh(), []);
  clock.advance(1); // t = 110
  t.same(b.fresh().map(label), ['HELLO(clients=3)'], 'each connection is throttled on its own');
  t.same(c.fresh().map(label), ['HELLO(clients=3)'], 'the newcomer had the latest state from the start');
  clock.advance(90); // t = 200
  c.session.closed();
  t.same(a.fresh().map(label), ['HELLO(clients=2)'], '100 ms after the last: sent at once');
  clock.advance(50); // t = 250
  const d = connect();
  clock.advance(10);
  d.session.closed(); // back to 2 before the throttle ends
  clock.advance(1000);
  t.same(a.fresh(), [], 'a change undone before the re-send is not sent');
  a.want('j1');
  a.want('j2');
  clock.advance(1000);
  t.same(a.fresh().map(label), ['OFFER(j1)'], 'running and parked counts do not trigger a HELLO');
});

t.test('HELLO is re-sent when processes change (a source reports it) or the server drains', async (t) => {
  const { clock, source, broker, connect } = setup({ processes: 2 });
  const a = connect();
  a.fresh();
  clock.advance(500);
  source.setProcesses('main', 5);
  const h = a.fresh();
  t.same(h.map(label), ['HELLO(clients=1)']);
  t.equal(h[0]?.type === 'HELLO' && h[0].waitgroups.main?.processes, 5);
  clock.advance(500);
  void broker.drain();
  t.same(a.fresh().map(label), ['HELLO(clients=1,draining)']);
});

// ---------------------------------------------------------------- rule 1

t.test('rule 1: grant order over three connections and two priorities, a newcomer before anyone twice', async (t) => {
  const { connect } = setup({ processes: 1 });
  const h = connect();
  runJob(h, 'hold');
  const a = connect();
  const b = connect();
  const c = connect();
  const peers = new Map([
    [a, 'A'],
    [b, 'B'],
    [c, 'C'],
  ]);
  a.want('a1', 'echo', 0);
  a.want('a2', 'echo', 0);
  b.want('b1', 'echo', 0);
  c.want('c1', 'echo', 0);
  c.want('c2', 'echo', 0);
  b.want('b2', 'echo', 5);
  a.want('a3', 'echo', 5);
  const order: string[] = [];
  const takeOffer = (): void => {
    for (const [p, name] of peers) {
      for (const f of p.fresh()) {
        if (f.type === 'OFFER') {
          order.push(`${name}:${f.job_id}`);
          p.send({ type: 'DECLINE', job_id: f.job_id, token: f.token });
          return;
        }
      }
    }
    throw new Error(`no offer; order so far ${order.join(' ')}`);
  };
  for (const p of peers.keys()) p.fresh();
  h.send({ type: 'CANCEL', job_id: 'hold' });
  await Promise.resolve(); // the fake run settles its promise
  await Promise.resolve();
  // Offers arrive one by one: each DECLINE hands the slot on at once.
  takeOffer(); // b2
  takeOffer(); // a3
  // Before a1 is declined, a connection parks for the first time.
  const d = connect();
  peers.set(d, 'D');
  const a1 = a.frames.filter((f) => f.type === 'OFFER').at(-1);
  t.equal(a1?.type === 'OFFER' && a1.job_id, 'a1', 'a1 is offered third');
  d.want('d1', 'echo', 0);
  d.fresh();
  order.push('A:a1');
  a.send({ type: 'DECLINE', job_id: 'a1', token: (a1 as { token: string }).token });
  a.fresh();
  for (let i = 0; i < 5; i++) takeOffer();
  t.same(order, ['B:b2', 'A:a3', 'A:a1', 'B:b1', 'C:c1', 'D:d1', 'A:a2', 'C:c2']);
});

// ---------------------------------------------------------------- rule 2

t.test('rule 2: an unanswered offer expires after offer_timeout_ms exactly: ERROR offer_expired, the want ends, the slot is re-offered', async (t) => {
  const events: string[] = [];
  const { clock, connect } = setup({ processes: 1, observer: { offerExpired: (wg) => events.push(`expired ${wg}`) } });
  const a = connect();
  const b = connect();
  a.want('a1');
  const offer = a.offer('a1')!;
  t.equal(offer.expires_ms, 5000);
  b.want('b1');
  a.work();
  b.work();
  clock.advance(4999);
  t.same(a.work(), [], 'alive at 4999 ms');
  t.same(b.work(), []);
  clock.advance(1);
  t.same(a.work().map(label), ['ERROR:offer_expired(a1)'], 'expired at 5000 ms');
  t.same(b.work().map(label), ['OFFER(b1)'], 're-offered in the same step');
  t.same(events, ['expired main']);
  a.send({ type: 'JOB', job_id: 'a1', token: offer.token, job: echoJob });
  a.send({ type: 'QUERY', job_id: 'a1' });
  t.same(a.work().map(label), ['ERROR:no_offer(a1)', 'ERROR:unknown_job(a1)'], 'the want ended');
  clock.advance(10_000);
  t.same(b.work().map(label), ['ERROR:offer_expired(b1)'], "b's offer lapses in turn, nobody else waits");
});

t.test('rule 2: DECLINE, UNWANT and JOB of an offer', async (t) => {
  const { source, connect } = setup({ processes: 1 });
  const a = connect();
  const b = connect();
  a.want('a1');
  b.want('b1');
  a.want('a2');
  const o1 = a.offer('a1')!;
  a.send({ type: 'DECLINE', job_id: 'a1', token: o1.token });
  t.ok(b.offer('b1'), 'DECLINE re-offers at once (to b: it parked first)');
  b.send({ type: 'UNWANT', job_id: 'b1' });
  const o2 = a.offer('a2');
  t.ok(o2, 'UNWANT of an offered job re-offers at once');
  a.send({ type: 'JOB', job_id: 'a2', token: o2!.token, job: echoJob });
  t.equal(source.runs.length, 1, 'JOB runs it');
  t.equal(source.inUse('main'), 1, 'the slot stays taken');
  b.want('b2');
  t.notOk(b.offer('b2'), 'no slot while it runs');
  source.runs[0]!.finish();
  await Promise.resolve();
  t.ok(b.offer('b2'), 'its end frees the slot');
  await Promise.resolve();
  t.same(a.of('DONE').map((d) => d.job_id), ['a2'], 'DONE once');
});

t.test('DONE is sent exactly once even if the slot source rejects', async (t) => {
  const { source, connect } = setup({ processes: 1 });
  const a = connect();
  runJob(a, 'j1');
  source.runs[0]!.fail(new Error('boom'));
  for (let i = 0; i < 5; i++) await Promise.resolve();
  const done = a.of('DONE');
  t.equal(done.length, 1);
  t.equal(done[0]?.receipt.ok, false);
  t.equal(done[0]?.receipt.error?.code, 'internal');
});

// ---------------------------------------------------------------- rules 3, 4

t.test('rule 3: a WANT with a free slot is offered in the same step', async (t) => {
  const made: (number | null)[] = [];
  const { connect } = setup({ processes: 2, observer: { offerMade: (_wg, ms) => made.push(ms) } });
  const a = connect();
  a.fresh();
  a.want('j1');
  t.same(a.fresh().map(label), ['OFFER(j1)']);
  t.same(made, [null], 'no slot-free-to-OFFER latency: the slot was free before anyone waited');
  a.want('j2');
  const [t1, t2] = [a.offer('j1')!.token, a.offer('j2')!.token];
  t.match(t1, /^[A-Za-z0-9_-]{22}$/, 'an offer token is 128 random bits, base64url');
  t.not(t1, t2, 'every offer has its own token');
});

t.test('slot-free-to-OFFER latency is measured from a slot freeing while wants wait', async (t) => {
  const made: (number | null)[] = [];
  const { clock, source, connect } = setup({ processes: 1, observer: { offerMade: (_wg, ms) => made.push(ms) } });
  const a = connect();
  runJob(a, 'j1');
  clock.advance(300);
  a.want('j2');
  clock.advance(200);
  source.runs[0]!.finish();
  t.same(made, [null, 0], 'the waiting want is offered the moment the slot frees');
  a.send({ type: 'DECLINE', job_id: 'j2', token: a.offer('j2')!.token });
  clock.advance(1000);
  a.want('j3');
  t.same(made, [null, 0, null], 'a slot that freed while nobody waited starts no latency (not 1000 ms)');
});

t.test('rule 4: idle means silent — 10 minutes without wants or jobs bring pings and nothing else', async (t) => {
  const { clock, connect } = setup();
  const a = connect();
  a.fresh();
  for (let i = 0; i < 600; i++) {
    clock.advance(1000);
    a.session.alive(); // the peer answers each ping
  }
  t.same(a.fresh(), [], 'no frame');
  t.equal(a.pings, 600, 'one ping per interval');
  t.notOk(a.closed);
});

// ---------------------------------------------------------------- liveness

t.test('half-open: a peer is terminated exactly 2 ping intervals after its last sign of life', async (t) => {
  const { clock, source, connect } = setup({ processes: 1 });
  const a = connect(false);
  runJob(a, 'j1');
  a.want('j2');
  clock.advance(1000);
  t.equal(a.pings, 1, 'pinged after one interval');
  a.session.alive(); // pong at 1000
  clock.advance(500);
  a.send({ type: 'QUERY', job_id: 'j2' }); // a frame at 1500 counts as life too
  clock.advance(1999); // t = 3499
  t.equal(a.terminated, false, 'not at 3499 ms');
  t.equal(a.pings, 3, 'pings at 1000, 2000, 3000');
  clock.advance(1); // t = 3500 = 1500 + 2 x 1000
  t.equal(a.terminated, true, 'terminated at 3500 ms, not at the next ping tick');
  t.equal(source.runs[0]!.io.signal.aborted, true, 'its running job is stopped');
  clock.advance(60_000);
  t.equal(a.pings, 3, 'no more pings to a dropped peer');
});

t.test('a peer that answers every ping is never dropped', async (t) => {
  const { clock, connect } = setup();
  const a = connect(false);
  for (let i = 0; i < 100; i++) {
    clock.advance(1000);
    a.session.alive(); // a pong after each ping
  }
  t.equal(a.closed, false);
  t.equal(a.pings, 100);
});

// ---------------------------------------------------------------- rule 5

t.test('rule 5: 100 refusals within 10 s are tolerated, the 101st closes with 1008; the window slides', async (t) => {
  const { clock, connect } = setup();
  const a = connect();
  for (let i = 0; i < 100; i++) a.session.receive('nope', false);
  t.equal(a.closed, false, '100 refusals');
  clock.advance(9_999);
  t.equal(a.closed, false);
  clock.advance(1); // the first 100 leave the window
  for (let i = 0; i < 100; i++) a.session.receive(Buffer.from('bin'), true);
  t.equal(a.closed, false, '100 more in a new window');
  clock.advance(5_000);
  a.session.receive('nope', false);
  t.same(a.closes, [{ code: 1008, reason: 'too many refused frames' }], 'the 101st within 10 s closes with 1008');
  t.equal(a.of('ERROR').length, 201, 'every refusal was answered first');
  t.same(new Set(a.of('ERROR').map((e) => e.code)), new Set(['bad_frame']));
});

t.test('rule 5: a refused frame changes nothing else', async (t) => {
  const { source, broker, connect } = setup({ processes: 1, broker: { max_wants_per_connection: 2 } });
  const a = connect();
  a.want('o1');
  const offer = a.offer('o1')!;
  a.want('p1');
  // Everything but the frame counters and the clock.
  const state = (): string => JSON.stringify({ ...broker.status(), connections: broker.status().connections.map((c) => ({ ...c, frames_in: 0, frames_out: 0 })) });
  const before = state();
  a.fresh();
  const frames: [unknown, string][] = [
    ['{', 'bad_frame'],
    [{ type: 'NOPE' }, 'unknown_type'],
    [{ type: 'WANT', job_id: 'x', service: 'echo', priority: 'high' }, 'invalid_field'],
    [{ type: 'WANT', job_id: 'x', service: 'nope', priority: 0 }, 'unknown_service'],
    [{ type: 'WANT', job_id: 'p1', service: 'echo', priority: 0 }, 'duplicate_job'],
    [{ type: 'WANT', job_id: 'o1', service: 'echo', priority: 0 }, 'duplicate_job'],
    [{ type: 'WANT', job_id: 'x', service: 'echo', priority: 0 }, 'too_many_wants'],
    [{ type: 'UNWANT', job_id: 'x' }, 'unknown_job'],
    [{ type: 'CANCEL', job_id: 'p1' }, 'unknown_job'],
    [{ type: 'QUERY', job_id: 'x' }, 'unknown_job'],
    [{ type: 'JOB', job_id: 'o1', token: 'forged', job: echoJob }, 'no_offer'],
    [{ type: 'JOB', job_id: 'o1', token: offer.token, job: { service: 'sleep' } }, 'invalid_field'],
    [{ type: 'DECLINE', job_id: 'p1', token: offer.token }, 'no_offer'],
  ];
  for (const [frame, code] of frames) {
    a.session.receive(typeof frame === 'string' ? frame : JSON.stringify(frame), false);
    const got = a.fresh();
    t.same(got.map((f) => (f.type === 'ERROR' ? f.code : f.type)), [code], `${JSON.stringify(frame)} -> ${code}`);
  }
  t.equal(state(), before, 'status unchanged (wants, offers, counts)');
  t.equal(source.runs.length, 0, 'nothing ran');
  a.send({ type: 'JOB', job_id: 'o1', token: offer.token, job: echoJob });
  t.equal(source.runs.length, 1, 'the offer is still good');
});

t.test('rule 5: while draining a WANT gets ERROR draining', async (t) => {
  const { broker, connect } = setup();
  const a = connect();
  void broker.drain();
  a.fresh();
  a.want('j1');
  t.same(a.fresh().map(label), ['ERROR:draining(j1)']);
});

// ---------------------------------------------------------------- rules 6, 7

t.test("rule 6: close drops the connection's wants, withdraws its offers, stops its jobs; the slots go to others", async (t) => {
  const { source, broker, connect } = setup({ processes: 2 });
  const a = connect();
  const b = connect();
  runJob(a, 'run');
  a.want('off');
  a.want('park');
  b.want('b1');
  b.want('b2');
  b.want('b3');
  b.fresh();
  a.session.closed('test');
  t.same(b.fresh().map(label), ['OFFER(b1)'], 'the withdrawn offer goes to b at once');
  t.equal(source.runs[0]!.io.signal.aborted, true, 'the running job is stopped');
  await Promise.resolve();
  t.same(b.fresh().map(label), ['OFFER(b2)'], "the stopped job's slot goes to b when it ended");
  t.equal(broker.book.parked('main'), 1, "only b3 waits: a's parked want was dropped");
  t.equal(a.of('DONE').length, 0, 'no DONE to a closed connection');
});

t.test('rule 7: drain — no new offers, HELLO draining, jobs finish with DONE, resolves when every slot is home', async (t) => {
  const { clock, source, broker, connect } = setup({ processes: 2 });
  const a = connect();
  runJob(a, 'run');
  const token = source.tryReserve('main'); // a legacy token outside the broker
  t.ok(token);
  a.want('park1');
  t.notOk(a.offer('park1'), 'both slots are busy');
  clock.advance(200);
  a.fresh();
  let drained = false;
  void broker.drain().then(() => {
    drained = true;
  });
  t.same(source.demand.at(-1), { wg: 'other', parked: 0 });
  t.ok(source.demand.some((d) => d.wg === 'main' && d.parked === 0), 'the source sees no demand while draining');
  t.same(a.fresh().filter((f) => f.type === 'HELLO').map(label), ['HELLO(clients=1,draining)']);
  source.release(token!);
  t.notOk(a.offer('park1'), 'a freed slot is not offered while draining');
  await Promise.resolve();
  t.equal(drained, false, 'a job still runs');
  source.runs[0]!.finish();
  for (let i = 0; i < 5; i++) await Promise.resolve();
  t.same(a.of('DONE').map((d) => [d.job_id, d.receipt.ok]), [['run', true]], 'the running job finished with DONE');
  t.equal(drained, true, 'drained once everything is home');
  t.equal(broker.book.parked('main'), 1, 'parked wants stay parked, unoffered');
});

t.test('rule 7: drain waits for an outstanding offer to be answered', async (t) => {
  const { source, broker, connect } = setup({ processes: 1 });
  const a = connect();
  a.want('j1');
  const offer = a.offer('j1')!;
  let drained = false;
  void broker.drain().then(() => {
    drained = true;
  });
  await Promise.resolve();
  t.equal(drained, false);
  a.send({ type: 'JOB', job_id: 'j1', token: offer.token, job: echoJob });
  t.equal(source.runs.length, 1, 'an offer made before the drain may still be accepted');
  source.runs[0]!.finish();
  for (let i = 0; i < 5; i++) await Promise.resolve();
  t.equal(drained, true);
});

// ---------------------------------------------------------------- queries

t.test('QUERY: POSITION of a parked, an offered and a running job; eta_ms null until a run time is known', async (t: Test) => {
  const { clock, source, connect } = setup({ processes: 1 });
  const a = connect();
  const b = connect();
  a.want('o1');
  b.want('p1');
  b.want('p2');
  const q = (p: FakePeer, id: string) => {
    p.send({ type: 'QUERY', job_id: id });
    return p.fresh().at(-1);
  };
  t.same(q(a, 'o1'), { type: 'POSITION', job_id: 'o1', running: 0, ahead: 0, capacity: 1, parked: 2, eta_ms: null }, 'offered');
  t.same(q(b, 'p2'), { type: 'POSITION', job_id: 'p2', running: 0, ahead: 1, capacity: 1, parked: 2, eta_ms: null }, 'parked, no estimate yet');
  a.send({ type: 'JOB', job_id: 'o1', token: a.offer('o1')!.token, job: echoJob });
  clock.advance(400);
  source.runs[0]!.finish({ ...okReceipt(400) });
  for (let i = 0; i < 3; i++) await Promise.resolve();
  // p1 now holds the offer; p2 is first in line, the one slot is taken.
  t.same(q(b, 'p2'), { type: 'POSITION', job_id: 'p2', running: 0, ahead: 0, capacity: 1, parked: 1, eta_ms: 800 }, 'wait one run for the slot, then run');
  b.send({ type: 'JOB', job_id: 'p1', token: b.offer('p1')!.token, job: echoJob });
  clock.advance(100);
  t.same(q(b, 'p1'), { type: 'POSITION', job_id: 'p1', running: 1, ahead: 0, capacity: 1, parked: 1, eta_ms: 300 }, 'running: the mean run time left');
});

t.test('runningByPriority counts broker jobs by the priority of their WANT, the rest as legacy', async (t) => {
  const { source, broker, connect } = setup({ processes: 3 });
  const a = connect();
  a.want('j1', 'echo', 5);
  a.send({ type: 'JOB', job_id: 'j1', token: a.offer('j1')!.token, job: echoJob });
  a.want('j2', 'echo', -1);
  a.send({ type: 'JOB', job_id: 'j2', token: a.offer('j2')!.token, job: echoJob });
  const legacy = source.tryReserve('main')!;
  void source.run(legacy, echoJob, { signal: new AbortController().signal });
  t.same([...broker.runningByPriority('main')].sort(), [['-1', 1], ['5', 1], ['legacy', 1]]);
});

t.test('a DECLINE that answers an offer its own UNWANT already withdrew is acknowledged silently', async (t) => {
  const { connect } = setup({ processes: 1 });
  const a = connect();
  a.want('a1');
  const offer = a.offer('a1')!;
  a.work();
  // The fylr's UNWANT crossed the OFFER on the wire; when the OFFER arrives it DECLINEs it.
  a.send({ type: 'UNWANT', job_id: 'a1' });
  a.send({ type: 'DECLINE', job_id: 'a1', token: offer.token });
  t.same(a.work().map(label), [], 'no ERROR no_offer: the race is not a refusal');
  a.send({ type: 'DECLINE', job_id: 'a1', token: offer.token });
  t.same(a.work().map(label), ['ERROR:no_offer(a1)'], 'only once: a second DECLINE is refused');
  a.want('a2');
  const o2 = a.offer('a2')!;
  a.send({ type: 'UNWANT', job_id: 'a2' });
  a.send({ type: 'DECLINE', job_id: 'a2', token: 'forged-token' });
  t.same(a.work().map(label).filter((l) => l.startsWith('ERROR')), ['ERROR:no_offer(a2)'], 'a DECLINE with another token is still refused');
  t.not(o2.token, 'forged-token');
});

t.test('200 UNWANT/DECLINE races in 10 s do not close the connection', async (t) => {
  const { connect } = setup({ processes: 1 });
  const a = connect();
  for (let i = 0; i < 200; i++) {
    a.want(`j${i}`);
    const o = a.offer(`j${i}`)!;
    a.send({ type: 'UNWANT', job_id: `j${i}` });
    a.send({ type: 'DECLINE', job_id: `j${i}`, token: o.token });
  }
  t.notOk(a.closed, 'still open');
  t.equal(a.of('ERROR').length, 0, 'no refusals');
});
