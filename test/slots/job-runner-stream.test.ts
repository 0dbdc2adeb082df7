/**
 * Body mode in bounded memory: 256 MiB from a Readable, through `cat`, into a slow sink. In its
 * own file (its own process) so the RSS it measures is not another test's garbage.
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import t from 'tap';
import { systemClock } from '../../src/clock.js';
import { runJob } from '../../src/slots/job-runner.js';
import { recordingSink } from './job-runner-helpers.js';

const MiB = 1024 * 1024;
const TOTAL = 256 * MiB;
const CHUNK = 64 * 1024;

t.test('256 MiB through cat with backpressure, in bounded memory', async (t) => {
  const root = mkdtempSync(join(tmpdir(), 'jr-stream-'));
  t.teardown(() => rmSync(root, { recursive: true, force: true }));

  // Random-looking content, different in every chunk, so a dropped or repeated chunk shows.
  const pattern = Buffer.alloc(CHUNK);
  for (let i = 0; i < CHUNK; i++) pattern[i] = (i * 2654435761) >>> 24;
  const inHash = createHash('sha256');
  let produced = 0;
  const source = new Readable({
    highWaterMark: CHUNK,
    read() {
      if (produced >= TOTAL) {
        this.push(null);
        return;
      }
      const chunk = Buffer.from(pattern);
      chunk.writeUInt32BE(produced / CHUNK, 0);
      produced += CHUNK;
      inHash.update(chunk);
      this.push(chunk);
    },
  });

  const sink = recordingSink({ slow: true, highWaterMark: 16 * 1024 });
  globalThis.gc?.();
  const rssBefore = process.memoryUsage().rss;
  let rssPeak = rssBefore;
  const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, process.memoryUsage().rss)), 20);
  t.teardown(() => clearInterval(sampler));

  const r = await runJob(
    { service: 'cat', commands: [{ prog: 'cat', args: [], stdin: { type: 'body' }, stdout: { type: 'body' } }] },
    {
      commands: { cat: { prog: 'cat', args: [], env: [] } },
      clock: systemClock,
      defaultTimeoutSec: 600,
      tmpRoot: root,
      stdin: { open: async () => source },
      stdout: sink,
    },
  );
  clearInterval(sampler);
  const rssAfter = process.memoryUsage().rss;
  rssPeak = Math.max(rssPeak, rssAfter);

  t.equal(r.ok, true, `receipt error: ${JSON.stringify(r.error)}`);
  t.equal(produced, TOTAL);
  t.equal(sink.bytes, TOTAL, 'every byte arrived');
  t.equal(r.output_bytes, TOTAL);
  t.equal(sink.sha256(), inHash.digest('hex'), 'out is in, byte for byte');
  t.same(sink.events, ['commit', 'end']);
  t.ok(sink.maxBuffered <= 1 * MiB, `the runner waited for the slow sink to drain (max buffered ${sink.maxBuffered} bytes)`);
  const growthMiB = (rssPeak - rssBefore) / MiB;
  t.comment(`rss before ${(rssBefore / MiB).toFixed(1)} MiB, peak ${(rssPeak / MiB).toFixed(1)} MiB, after ${(rssAfter / MiB).toFixed(1)} MiB, peak growth ${growthMiB.toFixed(1)} MiB`);
  t.ok(growthMiB < 100, `RSS grew by ${growthMiB.toFixed(1)} MiB (< 100 MiB)`);
});
