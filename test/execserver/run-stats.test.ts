/** POSITION's eta_ms arithmetic (src/execserver/run-stats.ts). */
import t from 'tap';
import { RunStats } from '../../src/execserver/run-stats.js';

t.test('the mean covers the last `window` runs of a service; null before the first', async (t) => {
  const s = new RunStats(3);
  t.equal(s.meanMs('x'), null);
  s.record('x', 100);
  t.equal(s.meanMs('x'), 100);
  s.record('x', 200);
  s.record('x', 300);
  s.record('x', 1000); // 100 leaves the window
  t.equal(s.meanMs('x'), 500);
  t.equal(s.meanMs('y'), null, 'per service');
  s.record('x', Number.NaN);
  s.record('x', -5);
  t.equal(s.meanMs('x'), 500, 'nonsense durations are ignored');
});

t.test('etaMs: wait for the (ahead + 1 - free)-th slot to free at capacity/mean, then one run', async (t) => {
  const s = new RunStats();
  t.equal(s.etaMs('x', 0, 4), null, 'unknown service: null');
  s.record('x', 1000);
  t.equal(s.etaMs('x', 0, 4, 1), 1000, 'a free slot for it: just the run');
  t.equal(s.etaMs('x', 2, 4, 3), 1000, 'three free slots, two ahead: still free for it');
  t.equal(s.etaMs('x', 0, 4, 0), 1250, 'all 4 busy: the first to free comes in mean/4');
  t.equal(s.etaMs('x', 7, 4, 0), 3000, '8 slot-frees to wait for: 2 runs of 4 slots, then its own');
  t.equal(s.etaMs('x', 0, 1, 0), 2000, 'one slot: wait one run, then run');
  t.equal(s.etaMs('x', 0, 0, 0), null, 'no slots: no estimate');
});

t.test('remainingMs: the mean minus the time run so far, never negative', async (t) => {
  const s = new RunStats();
  t.equal(s.remainingMs('x', 10), null);
  s.record('x', 500);
  t.equal(s.remainingMs('x', 200), 300);
  t.equal(s.remainingMs('x', 800), 0);
});
