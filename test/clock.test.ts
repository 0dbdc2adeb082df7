import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { type Clock, every, ManualClock, systemClock } from '../src/clock.js';

/** Resolves after `ms` of real time, with a plain (ref'd) Node timer that keeps the test alive. */
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves when `event` is called; fails the wait after 5 s so a broken clock cannot hang the run. */
function waitFor<T>(what: string, start: (done: (v: T) => void) => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const guard = setTimeout(() => reject(new Error(`${what}: did not happen within 5 s`)), 5000);
    start((v) => {
      clearTimeout(guard);
      resolve(v);
    });
  });
}

t.test('ManualClock', async (t) => {
  t.test('starts where told and only moves when advanced', async (t) => {
    t.equal(new ManualClock().now(), 0);
    const c = new ManualClock(1_000);
    t.equal(c.now(), 1_000);
    c.advance(0);
    t.equal(c.now(), 1_000);
    c.advance(250);
    t.equal(c.now(), 1_250);
    c.advance(0.5);
    t.equal(c.now(), 1_250.5);
  });

  t.test('fires due timers in due order, each seeing its due time', async (t) => {
    const c = new ManualClock(100);
    const seen: [string, number][] = [];
    c.setTimeout(() => seen.push(['c', c.now()]), 30);
    c.setTimeout(() => seen.push(['a', c.now()]), 10);
    c.setTimeout(() => seen.push(['d', c.now()]), 31);
    c.setTimeout(() => seen.push(['b', c.now()]), 20);
    t.equal(c.pending, 4);
    c.advance(25);
    t.strictSame(seen, [['a', 110], ['b', 120]]);
    t.equal(c.now(), 125, 'now is the end of the step, not the last due time');
    t.equal(c.pending, 2);
    c.advance(5);
    t.strictSame(seen, [['a', 110], ['b', 120], ['c', 130]], 'a timer due exactly at the end of the step fires');
    c.advance(1);
    t.strictSame(seen.map(([n]) => n), ['a', 'b', 'c', 'd']);
    t.equal(c.pending, 0);
  });

  t.test('ties fire in creation order', async (t) => {
    const c = new ManualClock();
    const seen: string[] = [];
    for (const name of ['first', 'second', 'third', 'fourth']) c.setTimeout(() => seen.push(name), 10);
    c.advance(10);
    t.strictSame(seen, ['first', 'second', 'third', 'fourth']);

    // Same due time reached from different start times: still creation order.
    const d = new ManualClock();
    const order: string[] = [];
    d.setTimeout(() => order.push('early-long'), 10);
    d.advance(5);
    d.setTimeout(() => order.push('late-short'), 5);
    d.advance(5);
    t.strictSame(order, ['early-long', 'late-short']);
  });

  t.test('one advance over many steps equals many small advances', async (t) => {
    const run = (steps: number[]): [number, number][] => {
      const c = new ManualClock();
      const seen: [number, number][] = [];
      for (const d of [7, 3, 3, 15, 0, 9]) c.setTimeout(() => seen.push([d, c.now()]), d);
      for (const s of steps) c.advance(s);
      return seen;
    };
    const expected: [number, number][] = [[0, 0], [3, 3], [3, 3], [7, 7], [9, 9], [15, 15]];
    t.strictSame(run([20]), expected);
    t.strictSame(run([1, 1, 1, 1, 1, 5, 10]), expected);
  });

  t.test('timers created while advancing', async (t) => {
    const c = new ManualClock();
    const seen: [string, number][] = [];
    c.setTimeout(() => {
      seen.push(['outer', c.now()]);
      c.setTimeout(() => seen.push(['inside-step', c.now()]), 5); // due 15, inside the step
      c.setTimeout(() => seen.push(['zero', c.now()]), 0); // due now: fires in the same advance
      c.setTimeout(() => seen.push(['beyond-step', c.now()]), 50); // due 60
    }, 10);
    c.setTimeout(() => seen.push(['existing-12', c.now()]), 12);
    c.setTimeout(() => seen.push(['existing-10', c.now()]), 10); // same due time as outer, created later
    c.advance(20);
    t.strictSame(seen, [
      ['outer', 10],
      ['existing-10', 10],
      ['zero', 10],
      ['existing-12', 12],
      ['inside-step', 15],
    ]);
    t.equal(c.pending, 1);
    c.advance(40);
    t.strictSame(seen.at(-1), ['beyond-step', 60]);
    t.equal(c.pending, 0);
  });

  t.test('clearTimeout', async (t) => {
    const c = new ManualClock();
    let fired = 0;
    const h = c.setTimeout(() => fired++, 10);
    const keep = c.setTimeout(() => fired++, 10);
    t.equal(c.pending, 2);
    c.clearTimeout(h);
    t.equal(c.pending, 1);
    c.clearTimeout(h); // twice: no-op
    c.clearTimeout(undefined);
    t.equal(c.pending, 1);
    c.advance(100);
    t.equal(fired, 1, 'only the kept timer fired');
    c.clearTimeout(keep); // after firing: no-op
    t.equal(c.pending, 0);

    // A callback clears a later timer of the same step.
    const d = new ManualClock();
    const seen: string[] = [];
    let victim = d.setTimeout(() => seen.push('victim'), 20);
    d.setTimeout(() => {
      seen.push('killer');
      d.clearTimeout(victim);
    }, 10);
    d.advance(30);
    t.strictSame(seen, ['killer']);
    // ...and re-arms it.
    victim = d.setTimeout(() => seen.push('re-armed'), 5);
    d.advance(5);
    t.strictSame(seen, ['killer', 're-armed']);
  });

  t.test('pending counts live timers', async (t) => {
    const c = new ManualClock();
    t.equal(c.pending, 0);
    const hs = [1, 2, 3, 4, 5].map((d) => c.setTimeout(() => {}, d));
    t.equal(c.pending, 5);
    c.advance(2);
    t.equal(c.pending, 3);
    c.clearTimeout(hs[4]);
    t.equal(c.pending, 2);
    c.advance(10);
    t.equal(c.pending, 0);
  });

  t.test('odd delays and steps', async (t) => {
    const c = new ManualClock(50);
    const seen: [string, number][] = [];
    c.setTimeout(() => seen.push(['negative', c.now()]), -10);
    c.setTimeout(() => seen.push(['nan', c.now()]), Number.NaN);
    c.setTimeout(() => seen.push(['infinite', c.now()]), Number.POSITIVE_INFINITY);
    c.advance(0);
    t.strictSame(seen, [['negative', 50], ['nan', 50]], 'negative and NaN delays mean "now"');
    c.advance(1e12);
    t.equal(seen.length, 2, 'an infinite delay never fires');
    t.equal(c.pending, 1);
    t.throws(() => c.advance(-1), RangeError, 'time does not run backwards');
    t.throws(() => c.advance(Number.NaN), RangeError);
    t.throws(() => c.advance(Number.POSITIVE_INFINITY), RangeError);
    t.equal(c.now(), 50 + 1e12, 'a refused step leaves the clock alone');
  });
});

