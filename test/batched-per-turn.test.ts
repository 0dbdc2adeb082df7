import { Writable } from 'node:stream';
import t from 'tap';
import { batchedPerTurn } from '../src/batched-per-turn.js';

/** A sink that records how its chunks arrived: one entry per underlying write. */
function recordingSink(): { sink: Writable; writes: string[][] } {
  const writes: string[][] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      writes.push([chunk.toString()]);
      cb();
    },
    writev(chunks, cb) {
      writes.push(chunks.map((c) => (c.chunk as Buffer).toString()));
      cb();
    },
  });
  return { sink, writes };
}

const nextTurn = (): Promise<void> => new Promise((r) => setImmediate(r));

t.test('the writes of one turn reach the sink as one write; the next turn starts a new one', async (t) => {
  const { sink, writes } = recordingSink();
  const batch = batchedPerTurn(sink);
  for (const s of ['a', 'b', 'c']) {
    batch();
    sink.write(s);
  }
  t.same(writes, [], 'held while the turn lasts');
  await nextTurn();
  t.same(writes, [['a', 'b', 'c']]);
  batch();
  sink.write('d');
  await nextTurn();
  t.same(writes, [['a', 'b', 'c'], ['d']]);
  t.equal(sink.writableCorked, 0, 'nothing stays corked');
});

t.test('without it, each write is its own', async (t) => {
  const { sink, writes } = recordingSink();
  for (const s of ['a', 'b']) sink.write(s);
  await nextTurn();
  t.same(writes, [['a'], ['b']], 'the difference the batching makes (the sink writes the first at once)');
});

t.test('an end in the same turn still flushes everything, in order, and the late uncork is harmless', async (t) => {
  const { sink, writes } = recordingSink();
  const batch = batchedPerTurn(sink);
  batch();
  sink.write('x');
  sink.end('y');
  await new Promise((r) => sink.once('finish', r));
  t.same(writes.flat(), ['x', 'y']);
  await nextTurn();
  t.equal(sink.writableCorked, 0);
});
