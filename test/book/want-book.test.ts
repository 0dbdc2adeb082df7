import t from 'tap';
import { SlotgateError } from '../../src/errors.js';
import { WantBook, type Want } from '../../src/book/want-book.js';

const WG = 'medium';

function want(connId: string, jobId: string, opts: { priority?: number; service?: string; waitgroup?: string } = {}): Want {
  return { jobId, connId, service: opts.service ?? 'convert', waitgroup: opts.waitgroup ?? WG, priority: opts.priority ?? 0 };
}

/** Parks `n` wants `${prefix}1..n` for a connection. */
function parkMany(book: WantBook, connId: string, prefix: string, n: number, opts: { priority?: number; service?: string; waitgroup?: string } = {}): void {
  for (let i = 1; i <= n; i++) book.park(want(connId, `${prefix}${i}`, opts));
}

/** Takes `n` grants (or all with n = Infinity) as "conn:job" labels. */
function take(book: WantBook, n = Infinity, wg = WG): string[] {
  const out: string[] = [];
  while (out.length < n) {
    const w = book.next(wg);
    if (w === undefined) break;
    out.push(`${w.connId}:${w.jobId}`);
  }
  return out;
}

t.test("the seed's example: A parked 100 and was served, B parks 1: the very next grant is B's", async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 101);
  t.same(take(book, 1), ['A:a1'], 'A alone is served');
  book.park(want('B', 'b1'));
  t.same(take(book, 1), ['B:b1'], 'B was never served in the class, A was');
  t.same(take(book, 2), ['A:a2', 'A:a3']);
  book.checkInvariants();
});

t.test('two never-served connections tie by join order: the first to park goes first, once', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 100);
  book.park(want('B', 'b1'));
  t.same(take(book, 3), ['A:a1', 'B:b1', 'A:a2']);
});

t.test('a served connection moves behind the others', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 2);
  parkMany(book, 'B', 'b', 2);
  parkMany(book, 'C', 'c', 2);
  t.same(take(book), ['A:a1', 'B:b1', 'C:c1', 'A:a2', 'B:b2', 'C:c2']);
  t.equal(book.size, 0);
});

t.test('a connection that newly parks is served before any connection is served twice', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 5);
  parkMany(book, 'B', 'b', 5);
  t.same(take(book, 3), ['A:a1', 'B:b1', 'A:a2']);
  book.park(want('C', 'c1'));
  // Rotation now B (served at 2), A (served at 3); C never served: C, then B, then A.
  t.same(take(book, 3), ['C:c1', 'B:b2', 'A:a3']);
  // The same holds in the middle of a round: after B is served, D arrives.
  t.same(take(book, 1), ['B:b3']);
  book.park(want('D', 'd1'));
  const round = take(book, 3);
  t.same(round, ['D:d1', 'A:a4', 'B:b4']);
});

t.test('a connection that empties and re-parks does not jump ahead of connections served before it', async (t) => {
  const book = new WantBook();
  parkMany(book, 'B', 'b', 3);
  book.park(want('A', 'a1'));
  parkMany(book, 'C', 'c', 3);
  t.same(take(book, 3), ['B:b1', 'A:a1', 'C:c1']);
  t.equal(book.connectionWants('A'), 0);
  t.equal(book.stats().rememberedMembers, 1, "A's last-served stamp is kept while its class has wants");
  book.park(want('A', 'a2'));
  // Served order was B < A < C; re-parking, A keeps its place: behind B, ahead of C.
  t.same(take(book, 3), ['B:b2', 'A:a2', 'C:c2']);
});

t.test('no starvation: a connection re-parking one want at a time alternates with a long FIFO', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 10);
  book.park(want('B', 'b0'));
  const grants: string[] = [];
  for (let i = 1; i <= 10; i++) {
    const w = book.next(WG);
    if (w === undefined) break;
    grants.push(w.connId);
    if (w.connId === 'B') book.park(want('B', `b${i}`)); // B's worker parks its next job at once
  }
  t.same(grants, ['A', 'B', 'A', 'B', 'A', 'B', 'A', 'B', 'A', 'B']);
});

t.test('priority beats arrival, across connections and inside one', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'low', 3, { priority: 0 });
  parkMany(book, 'A', 'mid', 1, { priority: 5 });
  book.park(want('B', 'high', { priority: 9 }));
  book.park(want('C', 'neg', { priority: -3 }));
  t.same(take(book), ['B:high', 'A:mid1', 'A:low1', 'A:low2', 'A:low3', 'C:neg']);
});

