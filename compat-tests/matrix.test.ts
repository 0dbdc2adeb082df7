/**
 * The old/new matrix: fylr {old, new} x execserver {old, gateway in front of old, native}. Each
 * cell runs 30 jobs through one fylr and one address and ends with the stage's checks (exactly
 * once, no waitgroup over its processes, nothing left claimed), plus its own point: the
 * transport the fylr uses for that address, and for the gateway cells that the old execserver
 * behind it is what ran the jobs.
 */
import t from 'tap';
import { compatTest, type Stage, transportOf } from './lib/harness.js';

const JOBS = 30;

type Col = 'legacy' | 'gateway' | 'native';

async function execFor(s: Stage, col: Col): Promise<string> {
  switch (col) {
    case 'legacy':
      return (await s.legacy({ processes: 4 })).url;
    case 'native':
      return (await s.native({ processes: 4 })).url;
    case 'gateway': {
      const backend = await s.legacy({ processes: 4 });
      return (await s.gateway([backend.url], { processes: 4 })).url;
    }
  }
}

const expectedTransport: Record<Col, string> = { legacy: 'polling', gateway: 'broker', native: 'broker' };

for (const col of ['legacy', 'gateway', 'native'] as const) {
  compatTest(t, { kind: 'cell', id: `cell:old:${col}`, row: 'old', col, title: `old fylr x ${col} execserver` }, async (s) => {
    const address = await execFor(s, col);
    const fylr = await s.oldFylr([address]);
    await s.submit(fylr.url, JOBS);
    await s.waitDone();
    await s.verify({ inProcessExecutions: JOBS });
    const c = fylr.fylr.counters.snapshot();
    s.t.equal(c.token_not_found, 0, 'no "Token not found"');
    s.t.equal(c.puts.total, JOBS, 'one PUT per job: the old transport, unchanged');
    if (col === 'gateway') s.t.equal(s.legacyPeers[0]!.server.counters.jobs.mark, JOBS, 'the old execserver behind the gateway ran them');
    s.notes.push(`${c.token_requests.total} token requests (${c.token_requests.by_status['503'] ?? 0} busy) for ${JOBS} jobs`);
  });

  compatTest(t, { kind: 'cell', id: `cell:new:${col}`, row: 'new', col, title: `new fylr x ${col} execserver` }, async (s) => {
    const address = await execFor(s, col);
    const fylr = await s.newFylr([address]);
    s.t.equal(await transportOf(fylr, address), expectedTransport[col], `the new fylr uses ${expectedTransport[col]} for this address`);
    await s.submit(fylr.url, JOBS);
    await s.waitDone();
    await s.verify({ inProcessExecutions: JOBS });
    s.t.equal(await transportOf(fylr, address), expectedTransport[col], 'and still does at the end');
    if (col === 'gateway') s.t.equal(s.legacyPeers[0]!.server.counters.jobs.mark, JOBS, 'the old execserver behind the gateway ran them');
    if (col !== 'legacy') s.t.equal(s.requests().http, 1, 'over the broker: one dial, no HTTP polling');
    s.notes.push(`transport ${expectedTransport[col]}`);
  });
}