t.test('every() with a ManualClock', async (t) => {
  t.test('ticks every interval until stopped', async (t) => {
    const c = new ManualClock();
    const ticks: number[] = [];
    const stop = every(c, 10, () => ticks.push(c.now()));
    t.equal(c.pending, 1);
    c.advance(9);
    t.strictSame(ticks, []);
    c.advance(1);
    t.strictSame(ticks, [10]);
    c.advance(35);
    t.strictSame(ticks, [10, 20, 30, 40]);
    stop();
    t.equal(c.pending, 0, 'stop clears the armed timer');
    c.advance(100);
    t.strictSame(ticks, [10, 20, 30, 40]);
    stop(); // twice: harmless
  });

  t.test('stopping from inside the callback', async (t) => {
    const c = new ManualClock();
    let n = 0;
    const stop = every(c, 5, () => {
      n++;
      if (n === 3) stop();
    });
    c.advance(100);
    t.equal(n, 3);
    t.equal(c.pending, 0);
  });

  t.test('a zero or NaN interval is 1 ms, not an endless loop', async (t) => {
    for (const interval of [0, -5, Number.NaN]) {
      const c = new ManualClock();
      let n = 0;
      const stop = every(c, interval, () => n++);
      c.advance(5);
      t.equal(n, 5, `interval ${interval}`);
      stop();
    }
  });

  t.test('two interval loops interleave by due time', async (t) => {
    const c = new ManualClock();
    const seen: string[] = [];
    const a = every(c, 3, () => seen.push(`a${c.now()}`));
    const b = every(c, 5, () => seen.push(`b${c.now()}`));
    c.advance(10);
    t.strictSame(seen, ['a3', 'b5', 'a6', 'a9', 'b10']);
    a();
    b();
  });
});

