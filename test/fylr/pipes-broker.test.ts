import net from 'node:net';
import { PassThrough, Readable, Writable } from 'node:stream';
import t from 'tap';
import { WebSocket } from 'ws';
import { ExecClient } from '../../src/fylr/exec-client.js';
import type { AcquireResult, SlotLease } from '../../src/fylr/lease.js';
import { okReceipt } from '../../src/protocol/job.js';
import type { JobMessage } from '../../src/protocol/messages.js';
import { catJob, clientConfig, Recorder, startExec, startFakeExec, startPipeApp, waitFor } from './fixtures.js';

function slot(r: AcquireResult): SlotLease {
  if (r.kind !== 'slot') throw new Error(`expected a slot, got ${JSON.stringify(r)}`);
  return r.lease;
}

function collector(): { sink: Writable; text: () => string } {
  const chunks: Buffer[] = [];
  const sink = new Writable({
    write(c: Buffer, _e, cb) {
      chunks.push(c);
      cb();
    },
  });
  return { sink, text: () => Buffer.concat(chunks).toString() };
}

function jobFrame(rec: Recorder): JobMessage {
  const m = rec.sent('JOB').at(-1);
  if (m?.type !== 'JOB') throw new Error('no JOB sent');
  return m;
}

const payload = 'stdin through the one-time pipe\n'.repeat(4000); // 128 000 bytes: well past the 4000-byte commit

t.test("pipe URLs carry the broker connection's local address, not callbackBackendInternalURL's host", async (t) => {
  const exec = await startExec(t, { name: 'e', waitgroups: { w: 2 }, services: { cat: 'w' } });
  // The fylr listens on 127.0.0.5 only: a URL with any other host cannot reach it.
  const fylr = await startPipeApp(t, { host: '127.0.0.5' });
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([exec.url], { callbackBackendInternalURL: 'http://127.0.0.9:9' }), {
    pipes: fylr.pipes,
    observer: rec,
    connect: (url, o) => new WebSocket(url, { ...o, localAddress: '127.0.0.5' }),
  });
  t.teardown(() => client.close());
  await client.start();
  t.equal((rec.events.find((e) => e.kind === 'connected') as { local?: string }).local, '127.0.0.5');
  const lease = slot(await client.acquire({ jobId: 'p', service: 'cat', priority: 0 }));
  const out = collector();
  const receipt = await lease.run(catJob(), { stdin: Readable.from([Buffer.from(payload)]), stdout: out.sink });
  t.equal(receipt.ok, true, JSON.stringify(receipt.error));
  t.equal(out.text(), payload, 'stdin came back on stdout, through both pipes');
  const pipes = jobFrame(rec).job.pipes!;
  t.match(pipes.in, new RegExp(`^http://127\\.0\\.0\\.5:${fylr.port}/pipe/[A-Za-z0-9_-]{32}$`));
  t.match(pipes.out, new RegExp(`^http://127\\.0\\.0\\.5:${fylr.port}/pipe/[A-Za-z0-9_-]{32}$`));
  t.notMatch(JSON.stringify(pipes), /127\.0\.0\.9/, 'never the shared backend host');
  t.equal(fylr.pipes.size, 2, 'both pipes used (tombstones until the ttl)');
});

t.test('IPv6: the local address goes in brackets', async (t) => {
  const exec = await startExec(t, { name: 'e6', waitgroups: { w: 1 }, services: { cat: 'w' }, listen: '[::1]:0' });
  const fylr = await startPipeApp(t, { host: '::1' });
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([`http://[::1]:${exec.port}`]), { pipes: fylr.pipes, observer: rec });
  t.teardown(() => client.close());
  await client.start();
  const lease = slot(await client.acquire({ jobId: 'p6', service: 'cat', priority: 0 }));
  const out = collector();
  const receipt = await lease.run(catJob(), { stdin: Readable.from([Buffer.from('v6')]), stdout: out.sink });
  t.equal(receipt.ok, true, JSON.stringify(receipt.error));
  t.equal(out.text(), 'v6');
  t.match(jobFrame(rec).job.pipes!.in, new RegExp(`^http://\\[::1\\]:${fylr.port}/pipe/`));
});

