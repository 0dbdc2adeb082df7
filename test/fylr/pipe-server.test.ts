import { PassThrough, Readable, Writable } from 'node:stream';
import net from 'node:net';
import t from 'tap';
import { request } from 'undici';
import { ManualClock } from '../../src/clock.js';
import { hostForUrl, pipeBaseUrl } from '../../src/fylr/pipe-url.js';
import { startPipeApp } from './fixtures.js';

t.test('pipe ids carry at least 128 random bits, base64url', async (t) => {
  const { pipes } = await startPipeApp(t);
  const ids = new Set<string>();
  for (let i = 0; i < 50; i++) {
    const p = pipes.createIn(undefined);
    t.match(p.id, /^[A-Za-z0-9_-]+$/);
    t.ok(Buffer.from(p.id, 'base64url').length * 8 >= 128, 'at least 128 bits');
    ids.add(p.id);
  }
  t.equal(ids.size, 50, 'no two ids alike');
});

t.test('an in-pipe is served once: 200 with the stdin, then 410; unknown ids 404', async (t) => {
  const { pipes, url } = await startPipeApp(t);
  const p = pipes.createIn(Readable.from([Buffer.from('hello '), Buffer.from('pipe')]));
  const first = await request(`${url}${p.path}`);
  t.equal(first.statusCode, 200);
  t.equal(await first.body.text(), 'hello pipe');
  const r = await p.result;
  t.same({ started: r.started, ok: r.ok, bytes: r.bytes }, { started: true, ok: true, bytes: 10 });

  const second = await request(`${url}${p.path}`);
  t.equal(second.statusCode, 410);
  t.equal(((await second.body.json()) as { error: { code: string } }).error.code, 'pipe_used');

  const unknown = await request(`${url}/pipe/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA`);
  t.equal(unknown.statusCode, 404);
  t.equal(((await unknown.body.json()) as { error: { code: string } }).error.code, 'pipe_not_found');

  // An in-pipe id is not an out-pipe: a PUT to it is unknown too, and does not use it up.
  const q = pipes.createIn(undefined);
  const wrong = await request(`${url}${q.path}`, { method: 'PUT', body: 'x' });
  t.equal(wrong.statusCode, 404);
  await wrong.body.dump();
  const right = await request(`${url}${q.path}`);
  t.equal(right.statusCode, 200);
  t.equal(await right.body.text(), '', 'no stdin: an empty body');
});

t.test('an out-pipe is written into the sink once, then 410', async (t) => {
  const { pipes, url } = await startPipeApp(t);
  const chunks: Buffer[] = [];
  const sink = new Writable({
    write(c: Buffer, _e, cb) {
      chunks.push(c);
      cb();
    },
  });
  const p = pipes.createOut(sink);
  const put = await request(`${url}${p.path}`, { method: 'PUT', body: 'out data', headers: { 'content-type': 'application/octet-stream' } });
  t.equal(put.statusCode, 204);
  await put.body.dump();
  const r = await p.result;
  t.same({ started: r.started, ok: r.ok, bytes: r.bytes }, { started: true, ok: true, bytes: 8 });
  t.equal(Buffer.concat(chunks).toString(), 'out data');
  t.ok(sink.writableFinished, 'the sink was ended');

  const again = await request(`${url}${p.path}`, { method: 'PUT', body: 'more' });
  t.equal(again.statusCode, 410);
  await again.body.dump();
  // A PUT with no content type is taken as well (the parser is a pass-through).
  const q = pipes.createOut(undefined);
  const bare = await request(`${url}${q.path}`, { method: 'PUT', body: Readable.from([Buffer.from('abc')]) });
  t.equal(bare.statusCode, 204);
  await bare.body.dump();
  t.equal((await q.result).bytes, 3);
});

t.test('unused pipes expire after the ttl (404), used ones answer 410 until then', async (t) => {
  const clock = new ManualClock();
  const { pipes, url } = await startPipeApp(t, { clock, ttlMs: 1000 });
  const status = async (path: string, method: 'GET' | 'PUT' = 'GET'): Promise<number> => {
    const r = await request(`${url}${path}`, method === 'PUT' ? { method, body: 'x' } : {});
    await r.body.dump();
    return r.statusCode;
  };
  const a = pipes.createIn(undefined);
  const b = pipes.createIn(undefined);
  t.equal(await status(b.path), 200, 'b used at t=0');
  clock.advance(999);
  t.equal(await status(a.path), 200, 'a still there 1 ms before its ttl; used at t=999');
  t.equal(await status(b.path), 410, 'b used: 410');
  const c = pipes.createOut(undefined);
  clock.advance(1);
  t.equal(await status(b.path), 404, "b's tombstone forgotten one ttl after its use");
  clock.advance(998);
  t.equal(await status(a.path), 410, 'a: still 410 at t=1998');
  clock.advance(1);
  t.equal(await status(c.path, 'PUT'), 404, 'c expired unused at t=1999');
  const r = await c.result;
  t.equal(r.started, false, 'an expired pipe settles as never started');
  t.equal(await status(a.path), 404, "a's tombstone forgotten too");
  t.equal(pipes.size, 0, 'nothing left');
});

