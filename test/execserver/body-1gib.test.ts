/**
 * Body mode in bounded memory (issue 3, PROTOCOL.md §2): 1 GiB through `cat` over the broker,
 * stdin from a pipe GET, stdout to a pipe PUT, the execserver a real `slotgate serve` process
 * whose resident memory (VmRSS in /proc) is sampled while the bytes flow. Backpressure both ways
 * keeps it flat: the growth over the warmed-up baseline must stay under 100 MiB.
 */
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { BrokerPeer, jobs } from '../helpers/broker-peer.js';
import { startPipeServer } from '../helpers/pipe-server.js';
import { startCli } from '../helpers/spawn-cli.js';

const GIB = 1024 * 1024 * 1024;
const MIB = 1024 * 1024;

async function rssBytes(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const kb = /VmRSS:\s+(\d+) kB/.exec(status)?.[1];
  if (kb === undefined) throw new Error(`no VmRSS for ${pid}`);
  return Number(kb) * 1024;
}

t.test('§2 1 GiB through cat in body mode: every byte arrives unchanged, the execserver grows by less than 100 MiB', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'slotgate-1gib-'));
  const config = join(dir, 'serve.yml');
  await writeFile(config, 'listen: 127.0.0.1:0\nwaitgroups: {main: 1}\ncommands: {cat: {prog: cat}}\nservices: {cat: {waitgroup: main, commands: [cat]}}\n');
  const cli = await startCli(['serve', '--config', config], { t });
  const pid = cli.child.pid!;
  const pipes = await startPipeServer();
  t.teardown(() => pipes.close());
  const peer = await BrokerPeer.connect(cli.url, { timeoutMs: 120_000 });
  t.teardown(() => peer.terminate());

  // Warm up (JIT, undici pools, buffers), then take the baseline.
  const warmIn = pipes.source(32 * MIB);
  const warmOut = pipes.sink();
  t.equal((await peer.run('warm', jobs.cat({ in: warmIn.url, out: warmOut.url }))).receipt.ok, true);
  const baseline = await rssBytes(pid);

  let peak = baseline;
  let samples = 0;
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      peak = Math.max(peak, await rssBytes(pid).catch(() => 0));
      samples++;
      await new Promise((r) => setTimeout(r, 25)); // the sampling rate, not a wait for anything
    }
  })();

  const started = Date.now();
  const src = pipes.source(GIB, { chunkBytes: 256 * 1024 });
  const sink = pipes.sink();
  const done = await peer.run('big', jobs.cat({ in: src.url, out: sink.url }));
  const [sent, got] = await Promise.all([src.served, sink.received]);
  sampling = false;
  await sampler;
  const seconds = (Date.now() - started) / 1000;

  t.equal(done.receipt.ok, true, done.receipt.error?.message ?? 'ok');
  t.equal(sent.bytes, GIB, 'the pipe served 1 GiB');
  t.equal(got.bytes, GIB, 'the sink received 1 GiB');
  t.equal(got.sha256, sent.sha256, 'unchanged');
  t.equal(got.complete, true);
  t.equal(done.receipt.output_bytes, GIB);
  const growth = peak - baseline;
  t.comment(`1 GiB in ${seconds.toFixed(1)} s (${(GIB / MIB / seconds).toFixed(0)} MiB/s); RSS baseline ${(baseline / MIB).toFixed(1)} MiB, peak ${(peak / MIB).toFixed(1)} MiB, growth ${(growth / MIB).toFixed(1)} MiB over ${samples} samples`);
  t.ok(samples >= 10, `RSS was sampled during the run (${samples} samples)`);
  t.ok(growth < 100 * MIB, `RSS growth ${(growth / MIB).toFixed(1)} MiB < 100 MiB`);
});