t.test('FIFO inside a connection, interleaved with others', async (t) => {
  const book = new WantBook();
  for (const j of ['x', 'y', 'z']) {
    book.park(want('A', `a-${j}`));
    book.park(want('B', `b-${j}`));
  }
  const got = take(book);
  t.same(got.filter((g) => g.startsWith('A:')), ['A:a-x', 'A:a-y', 'A:a-z']);
  t.same(got.filter((g) => g.startsWith('B:')), ['B:b-x', 'B:b-y', 'B:b-z']);
  t.same(got, ['A:a-x', 'B:b-x', 'A:a-y', 'B:b-y', 'A:a-z', 'B:b-z']);
});

t.test('removing a connection in the middle of a rotation', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 3);
  parkMany(book, 'B', 'b', 3);
  parkMany(book, 'C', 'c', 3);
  book.park(want('B', 'other', { waitgroup: 'fast' }));
  t.same(take(book, 1), ['A:a1']); // rotation: B, C, A
  const removed = book.removeConnection('B');
  t.same(
    removed.map((w) => w.jobId),
    ['b1', 'b2', 'b3', 'other'],
    'every want of B, all waitgroups, FIFO within each',
  );
  t.equal(book.connectionWants('B'), 0);
  t.notOk(book.has('b2', 'B'));
  t.equal(book.parked('fast'), 0);
  t.same([...book.waitgroups()], [WG]);
  t.same(take(book), ['C:c1', 'A:a2', 'C:c2', 'A:a3', 'C:c3']);
  t.same(book.removeConnection('B'), [], 'a second time: nothing');
  t.same(book.stats(), { wants: 0, waitgroups: 0, classes: 0, members: 0, rememberedMembers: 0, connections: 0 });
});

t.test("removeConnection drops the connection's last-served stamps", async (t) => {
  const book = new WantBook();
  book.park(want('A', 'a1'));
  book.park(want('A', 'fa1', { waitgroup: 'fast' }));
  parkMany(book, 'B', 'b', 2);
  parkMany(book, 'B', 'f', 2, { waitgroup: 'fast' });
  t.same(take(book, 1), ['A:a1']);
  t.same(take(book, 1, 'fast'), ['A:fa1']);
  t.equal(book.stats().rememberedMembers, 2, 'A is remembered in two classes');
  t.same(book.removeConnection('A'), [], 'no wants left, but...');
  t.same(book.stats(), { wants: 4, waitgroups: 2, classes: 2, members: 2, rememberedMembers: 0, connections: 1 });
  book.checkInvariants();
});

t.test('a class that empties forgets its stamps: a re-parking connection counts as never served', async (t) => {
  const book = new WantBook();
  book.park(want('A', 'a1'));
  t.same(take(book), ['A:a1']);
  t.same(book.stats(), { wants: 0, waitgroups: 0, classes: 0, members: 0, rememberedMembers: 0, connections: 0 }, 'nothing kept');
  book.park(want('A', 'a2'));
  book.park(want('D', 'd1'));
  // Had A's stamp survived, never-served D would go first; forgotten, A and D tie by join order.
  t.same(take(book), ['A:a2', 'D:d1']);
});

t.test('remove of a single want: head, middle and tail of a FIFO', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 5);
  parkMany(book, 'B', 'b', 2);
  t.same(book.remove('a1', 'A'), want('A', 'a1'), 'head');
  t.same(book.remove('a3', 'A'), want('A', 'a3'), 'middle');
  t.same(book.remove('a5', 'A'), want('A', 'a5'), 'tail');
  t.equal(book.remove('a3', 'A'), undefined, 'twice: gone');
  t.equal(book.remove('a2', 'B'), undefined, 'the key is (jobId, connId)');
  t.equal(book.connectionWants('A'), 2);
  t.same(book.position('a4', 'A'), { ahead: 2, parked: 4 }, 'a2, b1 before a4');
  t.same(take(book), ['A:a2', 'B:b1', 'A:a4', 'B:b2']);
});

t.test('a never-served connection that withdraws its last want leaves nothing behind', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 2);
  book.park(want('B', 'b1'));
  book.remove('b1', 'B');
  t.same(book.stats(), { wants: 2, waitgroups: 1, classes: 1, members: 1, rememberedMembers: 0, connections: 1 });
  book.checkInvariants();
  book.park(want('C', 'c1'));
  book.park(want('B', 'b2'));
  t.same(take(book), ['A:a1', 'C:c1', 'B:b2', 'A:a2'], 'B re-joined the never-served at the back');
});