t.test('discard() forgets an unused pipe at once', async (t) => {
  const { pipes, url } = await startPipeApp(t);
  const p = pipes.createOut(undefined);
  p.discard();
  const res = await request(`${url}${p.path}`, { method: 'PUT', body: 'x' });
  t.equal(res.statusCode, 404);
  await res.body.dump();
});

t.test('streams with backpressure: 8 MiB through a slow sink, never all buffered', async (t) => {
  const { pipes, url } = await startPipeApp(t);
  const total = 8 * 1024 * 1024;
  let received = 0;
  let pending = 0;
  let maxPending = 0;
  const sink = new Writable({
    highWaterMark: 64 * 1024,
    write(c: Buffer, _e, cb) {
      received += c.length;
      pending++;
      maxPending = Math.max(maxPending, pending);
      setImmediate(() => {
        pending--;
        cb();
      });
    },
  });
  const p = pipes.createOut(sink);
  let produced = 0;
  const source = new Readable({
    read() {
      if (produced >= total) {
        this.push(null);
        return;
      }
      produced += 64 * 1024;
      this.push(Buffer.alloc(64 * 1024, 7));
    },
  });
  const put = await request(`${url}${p.path}`, { method: 'PUT', body: source });
  t.equal(put.statusCode, 204);
  await put.body.dump();
  t.equal(received, total);
  t.equal(maxPending, 1, 'one write at a time: the server waits for the sink');

  // stdin: a GET consumer that stalls makes the server stop pulling from the caller's Readable.
  // Socket buffers on loopback hold a few MiB; 64 MiB cannot all fit.
  const inTotal = 64 * 1024 * 1024;
  let pulled = 0;
  const stdin = new Readable({
    highWaterMark: 64 * 1024,
    read() {
      if (pulled >= inTotal) {
        this.push(null);
        return;
      }
      pulled += 64 * 1024;
      this.push(Buffer.alloc(64 * 1024, 1));
    },
  });
  const q = pipes.createIn(stdin);
  const res = await request(`${url}${q.path}`);
  const it = res.body[Symbol.asyncIterator]();
  await it.next();
  // Wait until the server stops pulling (its writes wait for 'drain'), then look.
  let last = -1;
  let stableSince = Date.now();
  while (Date.now() - stableSince < 100) {
    if (pulled !== last) {
      last = pulled;
      stableSince = Date.now();
    }
    if (pulled >= inTotal) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  t.ok(pulled < inTotal / 4, `pulled ${pulled} of ${inTotal} while the reader stalls`);
  let got = (await it.next()).value ? 1 : 0;
  for (;;) {
    const n = await it.next();
    if (n.done) break;
    got += (n.value as Buffer).length;
  }
  t.ok(got > 0);
  t.equal(pulled, inTotal, 'everything flows once the reader reads');
});

t.test('an aborted PUT is a failed out-pipe, even when bytes arrived', async (t) => {
  const { pipes, port } = await startPipeApp(t);
  const sink = new PassThrough();
  const p = pipes.createOut(sink);
  const sock = net.connect(port, '127.0.0.1');
  await new Promise<void>((r) => sock.once('connect', () => r()));
  // Wait until the server has the bytes, then drop the socket mid-body.
  const arrived = new Promise<void>((resolve) => sink.once('data', () => resolve()));
  sock.write(`PUT ${p.path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n`);
  await arrived;
  sock.destroy();
  const r = await p.result;
  t.equal(r.started, true);
  t.equal(r.ok, false);
  t.equal(r.bytes, 5);
  t.match(r.error, /aborted/);
  t.ok(sink.destroyed, 'the sink is destroyed, not ended');
  t.notOk(sink.writableFinished);
});

t.test('pipe URLs: local address of the connection, brackets for IPv6, own URL overrides', async (t) => {
  t.equal(hostForUrl('10.1.2.3'), '10.1.2.3');
  t.equal(hostForUrl('::1'), '[::1]');
  t.equal(hostForUrl('::ffff:10.1.2.3'), '10.1.2.3');
  t.equal(hostForUrl('fe80::1%eth0'), '[fe80::1%25eth0]');
  t.equal(pipeBaseUrl('10.1.2.3', 8081, null), 'http://10.1.2.3:8081');
  t.equal(pipeBaseUrl('::1', 8081, null), 'http://[::1]:8081');
  t.equal(pipeBaseUrl('10.1.2.3', 8081, 'https://fylr-0.example/api/'), 'https://fylr-0.example/api');
  t.equal(pipeBaseUrl(undefined, 8081, null), null);
  t.equal(pipeBaseUrl('10.1.2.3', null, null), null, 'no port known yet');
});
