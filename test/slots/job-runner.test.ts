import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { finished } from 'node:stream/promises';
import t from 'tap';
import { ManualClock, systemClock } from '../../src/clock.js';
import type { CommandConfig } from '../../src/config/types.js';
import type { JobArg, JobCommand, JobSpec } from '../../src/protocol/job.js';
import { type RunOptions, STDERR_TAIL_BYTES, runJob } from '../../src/slots/job-runner.js';
import { MINIMAL_PATH } from '../../src/slots/job-env.js';
import { fileServer, groupMembers, recordingSink } from './job-runner-helpers.js';

/** What the helpers need of a tap test. */
interface Teardown {
  teardown(fn: () => unknown): void;
}

const SECRET = 's3cr3t-token-xyz';

const COMMANDS: Record<string, CommandConfig> = {
  sh: { prog: '/bin/sh', args: ['-c'], env: [] },
  shconf: { prog: '/bin/sh', args: ['-c', 'printf "%s," "$@"', 'sh', 'conf1', 'conf2'], env: [] },
  env: { prog: 'env', args: [], env: ['FOO=abc', 'EMPTY='] },
  secret: { prog: '/bin/sh', args: ['-c'], env: [`API_KEY=${SECRET}`, 'SHORT=abc'] },
  cat: { prog: 'cat', args: [], env: [] },
  missing: { prog: '/nonexistent/program', args: [], env: [] },
};

const v = (value: string): JobArg => ({ type: 'value', value });
const sh = (script: string, ...rest: string[]): JobCommand => ({ prog: 'sh', args: [v(script), v('sh'), ...rest.map(v)] });
const bodyOut = (c: JobCommand): JobCommand => ({ ...c, stdout: { type: 'body' } });

function job(commands: JobCommand[], extra: Partial<JobSpec> = {}): JobSpec {
  return { service: 'test', commands, ...extra };
}