t.test('remove is not a grant: the rotation does not move', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 2);
  parkMany(book, 'B', 'b', 2);
  book.remove('a1', 'A');
  t.same(take(book), ['A:a2', 'B:b1', 'B:b2']);
});

t.test('next(waitgroup, service) takes the first want of that service in grant order', async (t) => {
  const book = new WantBook();
  book.park(want('A', 'a1', { service: 's1' }));
  book.park(want('A', 'a2', { service: 's1' }));
  book.park(want('A', 'a3', { service: 's2' }));
  book.park(want('B', 'b1', { service: 's1' }));
  book.park(want('B', 'b2', { service: 's1' }));
  book.park(want('B', 'b3', { service: 's1' }));
  book.park(want('B', 'b4', { service: 's2' }));
  // Grant order: a1 b1 a2 b2 a3 b3 b4, so the first s2 is a3 (round 2), not b4 (round 3).
  t.equal(book.next(WG, 's2')?.jobId, 'a3');
  // As if a3 had been granted: A is now the most recently served, B goes first.
  t.same(take(book, 3), ['B:b1', 'A:a1', 'B:b2']);
  t.equal(book.next(WG, 'nope'), undefined, 'no want of that service');
  t.equal(book.size, 3, 'and nothing changed');
  t.same(take(book), ['A:a2', 'B:b3', 'B:b4']);
});

t.test('next(waitgroup, service): in the same round, the connection ahead in the rotation wins', async (t) => {
  const book = new WantBook();
  book.park(want('A', 'a1', { service: 's1' }));
  book.park(want('B', 'b1', { service: 's1' }));
  book.park(want('B', 'b2', { service: 's2' }));
  book.park(want('A', 'a2', { service: 's2' }));
  t.equal(book.next(WG, 's2')?.jobId, 'a2', 'a2 and b2 are both second in their FIFOs; A is ahead of B');
  t.equal(book.next(WG, 's2')?.jobId, 'b2');
  t.same(take(book), ['A:a1', 'B:b1'], 'A was served before B, so A goes first');
});

t.test('next(waitgroup, service) respects priority and rotation, and falls through to lower classes', async (t) => {
  const book = new WantBook();
  book.park(want('A', 'hi', { priority: 5, service: 's1' }));
  book.park(want('A', 'lo-a', { priority: 0, service: 's2' }));
  book.park(want('B', 'lo-b', { priority: 0, service: 's2' }));
  book.park(want('C', 'lo-c', { priority: 0, service: 's2' }));
  t.same(take(book, 1), ['A:hi']);
  t.same(book.next(WG, 's2'), want('A', 'lo-a', { service: 's2' }), 'A first in join order of class 0');
  book.park(want('A', 'hi2', { priority: 5, service: 's1' }));
  t.equal(book.next(WG, 's2')?.jobId, 'lo-b', 'class 5 has no s2: class 0, rotation continues at B');
  t.equal(book.next(WG, 's1')?.jobId, 'hi2');
  t.same(take(book), ['C:lo-c']);
});

t.test('peek is what next takes, and does not take it', async (t) => {
  const book = new WantBook();
  t.equal(book.peek(WG), undefined);
  parkMany(book, 'A', 'a', 2);
  parkMany(book, 'B', 'b', 1, { priority: 1 });
  for (let i = 0; i < 3; i++) {
    const p = book.peek(WG);
    t.equal(book.peek(WG), p, 'peek twice: same');
    t.equal(book.next(WG), p);
  }
  t.equal(book.peek(WG), undefined);
});

t.test('position() for every want matches the order in which next() grants them', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 6, { priority: 1 });
  parkMany(book, 'B', 'b', 2, { priority: 1 });
  parkMany(book, 'C', 'c', 4, { priority: 1 });
  parkMany(book, 'A', 'lo', 3, { priority: 0 });
  parkMany(book, 'D', 'd', 2, { priority: 0 });
  parkMany(book, 'E', 'top', 1, { priority: 7 });
  take(book, 3); // top1, a1, b1: a history in the rotation
  book.remove('c2', 'C'); // a hole in the middle of a FIFO
  book.park(want('B', 'b3', { priority: 1 }));
  const parked = book.size;
  const expected = new Map<string, number>();
  for (const conn of ['A', 'B', 'C', 'D']) {
    for (const w of [...Array(8).keys()].flatMap((i) => [`${conn.toLowerCase()}${i}`, `lo${i}`])) {
      const pos = book.position(w, conn);
      if (pos === undefined) continue;
      t.equal(pos.parked, parked);
      expected.set(`${conn}:${w}`, pos.ahead);
    }
  }
  t.equal(expected.size, parked, 'a position for every parked want');
  t.equal(book.position('top1', 'E'), undefined, 'granted: no position');
  const order = take(book);
  t.equal(order.length, parked);
  t.same(
    order.map((label) => expected.get(label)),
    order.map((_, i) => i),
    'ahead = index in the actual grant order',
  );
  t.same(order.slice(0, 4), ['C:c1', 'A:a2', 'B:b2', 'C:c3']);
});

