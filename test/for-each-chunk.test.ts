import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough, Readable } from 'node:stream';
import t from 'tap';
import { forEachChunk } from '../src/for-each-chunk.js';

/** A stream that pushes `pieces` all in one read() call, as an HTTP parser does with one socket read. */
function burst(pieces: Buffer[]): Readable {
  let sent = false;
  return new Readable({
    read() {
      if (sent) return;
      sent = true;
      for (const p of pieces) this.push(p);
      this.push(null);
    },
  });
}

interface Deferred {
  promise: Promise<void>;
  resolve: () => void;
  reject: (e: Error) => void;
}
function deferred(): Deferred {
  let resolve!: () => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Resolves once `cond` holds, checked after each turn of the event loop (at most 2 s). */
async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise<void>((r) => setImmediate(r));
  if (!cond()) throw new Error(`${what}: not within 2000 turns`);
}

t.test('hands over each piece as it was pushed, in order, without joining pieces', async (t) => {
  const pieces = [Buffer.from('one'), Buffer.from('two'), Buffer.from('three')];
  const seen: Buffer[] = [];
  await forEachChunk(burst(pieces), (c) => {
    seen.push(c);
  });
  t.equal(seen.length, 3, 'three pieces pushed in one read are three chunks (an async iterator yields one joined buffer)');
  t.ok(
    seen.every((c, i) => c === pieces[i]),
    'the very buffers that were pushed: nothing copied',
  );
});

t.test('a pending take holds the next chunk back until it settles', async (t) => {
  const src = new PassThrough();
  const seen: string[] = [];
  const gate = deferred();
  const done = forEachChunk(src, (c) => {
    seen.push(c.toString());
    return seen.length === 1 ? gate.promise : undefined;
  });
  src.write('a');
  src.write('b');
  src.end('c');
  await until(() => seen.length === 1, 'first chunk');
  for (let i = 0; i < 20; i++) await new Promise<void>((r) => setImmediate(r));
  t.same(seen, ['a'], 'nothing more is taken while the first take is pending');
  let resolved = false;
  void done.then(() => (resolved = true));
  t.notOk(resolved, 'not resolved while a take is pending');
  gate.resolve();
  await done;
  t.equal(seen.join(''), 'abc', 'the rest follows, in order, once it settled');
});

t.test('a take that rejects ends the walk: rejected with its error, no chunk taken after it', async (t) => {
  const src = burst([Buffer.from('a'), Buffer.from('b'), Buffer.from('c')]);
  const seen: string[] = [];
  await t.rejects(
    forEachChunk(src, (c) => {
      seen.push(c.toString());
      return seen.length === 1 ? Promise.reject(new Error('sink broke')) : undefined;
    }),
    { message: 'sink broke' },
  );
  t.same(seen, ['a']);
});

t.test('a take that throws ends the walk at once, even amid a burst', async (t) => {
  const seen: string[] = [];
  await t.rejects(
    forEachChunk(burst([Buffer.from('a'), Buffer.from('b'), Buffer.from('c')]), (c) => {
      seen.push(c.toString());
      if (c.toString() === 'b') throw new Error('bad chunk');
    }),
    { message: 'bad chunk' },
  );
  t.same(seen, ['a', 'b'], 'the chunk after the throw is not taken');
});

t.test("the stream's error rejects", async (t) => {
  const src = new PassThrough();
  const done = forEachChunk(src, () => undefined);
  src.write('x');
  src.destroy(new Error('socket reset'));
  await t.rejects(done, { message: 'socket reset' });
});

t.test('a stream closed before its end rejects (a body cut short is not a success)', async (t) => {
  const src = new PassThrough();
  const done = forEachChunk(src, () => undefined);
  src.write('x');
  src.destroy();
  await t.rejects(done, { code: 'ERR_STREAM_PREMATURE_CLOSE' });
});

t.test('an HTTP body cut off mid-stream by its server rejects; a whole one resolves with every byte', async (t) => {
  const piece = Buffer.alloc(64 * 1024, 'x');
  const server = http.createServer((req, res) => {
    res.writeHead(200);
    for (let i = 0; i < 15; i++) res.write(piece);
    // Cut only once the bytes are out, so the answer's head and body did arrive.
    if (req.url === '/cut') res.write(piece, () => res.socket?.destroy());
    else res.end(piece);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => server.close());
  const port = (server.address() as AddressInfo).port;
  const get = (path: string): Promise<http.IncomingMessage> =>
    new Promise((resolve, reject) => http.get({ host: '127.0.0.1', port, path, agent: false }, resolve).on('error', reject));

  let bytes = 0;
  await forEachChunk(await get('/whole'), (c) => {
    bytes += c.length;
  });
  t.equal(bytes, 16 * piece.length);
  await t.rejects(forEachChunk(await get('/cut'), () => undefined));
});