/** A fresh tmpRoot per test, so "the temp dir is gone" is checkable. */
function tmpRoot(t: Teardown): string {
  const dir = mkdtempSync(join(tmpdir(), 'jr-test-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

function opts(t: Teardown, extra: Partial<RunOptions> = {}): RunOptions {
  return { commands: COMMANDS, clock: systemClock, defaultTimeoutSec: 30, tmpRoot: tmpRoot(t), ...extra };
}

t.test('an unknown prog is refused and nothing runs', async (t) => {
  const o = opts(t);
  const marker = join(o.tmpRoot as string, 'marker');
  const r = await runJob(job([sh(`touch ${marker}`), { prog: 'rm', args: [v('-rf'), v('/')] }]), o);
  t.equal(r.ok, false);
  t.equal(r.error?.code, 'command_not_allowed');
  t.match(r.error?.message, /"rm"/);
  t.same(r.commands, []);
  t.equal(existsSync(marker), false, 'the first, allowed command did not run either');
  t.same(readdirSync(o.tmpRoot as string), [], 'no temp dir was made');
});

t.test('a prog is looked up by name only, never as a path', async (t) => {
  const r = await runJob(job([{ prog: '/bin/sh', args: [v('-c'), v('true')] }]), opts(t));
  t.equal(r.error?.code, 'command_not_allowed');
});

t.test('configured args come before the job args', async (t) => {
  const r = await runJob(job([{ prog: 'shconf', args: [v('job1'), v('job 2')] }]), opts(t));
  t.equal(r.ok, true);
  t.equal(r.stdout_prefix, 'conf1,conf2,job1,job 2,');
  t.equal(r.exit_code, 0);
});

t.test('the environment is minimal plus the configured env, never the server one', async (t) => {
  process.env.SLOTGATE_SECRET_TEST = 'must-not-leak';
  t.teardown(() => delete process.env.SLOTGATE_SECRET_TEST);
  const o = opts(t);
  // All of it through a sink (NUL-separated: values may hold newlines), not only the 4000-byte prefix.
  const sink = recordingSink({ keep: true });
  const r = await runJob(job([{ prog: 'env', args: [v('-0')], stdout: { type: 'body' } }]), { ...o, stdout: sink });
  t.equal(r.ok, true);
  const out = sink.data().toString();
  const env = Object.fromEntries(
    out
      .split('\0')
      .filter((l) => l !== '')
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
  // tap's processinfo wraps child_process.spawn and adds its own NODE_OPTIONS and _TAPJS_* to
  // every child (to follow subprocesses); nothing of ours. Anything else would be a leak.
  const added = Object.keys(env).filter((k) => k.startsWith('_TAPJS_PROCESSINFO_') || (k === 'NODE_OPTIONS' && /@tapjs\/processinfo/.test(String(env[k]))));
  const ours = Object.keys(env).filter((k) => !added.includes(k));
  t.same(ours.sort(), ['EMPTY', 'FOO', 'HOME', 'LANG', 'PATH', 'TMPDIR']);
  t.equal(env.PATH, MINIMAL_PATH);
  t.equal(env.LANG, 'C.UTF-8');
  t.equal(env.FOO, 'abc', 'a value under 4 characters is no secret');
  t.equal(env.EMPTY, '');
  t.equal(env.HOME, env.TMPDIR);
  t.ok(String(env.HOME).startsWith(join(o.tmpRoot as string, 'slotgate-job-')), 'HOME is the job temp dir');
  t.notMatch(out, /must-not-leak|SLOTGATE_SECRET_TEST/);
});

t.test('configured env values are redacted from stdout_prefix, stderr_line and error.message', async (t) => {
  const files = await fileServer({});
  t.teardown(() => files.close());
  const r = await runJob(job([{ prog: 'secret', args: [v('echo "key=$API_KEY short=$SHORT"; echo "bad $API_KEY!" >&2; exit 3')] }]), opts(t));
  t.equal(r.error?.code, 'command_failed');
  t.equal(r.stdout_prefix, 'key=[redacted] short=abc\n');
  t.equal(r.stderr_line, 'bad [redacted]!');

  // A file_in URL that happens to carry the secret in its path: the error message names the path.
  const r2 = await runJob(
    job([{ prog: 'secret', args: [v('true'), { type: 'file_in', file: { url: `${files.url}/${SECRET}/a`, name: 'a' } }] }]),
    opts(t),
  );
  t.equal(r2.error?.code, 'file_in_failed');
  t.match(r2.error?.message, /404/);
  t.match(r2.error?.message, /\[redacted\]/);
  t.notMatch(r2.error?.message, SECRET);
  t.same(r2.commands, [], 'no command ran after the failed download');
});

t.test('a secret cut by the stdout_prefix or the stderr tail does not survive in part', async (t) => {
  // 3996 bytes, then the secret: the first 4000 bytes end with "s3cr".
  const r = await runJob(
    job([{ prog: 'secret', args: [v('head -c 3996 /dev/zero | tr "\\0" x; printf "%s" "$API_KEY"; printf "%s" "$API_KEY" >&2; head -c 8187 /dev/zero | tr "\\0" y >&2')] }]),
    opts(t),
  );
  t.equal(r.ok, true);
  t.equal(r.output_bytes, 3996 + SECRET.length);
  t.equal(r.stdout_prefix, 'x'.repeat(3996), 'the partial secret at the end is dropped');
  // The stderr tail keeps the last 8192 bytes: the last 5 characters of the secret, then 8187 y.
  t.equal(STDERR_TAIL_BYTES, 8192);
  t.equal(r.stderr_line, 'y'.repeat(8187), 'the partial secret at the start is dropped');
});

t.test('a job with no commands is ok at once, without a temp dir', async (t) => {
  const o = opts(t);
  const r = await runJob(job([]), o);
  t.same(r, { ok: true, exit_code: 0, duration_ms: 0, timed_out: false, stopped: false, stderr_line: '', stdout_prefix: '', output_bytes: 0, commands: [], error: null });
  t.same(readdirSync(o.tmpRoot as string), []);
});

t.test('commands run in order in one temp dir, which is removed afterwards', async (t) => {
  const o = opts(t);
  const r = await runJob(job([sh('pwd; echo hello > f.txt'), { prog: 'sh', args: [v('pwd; cat f.txt')] }]), o);
  t.equal(r.ok, true, `receipt error: ${JSON.stringify(r.error)}`);
  const [dir1, dir2, content] = r.stdout_prefix.split('\n');
  t.equal(dir1, dir2, 'both ran in the same directory');
  t.equal(content, 'hello', 'the second saw the first one\'s file');
  t.ok(dir1?.startsWith(join(o.tmpRoot as string, 'slotgate-job-')));
  t.equal(existsSync(dir1 as string), false, 'the temp dir is gone');
  t.same(readdirSync(o.tmpRoot as string), []);
  t.same(r.commands.map((c) => [c.prog, c.exit_code]), [['sh', 0], ['sh', 0]]);
});

t.test('the temp dir is removed after a failure too', async (t) => {
  const o = opts(t);
  const r = await runJob(job([sh('echo x > f; exit 1')]), o);
  t.equal(r.ok, false);
  t.same(readdirSync(o.tmpRoot as string), []);
});

t.test('file_in is downloaded first, file_out uploaded only after success', async (t) => {
  const files = await fileServer({ '/in/a.txt': 'input-data' });
  t.teardown(() => files.close());
  const fin: JobArg = { type: 'file_in', file: { url: `${files.url}/in/a.txt?sig=1`, name: 'a.txt' } };
  const fout: JobArg = { type: 'file_out', file: { url: `${files.url}/out/b.txt`, name: 'b.txt' } };
  const r = await runJob(job([{ prog: 'sh', args: [v('tr a-z A-Z < "$1" > "$2"; basename "$1"'), v('sh'), fin, fout] }]), opts(t));
  t.equal(r.ok, true, `receipt error: ${JSON.stringify(r.error)}`);
  t.equal(r.stdout_prefix, 'a.txt\n', 'the file_in argument is the downloaded file\'s path');
  t.equal(files.puts.get('/out/b.txt')?.toString(), 'INPUT-DATA');

  const fout2: JobArg = { type: 'file_out', file: { url: `${files.url}/out/c.txt`, name: 'c.txt' } };
  const r2 = await runJob(job([{ prog: 'sh', args: [v('echo partial > "$1"; exit 1'), v('sh'), fout2] }]), opts(t));
  t.equal(r2.error?.code, 'command_failed');
  t.equal(files.puts.has('/out/c.txt'), false, 'a failed command uploads nothing');

  // A later command's failure does not take back an earlier command's upload, but its own is never made.
  const fout3: JobArg = { type: 'file_out', file: { url: `${files.url}/fail/d.txt`, name: 'd.txt' } };
  const r3 = await runJob(job([{ prog: 'sh', args: [v('echo d > "$1"'), v('sh'), fout3] }, sh('echo never')]), opts(t));
  t.equal(r3.error?.code, 'file_out_failed');
  t.match(r3.error?.message, /HTTP 500/);
  t.equal(r3.commands.length, 1, 'the command after a failed upload does not run');

  const fout4: JobArg = { type: 'file_out', file: { url: `${files.url}/out/e.txt`, name: 'e.txt' } };
  const r4 = await runJob(job([{ prog: 'sh', args: [v('true'), v('sh'), fout4] }]), opts(t));
  t.equal(r4.error?.code, 'file_out_failed');
  t.match(r4.error?.message, /wrote no file "e.txt"/);
});

t.test('a non-zero exit is command_failed with the last non-empty stderr line', async (t) => {
  const r = await runJob(job([sh('echo out; echo first >&2; printf "decisive line  \\n\\n   \\n" >&2; exit 3')]), opts(t));
  t.equal(r.ok, false);
  t.equal(r.exit_code, 3);
  t.equal(r.error?.code, 'command_failed');
  t.match(r.error?.message, /exited with code 3/);
  t.equal(r.stderr_line, 'decisive line');
  t.equal(r.stdout_prefix, 'out\n');
  t.equal(r.timed_out, false);
  t.equal(r.stopped, false);
});

t.test('stderr_line and exit_code are those of the last command run', async (t) => {
  const r = await runJob(job([sh('echo one >&2'), sh('exit 4')]), opts(t));
  t.equal(r.exit_code, 4);
  t.equal(r.stderr_line, '', 'the second command wrote no stderr');
  t.same(r.commands.map((c) => c.exit_code), [0, 4]);
});

t.test('a program that cannot start is spawn_failed', async (t) => {
  const r = await runJob(job([{ prog: 'missing', args: [] }]), opts(t));
  t.equal(r.error?.code, 'spawn_failed');
  t.match(r.error?.message, /ENOENT/);
  t.equal(r.exit_code, null);
});

t.test('the job timeout stops the whole process group', async (t) => {
  const started = Date.now();
  const r = await runJob(job([sh('echo $$; sleep 30 & wait')], { timeout_sec: 0.2 }), opts(t));
  t.equal(r.ok, false);
  t.equal(r.timed_out, true);
  t.equal(r.stopped, false);
  t.equal(r.error?.code, 'timed_out');
  t.equal(r.exit_code, null, 'killed by a signal');
  const pgid = Number(r.stdout_prefix.trim());
  t.ok(pgid > 1, 'the shell printed its pid');
  t.same(groupMembers(pgid), [], 'no process of the group is left, not even the background sleep');
  t.ok(Date.now() - started < 10_000);
});

t.test('a background process left behind by a command that exited is killed', async (t) => {
  const r = await runJob(job([sh('echo $$; sleep 30 &')]), opts(t));
  t.equal(r.ok, true);
  t.same(groupMembers(Number(r.stdout_prefix.trim())), []);
});

t.test('an already aborted signal runs nothing', async (t) => {
  const ac = new AbortController();
  ac.abort();
  const o = opts(t, { signal: ac.signal });
  const r = await runJob(job([sh('echo hi')]), o);
  t.equal(r.stopped, true);
  t.equal(r.error?.code, 'stopped');
  t.same(r.commands, []);
  t.same(readdirSync(o.tmpRoot as string), []);
});

t.test('cancel via AbortSignal stops the job; a committed stream is aborted', async (t) => {
  const ac = new AbortController();
  const sink = recordingSink();
  const done = runJob(job([bodyOut(sh('head -c 5000 /dev/zero; exec sleep 30'))]), opts(t, { signal: ac.signal, stdout: sink }));
  await sink.committed;
  ac.abort();
  const r = await done;
  t.equal(r.ok, false);
  t.equal(r.stopped, true);
  t.equal(r.timed_out, false);
  t.equal(r.error?.code, 'stopped');
  t.same(sink.events, ['commit', 'abort']);
  t.equal(sink.ended, false, 'the peer never saw a clean end');
});

t.test('SIGKILL follows SIGTERM after the grace for a process that ignores SIGTERM', async (t) => {
  const clock = new ManualClock();
  const ac = new AbortController();
  const sink = recordingSink({ keep: true });
  let settled = false;
  const done = runJob(job([bodyOut(sh('trap "" TERM; echo $$; head -c 5000 /dev/zero; sleep 30'))]), opts(t, { clock, signal: ac.signal, stdout: sink, killGraceMs: 2000 }));
  void done.then(() => (settled = true));
  await sink.received(4500);
  const pgid = Number(sink.data().toString('latin1').split('\n')[0]);
  t.ok(pgid > 1);
  t.teardown(() => {
    try {
      process.kill(-pgid, 'SIGKILL');
    } catch {
      /* gone */
    }
  });
  ac.abort();
  // SIGTERM was sent synchronously and is ignored by the whole group.
  t.ok(groupMembers(pgid).length >= 1, 'the group survives SIGTERM');
  await new Promise((resolve) => setImmediate(resolve));
  t.equal(settled, false, 'the job waits for the grace');
  clock.advance(1999);
  t.ok(groupMembers(pgid).length >= 1, 'not killed before the grace is over');
  clock.advance(1);
  const r = await done;
  t.equal(r.stopped, true);
  t.equal(r.error?.code, 'stopped');
  t.equal(r.exit_code, null);
  t.same(groupMembers(pgid), []);
  t.same(sink.events, ['commit', 'abort']);
});

t.test('commit rule', async (t) => {
  t.test('a failing command with 100 bytes never commits', async (t) => {
    const sink = recordingSink();
    const r = await runJob(job([bodyOut(sh('head -c 100 /dev/zero | tr "\\0" a; exit 1'))]), opts(t, { stdout: sink }));
    t.equal(r.error?.code, 'command_failed');
    t.same(sink.events, [], 'commit never called');
    t.equal(r.stdout_prefix, 'a'.repeat(100));
    t.equal(r.output_bytes, 100);
  });

  t.test('a successful command with 100 bytes commits once, at the end', async (t) => {
    const sink = recordingSink({ keep: true });
    const r = await runJob(job([bodyOut(sh('head -c 100 /dev/zero | tr "\\0" a'))]), opts(t, { stdout: sink }));
    t.equal(r.ok, true);
    t.same(sink.events, ['commit', 'end']);
    t.equal(sink.data().toString(), 'a'.repeat(100));
    t.equal(r.stdout_prefix, 'a'.repeat(100));
  });

  t.test('a successful command with no output still commits an empty body', async (t) => {
    const sink = recordingSink({ keep: true });
    const r = await runJob(job([bodyOut(sh('true'))]), opts(t, { stdout: sink }));
    t.equal(r.ok, true);
    t.same(sink.events, ['commit', 'end']);
    t.equal(sink.bytes, 0);
  });

  t.test('exactly 4000 bytes then failure: no commit; 4001: commit then abort', async (t) => {
    const s1 = recordingSink();
    const r1 = await runJob(job([bodyOut(sh('head -c 4000 /dev/zero; exit 1'))]), opts(t, { stdout: s1 }));
    t.equal(r1.error?.code, 'command_failed');
    t.same(s1.events, []);
    const s2 = recordingSink();
    const r2 = await runJob(job([bodyOut(sh('head -c 4001 /dev/zero; exit 1'))]), opts(t, { stdout: s2 }));
    t.equal(r2.error?.code, 'command_failed');
    t.same(s2.events, ['commit', 'abort']);
  });

  t.test('10,000 bytes then exit 1: commit, then abort', async (t) => {
    const sink = recordingSink();
    const r = await runJob(job([bodyOut(sh('head -c 10000 /dev/zero | tr "\\0" b; exit 1'))]), opts(t, { stdout: sink }));
    t.equal(r.ok, false);
    t.equal(r.error?.code, 'command_failed');
    t.same(sink.events, ['commit', 'abort']);
    t.equal(sink.ended, false);
    t.equal(r.output_bytes, 10000);
    t.equal(r.stdout_prefix, 'b'.repeat(4000), 'stdout_prefix is capped at 4000 bytes');
  });

  t.test('body stdout of several commands is one stream, in order', async (t) => {
    const sink = recordingSink({ keep: true });
    const r = await runJob(job([bodyOut(sh('printf one')), sh('printf hidden'), bodyOut(sh('printf two'))]), opts(t, { stdout: sink }));
    t.equal(r.ok, true);
    t.equal(sink.data().toString(), 'onetwo');
    t.equal(r.stdout_prefix, 'onetwo', 'the prefix is of body stdout when there is one');
    t.equal(r.output_bytes, 'onehiddentwo'.length, 'output_bytes counts all stdout');
    t.same(sink.events, ['commit', 'end']);
  });

  t.test('a rejected accepted is pipe_out_failed', async (t) => {
    const sink = recordingSink({ rejectWith: new Error('PUT answered 502') });
    const r = await runJob(job([bodyOut(sh('head -c 10 /dev/zero'))]), opts(t, { stdout: sink }));
    t.equal(r.ok, false);
    t.equal(r.error?.code, 'pipe_out_failed');
    t.match(r.error?.message, /502/);
  });

  t.test('a commit that fails is pipe_out_failed and stops the command', async (t) => {
    const r = await runJob(job([bodyOut(sh('head -c 10000 /dev/zero; exec sleep 30'))]), opts(t, {
      stdout: { commit: () => Promise.reject(new Error('connect ECONNREFUSED')), abort: () => {} },
    }));
    t.equal(r.error?.code, 'pipe_out_failed');
    t.match(r.error?.message, /ECONNREFUSED/);
  });

  t.test('a peer that never takes the commit does not outlive the job timeout', async (t) => {
    // Our timers are unref'd (a server's listener keeps the process alive); so does this test.
    const keepAlive = setInterval(() => {}, 60_000);
    t.teardown(() => clearInterval(keepAlive));
    let aborted = 0;
    const r = await runJob(job([bodyOut(sh('head -c 10000 /dev/zero'))], { timeout_sec: 0.3 }), opts(t, {
      stdout: { commit: () => new Promise(() => {}), abort: () => aborted++ },
    }));
    t.equal(r.error?.code, 'timed_out');
    t.equal(r.timed_out, true);
    t.equal(aborted, 0, 'nothing to abort: the commit never resolved');
  });

  t.test('utf-8 is never cut in half in stdout_prefix', async (t) => {
    // 3999 bytes of "x", then "é" (2 bytes) straddles byte 4000.
    const r = await runJob(job([sh('head -c 3999 /dev/zero | tr "\\0" x; printf "\\303\\251"; exit 1')]), opts(t));
    t.equal(r.stdout_prefix, 'x'.repeat(3999));
    t.equal(r.output_bytes, 4001);
  });
});

t.test('stdin', async (t) => {
  t.test('the first stdin-body command reads the source; later ones get an empty stdin', async (t) => {
    let opened = 0;
    const stdin = { open: async () => (opened++, Readable.from([Buffer.from('abc'), Buffer.from('def')])) };
    const r = await runJob(
      job([{ prog: 'cat', args: [], stdin: { type: 'body' } }, { prog: 'cat', args: [], stdin: { type: 'body' } }, sh('echo "[$(cat 2>&1)]"')]),
      opts(t, { stdin }),
    );
    t.equal(r.ok, true, `receipt error: ${JSON.stringify(r.error)}`);
    t.equal(opened, 1);
    t.equal(r.stdout_prefix, 'abcdef[]\n', 'a command without stdin body reads /dev/null');
  });

  t.test('no source: stdin body is empty', async (t) => {
    const r = await runJob(job([{ prog: 'cat', args: [], stdin: { type: 'body' } }]), opts(t));
    t.equal(r.ok, true);
    t.equal(r.output_bytes, 0);
  });

  t.test('a source that fails mid-stream is pipe_in_failed and stops the command', async (t) => {
    let reads = 0;
    const src = new Readable({
      read() {
        // The first read gets some data, the second finds the connection gone.
        if (reads++ === 0) this.push('partial');
        else setImmediate(() => this.destroy(new Error('socket hang up')));
      },
    });
    const stdin = { open: async () => src };
    const r = await runJob(job([{ prog: 'cat', args: [], stdin: { type: 'body' } }]), opts(t, { stdin }));
    t.equal(r.error?.code, 'pipe_in_failed');
    t.match(r.error?.message, /socket hang up/);
  });

  t.test('a source that cannot open is pipe_in_failed and nothing runs', async (t) => {
    const r = await runJob(job([{ prog: 'cat', args: [], stdin: { type: 'body' } }]), opts(t, { stdin: { open: () => Promise.reject(new Error('GET answered 410')) } }));
    t.equal(r.error?.code, 'pipe_in_failed');
    t.same(r.commands, []);
  });

  t.test('a command that exits without reading all of stdin succeeds; the rest is drained', async (t) => {
    const src = Readable.from((function* () {
      for (let i = 0; i < 200; i++) yield Buffer.alloc(64 * 1024, 0x41);
    })());
    const r = await runJob(job([{ prog: 'sh', args: [v('head -c 5 >/dev/null; echo done')], stdin: { type: 'body' } }]), opts(t, { stdin: { open: async () => src } }));
    t.equal(r.ok, true, `receipt error: ${JSON.stringify(r.error)}`);
    t.equal(r.stdout_prefix, 'done\n');
    await finished(src);
    t.equal(src.readableEnded, true, 'the unread rest was read and dropped');
  });
});
