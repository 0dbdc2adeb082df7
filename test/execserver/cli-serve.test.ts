/**
 * `slotgate serve` as a real child process (PROTOCOL.md §7, §1 rule 7): the listening line with
 * the real port, the embedded default, a bad configuration, SIGTERM and the admin drain.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { CLI, startCli } from '../helpers/spawn-cli.js';
import { eventually, within } from '../helpers/wait.js';

async function writeConfig(text: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'slotgate-cli-'));
  const path = join(dir, 'serve.yml');
  await writeFile(path, text);
  return path;
}

t.test('§7 serve with no --config serves the embedded default (cat, sha256, echo, sleep); --listen 127.0.0.1:0 prints the real port', async (t) => {
  const cli = await startCli(['serve', '--listen', '127.0.0.1:0'], { t });
  const line = JSON.parse(cli.lines.find((l) => l.includes('"listening"'))!) as { msg: string; url: string; instance_id: string };
  t.equal(line.msg, 'listening');
  const port = Number(new URL(line.url).port);
  t.ok(port > 0, `a real port (${port}), not 0`);
  t.match(line.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  t.equal((await fetch(`${cli.url}/healthz`)).status, 200, 'it serves on the printed url');
  const peer = await BrokerPeer.connect(cli.url);
  t.teardown(() => peer.terminate());
  t.same(Object.keys(peer.hello.services).sort(), ['cat', 'echo', 'sha256', 'sleep']);
  t.equal(peer.hello.instance_id, line.instance_id, 'the line names the instance');
  const done = await peer.run('j1', jobs.echo('hello', 'world'));
  t.equal(done.receipt.ok, true);
  t.equal(done.receipt.stdout_prefix, 'hello world\n');
});

t.test('§6 a bad configuration prints one line naming the key and exits 2', async (t) => {
  const path = await writeConfig('listen: 127.0.0.1:0\nwaitgroups: {fast: -1}\nservices: {}\n');
  const child = spawn(process.execPath, [CLI, 'serve', '--config', path], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  let stdout = '';
  child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  const [code] = (await within(once(child, 'exit'), 30_000, 'the CLI to exit')) as [number];
  t.equal(code, 2);
  const lines = stderr.trimEnd().split('\n');
  t.equal(lines.length, 1, `one line: ${JSON.stringify(stderr)}`);
  t.match(lines[0], /waitgroups\.fast/, 'it names the key');
  t.equal(stdout, '', 'it never said listening');
});

t.test('rule 7: SIGTERM drains — HELLO draining, new WANTs refused, the running job finishes with DONE, then exit 0', async (t) => {
  const cli = await startCli(['serve', '--listen', '127.0.0.1:0'], { t });
  const a = await BrokerPeer.connect(cli.url);
  const b = await BrokerPeer.connect(cli.url);
  t.teardown(() => {
    a.terminate();
    b.terminate();
  });
  await a.acquire('running', jobs.sleep('1.5'));
  a.query('running');
  t.equal((await a.next('POSITION', 'running')).running, 1, 'the job runs');
  cli.child.kill('SIGTERM');
  await b.next('HELLO', (h) => h.draining);
  t.equal((await fetch(`${cli.url}/readyz`)).status, 503, '/readyz 503 while draining');
  b.want('new', 'echo');
  await b.error('draining', 'new');
  const done = await a.next('DONE', 'running');
  t.equal(done.receipt.ok, true, 'the running job finished');
  t.equal(done.receipt.stopped, false);
  t.equal(await within(cli.exited, 10_000, 'the process to exit'), 0, 'exit code 0');
  t.ok(cli.lines.some((l) => l.includes('"draining"')), 'it said it drains');
});

t.test('rule 7: POST /drain on an idle server: the process exits 0', async (t) => {
  const cli = await startCli(['serve', '--listen', '127.0.0.1:0'], { t });
  const res = await fetch(`${cli.url}/drain`, { method: 'POST' });
  t.equal(res.status, 202);
  t.equal(await within(cli.exited, 10_000, 'the process to exit'), 0);
  await eventually(async () => fetch(`${cli.url}/healthz`).then(() => false, () => true), { what: 'the port to close' });
});