t.test('callbackBackendOwnURL overrides the address read off the connection', async (t) => {
  const exec = await startExec(t, { name: 'e', waitgroups: { w: 1 }, services: { cat: 'w' } });
  const fylr = await startPipeApp(t, { host: '127.0.0.1' });
  const rec = new Recorder();
  const client = new ExecClient(clientConfig([exec.url], { callbackBackendOwnURL: `${fylr.url}/` }), {
    pipes: fylr.pipes,
    observer: rec,
    // The connection's own local address (127.0.0.6) is not where this fylr listens: only the override works.
    connect: (url, o) => new WebSocket(url, { ...o, localAddress: '127.0.0.6' }),
  });
  t.teardown(() => client.close());
  await client.start();
  const lease = slot(await client.acquire({ jobId: 'o', service: 'cat', priority: 0 }));
  const out = collector();
  const receipt = await lease.run(catJob(), { stdin: Readable.from([Buffer.from('over')]), stdout: out.sink });
  t.equal(receipt.ok, true, JSON.stringify(receipt.error));
  t.equal(out.text(), 'over');
  t.ok(jobFrame(rec).job.pipes!.out!.startsWith(`${fylr.url}/pipe/`), 'the override, without its trailing slash');
});

t.test('a command that fails before the commit never PUTs: stdout destroyed, pipes discarded', async (t) => {
  const exec = await startExec(t, { name: 'e', waitgroups: { w: 1 }, services: { cat: 'w' } });
  const fylr = await startPipeApp(t);
  const client = new ExecClient(clientConfig([exec.url]), { pipes: fylr.pipes });
  t.teardown(() => client.close());
  await client.start();
  const lease = slot(await client.acquire({ jobId: 'f', service: 'cat', priority: 0 }));
  const stdout = new PassThrough();
  const receipt = await lease.run(
    { service: 'cat', commands: [{ prog: 'cat', args: [{ type: 'value', value: '/nonexistent/file' }], stdin: { type: 'body' }, stdout: { type: 'body' } }] },
    { stdout },
  );
  t.equal(receipt.ok, false);
  t.equal(receipt.error?.code, 'command_failed');
  t.match(receipt.stderr_line, /nonexistent/);
  t.ok(stdout.destroyed, 'stdout destroyed, never ended');
  t.notOk(stdout.writableFinished);
  t.equal(fylr.pipes.size, 1, 'the unused out-pipe is gone; only the used in-pipe tombstone remains');
});

t.test('an out-pipe PUT that the execserver aborted fails the job even when DONE says ok', async (t) => {
  const fake = await startFakeExec(t);
  const fylr = await startPipeApp(t);
  const client = new ExecClient(clientConfig([fake.url]), { pipes: fylr.pipes });
  t.teardown(() => client.close());
  await client.start();
  const c = await fake.conn(0);
  const pending = client.acquire({ jobId: 'a', service: 'svc', priority: 0 });
  await c.next((m) => m.type === 'WANT', 'WANT');
  c.send({ type: 'OFFER', job_id: 'a', token: 't', expires_ms: 5000 });
  const lease = slot(await pending);
  const stdout = new PassThrough();
  const firstBytes = new Promise<void>((resolve) => stdout.once('data', () => resolve()));
  const run = lease.run({ service: 'svc', commands: [{ prog: 'x', args: [], stdout: { type: 'body' } }] }, { stdout });
  const job = (await c.next((m) => m.type === 'JOB', 'JOB')) as JobMessage;
  t.equal(job.job.pipes?.in, undefined, 'no in-pipe for a job without body stdin');
  const out = new URL(job.job.pipes!.out!);
  const sock = net.connect(Number(out.port), out.hostname);
  await new Promise<void>((r) => sock.once('connect', () => r()));
  sock.write(`PUT ${out.pathname} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\npartly\r\n`);
  await firstBytes;
  sock.destroy();
  c.send({ type: 'DONE', job_id: 'a', receipt: okReceipt(5) });
  const receipt = await run;
  t.equal(receipt.ok, false, 'not ok although DONE said ok');
  t.equal(receipt.error?.code, 'pipe_out_failed');
  t.match(receipt.error?.message, /6 bytes arrived/);
  t.ok(stdout.destroyed);
});

t.test('a body-mode job without a pipe server is refused locally and the slot is given back', async (t) => {
  const fake = await startFakeExec(t);
  const client = new ExecClient(clientConfig([fake.url]));
  t.teardown(() => client.close());
  await client.start();
  const c = await fake.conn(0);
  const pending = client.acquire({ jobId: 'b', service: 'svc', priority: 0 });
  await c.next((m) => m.type === 'WANT', 'WANT');
  c.send({ type: 'OFFER', job_id: 'b', token: 'tb', expires_ms: 5000 });
  const receipt = await slot(await pending).run(catJob('svc'));
  t.equal(receipt.error?.code, 'internal');
  t.same(await c.next((m) => m.type === 'DECLINE', 'DECLINE'), { type: 'DECLINE', job_id: 'b', token: 'tb' });
  await waitFor(() => client.status().leases === 0, 'lease over');
});