t.test('waitgroups are independent', async (t) => {
  const book = new WantBook();
  parkMany(book, 'A', 'a', 2);
  parkMany(book, 'B', 'b', 2);
  book.park(want('A', 'fa1', { waitgroup: 'fast' }));
  book.park(want('B', 'fb1', { waitgroup: 'fast' }));
  book.park(want('A', 'fa2', { waitgroup: 'fast' }));
  t.same(take(book, 1), ['A:a1']);
  t.same(take(book, 1, 'fast'), ['A:fa1'], "A's grant in medium does not move A in fast");
  t.same(book.position('b1', 'B'), { ahead: 0, parked: 3 });
  t.same(book.position('fa2', 'A'), { ahead: 1, parked: 2 });
  t.same([...book.waitgroups()].sort(), ['fast', 'medium']);
  t.equal(book.next('slow'), undefined);
  t.same(take(book, Infinity, 'fast'), ['B:fb1', 'A:fa2']);
  t.same([...book.waitgroups()], ['medium']);
  t.equal(book.parked('fast'), 0);
  t.equal(book.parked('medium'), 3);
});

t.test('duplicate park throws and changes nothing; the key is (jobId, connId)', async (t) => {
  const book = new WantBook();
  book.park(want('A', 'j1'));
  book.park(want('B', 'j1'));
  t.throws(() => book.park(want('A', 'j1', { priority: 3 })), SlotgateError);
  try {
    book.park(want('A', 'j1', { waitgroup: 'fast' }));
    t.fail('should have thrown');
  } catch (e) {
    t.equal((e as SlotgateError).code, 'duplicate_job', 'also across waitgroups of one connection');
  }
  t.equal(book.size, 2);
  t.same([...book.waitgroups()], [WG]);
  t.same(book.parkedByPriority(WG), new Map([[0, 2]]));
  t.same(take(book), ['A:j1', 'B:j1']);
  book.park(want('A', 'j1'));
  t.ok(book.has('j1', 'A'), 'parked again after it left');
  t.throws(() => book.park(want('A', 'nan', { priority: Number.NaN })), RangeError);
  t.equal(book.size, 1);
  book.checkInvariants();
});

t.test('counts', async (t) => {
  const book = new WantBook();
  t.equal(book.size, 0);
  t.same([...book.waitgroups()], []);
  t.same(book.parkedByPriority(WG), new Map());
  t.equal(book.position('x', 'A'), undefined);
  parkMany(book, 'A', 'a', 3, { priority: 0 });
  parkMany(book, 'A', 'h', 2, { priority: 10 });
  parkMany(book, 'B', 'b', 4, { priority: 5 });
  book.park(want('B', 'f', { waitgroup: 'fast', priority: 5 }));
  t.equal(book.size, 10);
  t.equal(book.parked(WG), 9);
  t.equal(book.parked('fast'), 1);
  t.same([...book.parkedByPriority(WG)], [[10, 2], [5, 4], [0, 3]], 'highest priority first');
  t.equal(book.connectionWants('A'), 5);
  t.equal(book.connectionWants('B'), 5);
  t.equal(book.connectionWants('C'), 0);
  t.ok(book.has('h2', 'A'));
  t.notOk(book.has('h2', 'B'));
  t.same(book.get('f', 'B'), want('B', 'f', { waitgroup: 'fast', priority: 5 }));
  t.equal(book.get('f', 'A'), undefined);
  take(book, 2);
  t.same([...book.parkedByPriority(WG)], [[5, 4], [0, 3]], 'an emptied class is gone');
  t.equal(book.connectionWants('A'), 3);
  t.same(book.position('a3', 'A'), { ahead: 6, parked: 7 });
  t.same(book.stats(), { wants: 8, waitgroups: 2, classes: 3, members: 3, rememberedMembers: 0, connections: 2 });
  book.checkInvariants();
});

t.test('returns the very objects parked', async (t) => {
  const book = new WantBook();
  const w = want('A', 'a1');
  book.park(w);
  t.equal(book.get('a1', 'A'), w);
  t.equal(book.peek(WG), w);
  t.equal(book.next(WG), w);
});