t.test('systemClock', async (t) => {
  t.test('now() is monotonic', async (t) => {
    let prev = systemClock.now();
    let backwards = 0;
    for (let i = 0; i < 100_000; i++) {
      const n = systemClock.now();
      if (n < prev) backwards++;
      prev = n;
    }
    t.equal(backwards, 0);
    t.ok(Number.isFinite(prev));
    const before = systemClock.now();
    await sleep(20);
    t.ok(systemClock.now() > before, 'it moves');
  });

  t.test('setTimeout fires; clearTimeout prevents it', async (t) => {
    const got = await waitFor<string>('a timer', (done) => systemClock.setTimeout(() => done('fired'), 5));
    t.equal(got, 'fired');
    const negative = await waitFor<string>('a negative delay', (done) => systemClock.setTimeout(() => done('fired'), -1));
    t.equal(negative, 'fired');
    let cleared = false;
    const h = systemClock.setTimeout(() => {
      cleared = true;
    }, 1);
    systemClock.clearTimeout(h);
    systemClock.clearTimeout(undefined);
    // A later timer of the same clock fires after the cleared one would have.
    await waitFor<void>('a later timer', (done) => systemClock.setTimeout(() => done(), 30));
    t.equal(cleared, false);
  });

  t.test('a delay over 2^31-1 ms is not cut short', async (t) => {
    const warnings: string[] = [];
    const onWarning = (w: Error): void => {
      warnings.push(w.name);
    };
    process.on('warning', onWarning);
    let fired = 0;
    const long = systemClock.setTimeout(() => fired++, 2 ** 31);
    const never = systemClock.setTimeout(() => fired++, Number.POSITIVE_INFINITY);
    await sleep(50); // Node would have fired an overflowing timer after 1 ms
    systemClock.clearTimeout(long);
    systemClock.clearTimeout(never);
    process.off('warning', onWarning);
    t.equal(fired, 0);
    t.notOk(warnings.includes('TimeoutOverflowWarning'), 'no TimeoutOverflowWarning');
  });

  t.test('every() ticks until stopped', async (t) => {
    let n = 0;
    let stop: () => void = () => {};
    await waitFor<void>('three ticks', (done) => {
      stop = every(systemClock, 2, () => {
        n++;
        if (n === 3) done();
      });
    });
    stop();
    t.equal(n, 3);
    await waitFor<void>('a later timer', (done) => systemClock.setTimeout(() => done(), 30));
    t.equal(n, 3, 'no tick after stop');
  });

  t.test('every() can stop itself from inside the callback', async (t) => {
    let n = 0;
    await waitFor<void>('two ticks', (done) => {
      const stop = every(systemClock, 1, () => {
        n++;
        if (n === 2) {
          stop();
          done();
        }
      });
    });
    await waitFor<void>('a later timer', (done) => systemClock.setTimeout(() => done(), 20));
    t.equal(n, 2);
  });

  t.test('a pending timer does not keep the process alive', async (t) => {
    const clock = fileURLToPath(new URL('../src/clock.ts', import.meta.url));
    const script = `
      import { systemClock, every } from ${JSON.stringify(clock)};
      systemClock.setTimeout(() => console.log('fired'), 60_000);
      systemClock.setTimeout(() => console.log('fired long'), 2 ** 32);
      every(systemClock, 60_000, () => console.log('ticked'));
      console.log('armed');
    `;
    const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30_000 });
    t.equal(r.error, undefined, 'the child ran and exited on its own');
    t.equal(r.status, 0, r.stderr);
    t.equal(r.stdout.trim(), 'armed', 'it exited without waiting for its timers');
  });
});

// A compile-time check that both clocks satisfy the port.
const clocks: Clock[] = [systemClock, new ManualClock()];
t.equal(clocks.length, 2);
