import t, { type Test } from 'tap';
import { decode, decodeFromExec, decodeFromFylr, encode, isProtocolError, ProtocolError } from '../../src/protocol/codec.js';
import { okReceipt, type JobSpec, type Receipt } from '../../src/protocol/job.js';
import { EXEC_MESSAGE_TYPES, FYLR_MESSAGE_TYPES, type Message } from '../../src/protocol/messages.js';

// The job JSON of PROTOCOL.md §3, with the URLs filled in.
const JOB: JobSpec = {
  service: 'convert',
  timeout_sec: 60,
  commands: [
    {
      prog: 'magick',
      args: [
        { type: 'value', value: '-' },
        { type: 'file_in', file: { url: 'http://fylr:8081/files/a.jpg', name: 'a.jpg' } },
        { type: 'file_out', file: { url: 'https://fylr:8081/upload/b.png?sig=x', name: 'b.png' } },
      ],
      stdin: { type: 'body' },
      stdout: { type: 'body' },
    },
  ],
  pipes: { in: 'http://10.0.0.7:8081/pipe/AAAAAAAAAAAAAAAAAAAAAA', out: 'http://10.0.0.7:8081/pipe/BBBBBBBBBBBBBBBBBBBBBB' },
};

// A full receipt of PROTOCOL.md §4.
const RECEIPT: Receipt = {
  ok: false,
  exit_code: 1,
  duration_ms: 1234.5,
  timed_out: false,
  stopped: false,
  stderr_line: 'magick: no decode delegate for this image format',
  stdout_prefix: '{"error": "bad image"}',
  output_bytes: 22,
  commands: [
    { prog: 'magick', exit_code: 1, duration_ms: 1200 },
    { prog: 'killed', exit_code: null, duration_ms: 0 },
  ],
  error: { code: 'command_failed', message: 'magick exited with 1' },
};

const MESSAGES: Message[] = [
  {
    type: 'HELLO',
    protocol: 1,
    instance_id: '5b0d2c1e-4a7f-4c55-9a57-8f0a1b2c3d4e',
    name: 'exec-a',
    services: { convert: 'medium', ffmpeg: 'slow' },
    waitgroups: { slow: { processes: 2, running: 1, parked: 3 }, medium: { processes: 6, running: 0, parked: 0 } },
    clients: 2,
    draining: false,
  },
  { type: 'HELLO', protocol: 1, instance_id: 'i', name: '', services: {}, waitgroups: {}, clients: 0, draining: true },
  { type: 'WANT', job_id: 'job-1', service: 'convert', priority: 0 },
  { type: 'WANT', job_id: 'job-2', service: 'convert', priority: -7 },
  { type: 'WANT', job_id: 'job-3', service: 'convert', priority: Number.MAX_SAFE_INTEGER },
  { type: 'UNWANT', job_id: 'job-1' },
  { type: 'OFFER', job_id: 'job-1', token: 'tok-1', expires_ms: 5000 },
  { type: 'JOB', job_id: 'job-1', token: 'tok-1', job: JOB },
  { type: 'JOB', job_id: 'job-empty', token: 'tok-2', job: { service: 'convert', commands: [] } },
  { type: 'DECLINE', job_id: 'job-1', token: 'tok-1' },
  { type: 'DONE', job_id: 'job-1', receipt: RECEIPT },
  { type: 'DONE', job_id: 'job-2', receipt: okReceipt(3) },
  { type: 'CANCEL', job_id: 'job-1' },
  { type: 'QUERY', job_id: 'job-1' },
  { type: 'POSITION', job_id: 'job-1', running: 6, ahead: 10, capacity: 6, parked: 17, eta_ms: 90500.5 },
  { type: 'POSITION', job_id: 'job-1', running: 0, ahead: 0, capacity: 0, parked: 1, eta_ms: null },
  { type: 'ERROR', code: 'unknown_service', message: 'no service "x"', job_id: 'job-1' },
  { type: 'ERROR', code: 'bad_frame', message: 'frame is not valid JSON' },
];

const FYLR = new Set<string>(FYLR_MESSAGE_TYPES);
const EXEC = new Set<string>(EXEC_MESSAGE_TYPES);

type Decoder = (text: string) => Message | ProtocolError;

/** Asserts that `r` is a refusal with exactly this code, field and jobId. */
function refused(t: Test, r: Message | ProtocolError, code: ProtocolError['code'], field: string | undefined, jobId?: string): void {
  if (!isProtocolError(r)) {
    t.fail(`expected ${code}, got a ${r.type} message`, { found: r });
    return;
  }
  t.ok(r instanceof ProtocolError);
  t.equal(r.code, code, 'code');
  t.equal(r.field, field, 'field');
  t.equal(r.jobId, jobId, 'jobId');
  t.type(r.message, 'string');
  t.ok(r.message.length > 0, 'has a message');
}

const frame = (o: unknown): string => JSON.stringify(o);

t.test('every message type of §1 round-trips', async (t) => {
  const seen = new Set(MESSAGES.map((m) => m.type));
  t.strictSame([...seen].sort(), [...FYLR, ...EXEC].sort(), 'the table covers every type');
  for (const m of MESSAGES) {
    const text = encode(m);
    t.type(text, 'string');
    t.strictSame(JSON.parse(text), m, `${m.type}: encode is plain JSON`);
    t.strictSame(decode(text), m, `${m.type}: decode(encode(m))`);
    const directed: Decoder = FYLR.has(m.type) ? decodeFromFylr : decodeFromExec;
    t.strictSame(directed(text), m, `${m.type}: its direction's decoder accepts it`);
  }
});

t.test('the wire form is snake_case and optional fields are absent', async (t) => {
  t.equal(encode({ type: 'WANT', job_id: 'j', service: 's', priority: 2 }), '{"type":"WANT","job_id":"j","service":"s","priority":2}');
  t.notOk('job_id' in JSON.parse(encode({ type: 'ERROR', code: 'draining', message: 'm' })));
  t.equal(JSON.parse(encode(MESSAGES[15]!)).eta_ms, null, 'eta_ms null is sent explicitly');
});

t.test('direction filtering', async (t) => {
  for (const m of MESSAGES) {
    const wrong: Decoder = FYLR.has(m.type) ? decodeFromExec : decodeFromFylr;
    const r = wrong(encode(m));
    const id = 'job_id' in m ? m.job_id : undefined;
    refused(t, r, 'unknown_type', 'type', id);
  }
  // The undirected decoder accepts both.
  t.equal((decode(frame({ type: 'QUERY', job_id: 'j' })) as Message).type, 'QUERY');
  t.equal((decode(frame({ type: 'DONE', job_id: 'j', receipt: okReceipt() })) as Message).type, 'DONE');
});

t.test('frames that are not JSON objects are bad_frame', async (t) => {
  for (const text of ['', ' ', '{', '{"type":"WANT",}', "{'type':'WANT'}", 'WANT', 'undefined', 'NaN', '\uFEFF{"type":"QUERY","job_id":"j"}']) {
    t.test(JSON.stringify(text), async (t) => refused(t, decode(text), 'bad_frame', undefined));
  }
  for (const text of ['[]', '[{"type":"WANT","job_id":"j","service":"s","priority":1}]', '42', '-1.5e3', 'null', 'true', '"WANT"', '"{\\"type\\":\\"QUERY\\"}"']) {
    t.test(text, async (t) => {
      refused(t, decode(text), 'bad_frame', undefined);
      refused(t, decodeFromFylr(text), 'bad_frame', undefined);
      refused(t, decodeFromExec(text), 'bad_frame', undefined);
    });
  }
});

t.test('type', async (t) => {
  refused(t, decode(frame({ job_id: 'j1' })), 'invalid_field', 'type', 'j1');
  refused(t, decode(frame({})), 'invalid_field', 'type');
  refused(t, decode(frame({ type: 5, job_id: 'j1' })), 'invalid_field', 'type', 'j1');
  refused(t, decode(frame({ type: null })), 'invalid_field', 'type');
  refused(t, decode(frame({ type: ['WANT'] })), 'invalid_field', 'type');
  for (const type of ['NOPE', 'want', 'Want', ' WANT', 'WANT ', '', '__proto__', 'constructor', 'toString', 'hasOwnProperty']) {
    refused(t, decode(frame({ type, job_id: 'j1' })), 'unknown_type', 'type', 'j1');
  }
  const long = decode(frame({ type: 'X'.repeat(10_000) }));
  t.ok(isProtocolError(long) && long.message.length < 200, 'the message quotes a long type only in part');
  // A type outside the protocol stays unknown even when a caller's accept set names it.
  refused(t, decode(frame({ type: 'FOO' }), new Set(['FOO'])), 'unknown_type', 'type');
  refused(t, decode(frame({ type: 'WANT', job_id: 'j', service: 's', priority: 1 }), new Set(['QUERY'])), 'unknown_type', 'type', 'j');
});

t.test('job_id', async (t) => {
  const base = { type: 'WANT', service: 'convert', priority: 1 };
  refused(t, decode(frame(base)), 'invalid_field', 'job_id');
  refused(t, decode(frame({ ...base, job_id: 17 })), 'invalid_field', 'job_id');
  refused(t, decode(frame({ ...base, job_id: null })), 'invalid_field', 'job_id');
  refused(t, decode(frame({ ...base, job_id: '' })), 'invalid_field', 'job_id');
  const max = 'j'.repeat(200);
  t.strictSame(decode(frame({ ...base, job_id: max })), { ...base, job_id: max }, '200 characters are accepted');
  refused(t, decode(frame({ ...base, job_id: max + 'j' })), 'invalid_field', 'job_id');
  // Length is in UTF-16 code units: 100 astral characters are 200 units.
  const astral = '😀'.repeat(100);
  t.strictSame(decode(frame({ ...base, job_id: astral })), { ...base, job_id: astral });
  refused(t, decode(frame({ ...base, job_id: astral + 'x' })), 'invalid_field', 'job_id');
  for (const type of ['UNWANT', 'CANCEL', 'QUERY', 'DECLINE', 'OFFER', 'JOB']) {
    refused(t, decode(frame({ type })), 'invalid_field', 'job_id');
  }
  refused(t, decode(frame({ type: 'DONE', receipt: okReceipt() })), 'invalid_field', 'job_id');
  refused(t, decode(frame({ type: 'POSITION', running: 0, ahead: 0, capacity: 0, parked: 0, eta_ms: null })), 'invalid_field', 'job_id');
});

t.test('WANT service and priority', async (t) => {
  const base = { type: 'WANT', job_id: 'j1' };
  refused(t, decode(frame({ ...base, priority: 1 })), 'invalid_field', 'service', 'j1');
  refused(t, decode(frame({ ...base, service: 3, priority: 1 })), 'invalid_field', 'service', 'j1');
  refused(t, decode(frame({ ...base, service: '', priority: 1 })), 'invalid_field', 'service', 'j1');
  const s100 = 's'.repeat(100);
  t.strictSame(decode(frame({ ...base, service: s100, priority: 1 })), { ...base, service: s100, priority: 1 });
  refused(t, decode(frame({ ...base, service: s100 + 's', priority: 1 })), 'invalid_field', 'service', 'j1');

  const want = { ...base, service: 'convert' };
  refused(t, decode(frame(want)), 'invalid_field', 'priority', 'j1');
  for (const priority of [1.5, -0.5, 2 ** 60, -(2 ** 60), Number.MAX_SAFE_INTEGER + 1, '3', null, true, [1], { n: 1 }]) {
    refused(t, decode(frame({ ...want, priority })), 'invalid_field', 'priority', 'j1');
  }
  refused(t, decode('{"type":"WANT","job_id":"j1","service":"convert","priority":1e400}'), 'invalid_field', 'priority', 'j1');
  for (const priority of [0, -1, 100, Number.MAX_SAFE_INTEGER, Number.MIN_SAFE_INTEGER]) {
    t.strictSame(decode(frame({ ...want, priority })), { ...want, priority }, `priority ${priority}`);
  }
  // JSON has one number type: 1e3 and 2.0 are integers.
  t.strictSame(decode('{"type":"WANT","job_id":"j1","service":"convert","priority":1e3}'), { ...want, priority: 1000 });
  t.strictSame(decode('{"type":"WANT","job_id":"j1","service":"convert","priority":2.0}'), { ...want, priority: 2 });
});

t.test('OFFER and DECLINE', async (t) => {
  const offer = { type: 'OFFER', job_id: 'j1', token: 't', expires_ms: 5000 };
  refused(t, decode(frame({ ...offer, token: undefined })), 'invalid_field', 'token', 'j1');
  refused(t, decode(frame({ ...offer, token: '' })), 'invalid_field', 'token', 'j1');
  refused(t, decode(frame({ ...offer, token: 7 })), 'invalid_field', 'token', 'j1');
  refused(t, decode(frame({ ...offer, token: 't'.repeat(1025) })), 'invalid_field', 'token', 'j1');
  t.strictSame(decode(frame({ ...offer, token: 't'.repeat(1024) })), { ...offer, token: 't'.repeat(1024) });
  for (const expires_ms of [-1, '5000', null, undefined]) {
    refused(t, decode(frame({ ...offer, expires_ms })), 'invalid_field', 'expires_ms', 'j1');
  }
  t.strictSame(decode(frame({ ...offer, expires_ms: 0.5 })), { ...offer, expires_ms: 0.5 });
  refused(t, decode(frame({ type: 'DECLINE', job_id: 'j1' })), 'invalid_field', 'token', 'j1');
  refused(t, decode(frame({ type: 'JOB', job_id: 'j1', job: JOB })), 'invalid_field', 'token', 'j1');
});

t.test('JOB: the job validator', async (t) => {
  const jobFrame = (job: unknown): string => frame({ type: 'JOB', job_id: 'j1', token: 't', job });
  const cmd = (c: Record<string, unknown>): unknown => ({ service: 'convert', commands: [{ prog: 'magick', args: [], ...c }] });
  const arg = (a: unknown): unknown => cmd({ args: [{ type: 'value', value: 'ok' }, a] });
  const file = (f: Record<string, unknown>): unknown => arg({ type: 'file_in', file: { url: 'http://fylr/a', name: 'a.jpg', ...f } });
  const cases: [string, unknown, string][] = [
    ['job missing', undefined, 'job'],
    ['job null', null, 'job'],
    ['job an array', [JOB], 'job'],
    ['job a string', JSON.stringify(JOB), 'job'],
    ['service missing', { commands: [] }, 'job.service'],
    ['service too long', { service: 's'.repeat(101), commands: [] }, 'job.service'],
    ['timeout_sec negative', { ...JOB, timeout_sec: -1 }, 'job.timeout_sec'],
    ['timeout_sec zero', { ...JOB, timeout_sec: 0 }, 'job.timeout_sec'],
    ['timeout_sec a string', { ...JOB, timeout_sec: '60' }, 'job.timeout_sec'],
    ['timeout_sec over a week', { ...JOB, timeout_sec: 7 * 24 * 3600 + 1 }, 'job.timeout_sec'],
    ['commands not an array', { service: 'convert', commands: { prog: 'magick' } }, 'job.commands'],
    ['too many commands', { service: 'convert', commands: Array.from({ length: 65 }, () => ({ prog: 'p' })) }, 'job.commands'],
    ['command not an object', { service: 'convert', commands: ['magick'] }, 'job.commands[0]'],
    ['prog missing', { service: 'convert', commands: [{ args: [] }] }, 'job.commands[0].prog'],
    ['prog empty', cmd({ prog: '' }), 'job.commands[0].prog'],
    ['prog a number', cmd({ prog: 1 }), 'job.commands[0].prog'],
    ['prog too long', cmd({ prog: 'p'.repeat(101) }), 'job.commands[0].prog'],
    ['second command broken', { service: 'convert', commands: [{ prog: 'a' }, { prog: 'b', args: 'x' }] }, 'job.commands[1].args'],
    ['args a string', cmd({ args: '-' }), 'job.commands[0].args'],
    ['args an object', cmd({ args: { type: 'value', value: '-' } }), 'job.commands[0].args'],
    ['too many args', cmd({ args: Array.from({ length: 1025 }, () => ({ type: 'value', value: '' })) }), 'job.commands[0].args'],
    ['arg a string', arg('-'), 'job.commands[0].args[1]'],
    ['arg type unknown', arg({ type: 'env', value: 'X' }), 'job.commands[0].args[1].type'],
    ['arg type missing', arg({ value: 'X' }), 'job.commands[0].args[1].type'],
    ['value not a string', arg({ type: 'value', value: 3 }), 'job.commands[0].args[1].value'],
    ['value too long', arg({ type: 'value', value: 'v'.repeat(64 * 1024 + 1) }), 'job.commands[0].args[1].value'],
    ['file missing', arg({ type: 'file_out' }), 'job.commands[0].args[1].file'],
    ['file name with /', file({ name: 'a/b.jpg' }), 'job.commands[0].args[1].file.name'],
    ['file name absolute', file({ name: '/etc/passwd' }), 'job.commands[0].args[1].file.name'],
    ['file name ..', file({ name: '..' }), 'job.commands[0].args[1].file.name'],
    ['file name .', file({ name: '.' }), 'job.commands[0].args[1].file.name'],
    ['file name with \\', file({ name: '..\\x' }), 'job.commands[0].args[1].file.name'],
    ['file name with NUL', file({ name: 'a\0b' }), 'job.commands[0].args[1].file.name'],
    ['file name empty', file({ name: '' }), 'job.commands[0].args[1].file.name'],
    ['file name too long', file({ name: 'n'.repeat(256) }), 'job.commands[0].args[1].file.name'],
    ['file name missing', file({ name: undefined }), 'job.commands[0].args[1].file.name'],
    ['file url not a URL', file({ url: 'fylr/a' }), 'job.commands[0].args[1].file.url'],
    ['file url ftp', file({ url: 'ftp://fylr/a' }), 'job.commands[0].args[1].file.url'],
    ['file url file:', file({ url: 'file:///etc/passwd' }), 'job.commands[0].args[1].file.url'],
    ['file url too long', file({ url: 'http://fylr/' + 'a'.repeat(8192) }), 'job.commands[0].args[1].file.url'],
    ['stdin not body', cmd({ stdin: { type: 'file' } }), 'job.commands[0].stdin'],
    ['stdout a string', cmd({ stdout: 'body' }), 'job.commands[0].stdout'],
    ['pipes not an object', { ...JOB, pipes: 'http://fylr/pipe/x' }, 'job.pipes'],
    ['pipes.in ftp', { ...JOB, pipes: { in: 'ftp://fylr/pipe/x' } }, 'job.pipes.in'],
    ['pipes.out javascript:', { ...JOB, pipes: { out: 'javascript:alert(1)' } }, 'job.pipes.out'],
    ['pipes.out not a URL', { ...JOB, pipes: { out: '/pipe/x' } }, 'job.pipes.out'],
    ['pipes.in a number', { ...JOB, pipes: { in: 1 } }, 'job.pipes.in'],
    ['token empty', { ...JOB, token: '' }, 'job.token'],
  ];
  for (const [name, job, field] of cases) {
    t.test(name, async (t) => refused(t, decode(jobFrame(job)), 'invalid_field', field, 'j1'));
  }

  t.test('accepted shapes', async (t) => {
    const ok = (job: unknown): JobSpec | undefined => {
      const r = decode(jobFrame(job));
      if (isProtocolError(r) || r.type !== 'JOB') {
        t.fail('refused', { found: r });
        return undefined;
      }
      return r.job;
    };
    t.strictSame(ok({ service: 'convert' }), { service: 'convert', commands: [] }, 'commands default to []');
    t.strictSame(ok({ service: 'convert', commands: [{ prog: 'cat' }] }), { service: 'convert', commands: [{ prog: 'cat', args: [] }] }, 'args default to []');
    t.strictSame(
      ok({ service: 'convert', timeout_sec: null, pipes: null, token: null, commands: [{ prog: 'cat', args: null, stdin: null, stdout: null }] }),
      { service: 'convert', commands: [{ prog: 'cat', args: [] }] },
      'null means absent',
    );
    t.strictSame(ok({ service: 'convert', pipes: {} }), { service: 'convert', commands: [], pipes: {} });
    t.strictSame(ok({ service: 'convert', pipes: { in: null, out: 'https://f/p' } }), { service: 'convert', commands: [], pipes: { out: 'https://f/p' } });
    t.strictSame(ok({ service: 'c', timeout_sec: 0.5 }), { service: 'c', commands: [], timeout_sec: 0.5 });
    t.strictSame(ok(arg({ type: 'value', value: '' }))?.commands[0]?.args[1], { type: 'value', value: '' }, 'an empty value is an argument');
    t.strictSame(ok(file({ name: '..a.jpg' }))?.commands[0]?.args[1], { type: 'file_in', file: { url: 'http://fylr/a', name: '..a.jpg' } });
    t.strictSame(ok({ ...JOB, token: 'legacy' }), { ...JOB, token: 'legacy' }, 'a token is kept');
  });
});

t.test('DONE: the receipt', async (t) => {
  const done = (receipt: unknown): string => frame({ type: 'DONE', job_id: 'j1', receipt });
  const cases: [string, unknown, string][] = [
    ['receipt missing', undefined, 'receipt'],
    ['receipt an array', [RECEIPT], 'receipt'],
    ['ok missing', { ...RECEIPT, ok: undefined }, 'receipt.ok'],
    ['ok a string', { ...RECEIPT, ok: 'true' }, 'receipt.ok'],
    ['exit_code missing', { ...RECEIPT, exit_code: undefined }, 'receipt.exit_code'],
    ['exit_code a string', { ...RECEIPT, exit_code: '0' }, 'receipt.exit_code'],
    ['exit_code a fraction', { ...RECEIPT, exit_code: 0.5 }, 'receipt.exit_code'],
    ['duration_ms missing', { ...RECEIPT, duration_ms: undefined }, 'receipt.duration_ms'],
    ['duration_ms negative', { ...RECEIPT, duration_ms: -1 }, 'receipt.duration_ms'],
    ['commands an object', { ...RECEIPT, commands: {} }, 'receipt.commands'],
    ['commands[1] a string', { ...RECEIPT, commands: [RECEIPT.commands[0], 'x'] }, 'receipt.commands[1]'],
    ['error a string', { ...RECEIPT, error: 'boom' }, 'receipt.error'],
    ['error.code missing', { ...RECEIPT, error: { message: 'boom' } }, 'receipt.error.code'],
    ['error.code empty', { ...RECEIPT, error: { code: '', message: 'boom' } }, 'receipt.error.code'],
    ['error.code too long', { ...RECEIPT, error: { code: 'c'.repeat(101), message: 'boom' } }, 'receipt.error.code'],
  ];
  for (const [name, receipt, field] of cases) {
    t.test(name, async (t) => refused(t, decode(done(receipt)), 'invalid_field', field, 'j1'));
  }
  t.test('lenient defaults for the rest', async (t) => {
    const r = decode(done({ ok: true, exit_code: null, duration_ms: 0 }));
    t.strictSame(r, { type: 'DONE', job_id: 'j1', receipt: { ...okReceipt(), exit_code: null } });
    const odd = decode(
      done({
        ...RECEIPT,
        timed_out: 'yes',
        stopped: 1,
        stderr_line: 5,
        stdout_prefix: null,
        output_bytes: '22',
        commands: [{ prog: 7, exit_code: 'x', duration_ms: null }],
        error: { code: 'weird_future_code', message: 3 },
      }),
    );
    t.strictSame(odd, {
      type: 'DONE',
      job_id: 'j1',
      receipt: {
        ...RECEIPT,
        timed_out: false,
        stopped: false,
        stderr_line: '',
        stdout_prefix: '',
        output_bytes: 0,
        commands: [{ prog: '', exit_code: null, duration_ms: 0 }],
        error: { code: 'weird_future_code', message: '' },
      },
    });
    const noCommands = decode(done({ ...RECEIPT, commands: undefined, error: undefined }));
    t.strictSame(noCommands, { type: 'DONE', job_id: 'j1', receipt: { ...RECEIPT, commands: [], error: null } });
  });
});

t.test('POSITION', async (t) => {
  const pos = { type: 'POSITION', job_id: 'j1', running: 1, ahead: 2, capacity: 3, parked: 4, eta_ms: null };
  refused(t, decode(frame({ ...pos, eta_ms: undefined })), 'invalid_field', 'eta_ms', 'j1');
  refused(t, decode(frame({ ...pos, eta_ms: '5' })), 'invalid_field', 'eta_ms', 'j1');
  refused(t, decode(frame({ ...pos, eta_ms: -1 })), 'invalid_field', 'eta_ms', 'j1');
  for (const f of ['running', 'ahead', 'capacity', 'parked']) {
    refused(t, decode(frame({ ...pos, [f]: -1 })), 'invalid_field', f, 'j1');
    refused(t, decode(frame({ ...pos, [f]: 1.5 })), 'invalid_field', f, 'j1');
    refused(t, decode(frame({ ...pos, [f]: undefined })), 'invalid_field', f, 'j1');
  }
  t.strictSame(decode(frame({ ...pos, eta_ms: 0 })), { ...pos, eta_ms: 0 });
});

t.test('HELLO', async (t) => {
  const hello = MESSAGES[0]!;
  const cases: [string, Record<string, unknown>, string][] = [
    ['protocol 0', { protocol: 0 }, 'protocol'],
    ['protocol a string', { protocol: '1' }, 'protocol'],
    ['instance_id missing', { instance_id: undefined }, 'instance_id'],
    ['instance_id empty', { instance_id: '' }, 'instance_id'],
    ['name missing', { name: undefined }, 'name'],
    ['name too long', { name: 'n'.repeat(201) }, 'name'],
    ['services an array', { services: [] }, 'services'],
    ['service not naming a waitgroup', { services: { convert: 3 } }, 'services.convert'],
    ['waitgroups missing', { waitgroups: undefined }, 'waitgroups'],
    ['waitgroup a number', { waitgroups: { medium: 6 } }, 'waitgroups.medium'],
    ['processes negative', { waitgroups: { medium: { processes: -1, running: 0, parked: 0 } } }, 'waitgroups.medium.processes'],
    ['running missing', { waitgroups: { medium: { processes: 1, parked: 0 } } }, 'waitgroups.medium.running'],
    ['parked a fraction', { waitgroups: { medium: { processes: 1, running: 0, parked: 0.5 } } }, 'waitgroups.medium.parked'],
    ['clients a string', { clients: '2' }, 'clients'],
    ['draining missing', { draining: undefined }, 'draining'],
    ['draining a number', { draining: 0 }, 'draining'],
  ];
  for (const [name, patch, field] of cases) {
    t.test(name, async (t) => refused(t, decode(frame({ ...hello, ...patch })), 'invalid_field', field));
  }
  t.test('names such as __proto__ stay keys of their own', async (t) => {
    const text =
      '{"type":"HELLO","protocol":1,"instance_id":"i","name":"n",' +
      '"services":{"__proto__":"wg","constructor":"wg"},' +
      '"waitgroups":{"__proto__":{"processes":1,"running":0,"parked":0},"wg":{"processes":2,"running":0,"parked":0}},' +
      '"clients":0,"draining":false}';
    const r = decode(text);
    if (isProtocolError(r) || r.type !== 'HELLO') {
      t.fail('refused', { found: r });
      return;
    }
    t.strictSame(Object.keys(r.services), ['__proto__', 'constructor']);
    t.strictSame(Object.keys(r.waitgroups), ['__proto__', 'wg']);
    t.equal(Object.getPrototypeOf(r.waitgroups), Object.prototype, 'the prototype is untouched');
    t.equal(Object.getPrototypeOf(r.services), Object.prototype);
    t.notOk('processes' in r.waitgroups, 'no snapshot fields leak in through the prototype');
    t.equal(encode(r), JSON.stringify(JSON.parse(text)), 'it re-encodes with the same keys');
  });
  t.test('a top-level __proto__ key is just an unknown field', async (t) => {
    refused(t, decode('{"type":"UNWANT","__proto__":{"job_id":"x"}}'), 'invalid_field', 'job_id');
  });
});

t.test('ERROR', async (t) => {
  t.strictSame(
    decode(frame({ type: 'ERROR', code: 'code_from_a_newer_peer', message: 'm', job_id: 'j1' })),
    { type: 'ERROR', code: 'code_from_a_newer_peer', message: 'm', job_id: 'j1' },
    'an unknown code is accepted (forward compatibility)',
  );
  refused(t, decode(frame({ type: 'ERROR', code: 'Not A Code', message: 'm', job_id: 'j1' })), 'invalid_field', 'code', 'j1');
  refused(t, decode(frame({ type: 'ERROR', message: 'm' })), 'invalid_field', 'code');
  refused(t, decode(frame({ type: 'ERROR', code: 404, message: 'm' })), 'invalid_field', 'code');
  t.strictSame(decode(frame({ type: 'ERROR', code: 'draining' })), { type: 'ERROR', code: 'draining', message: '' }, 'message defaults to ""');
  // A job_id that could not have been echoed from a frame is dropped, not refused.
  for (const job_id of ['', 'j'.repeat(201), 5, null]) {
    t.strictSame(decode(frame({ type: 'ERROR', code: 'draining', message: 'm', job_id })), { type: 'ERROR', code: 'draining', message: 'm' }, `job_id ${JSON.stringify(job_id)}`);
  }
});

t.test('unknown fields are ignored and dropped', async (t) => {
  const extra = { extra: 1, nested: { a: [1, 2] }, Type: 'X', JOB_ID: 'y', future_flag: true };
  for (const m of MESSAGES) {
    t.strictSame(decode(frame({ ...extra, ...m })), m, `${m.type}: top level`);
  }
  const job = {
    ...JOB,
    ...extra,
    pipes: { ...JOB.pipes, extra: 'x' },
    commands: JOB.commands.map((c) => ({
      ...c,
      ...extra,
      env: ['SECRET=1'],
      stdin: { type: 'body', encoding: 'gzip' },
      args: c.args.map((a) => ({ ...a, ...extra, ...('file' in a ? { file: { ...a.file, size: 5 } } : {}) })),
    })),
  };
  t.strictSame(decode(frame({ type: 'JOB', job_id: 'j', token: 't', job })), { type: 'JOB', job_id: 'j', token: 't', job: JOB }, 'inside the job');
  const receipt = { ...RECEIPT, ...extra, commands: RECEIPT.commands.map((c) => ({ ...c, pid: 1 })), error: { ...RECEIPT.error, stack: 'x' } };
  t.strictSame(decode(frame({ type: 'DONE', job_id: 'j', receipt })), { type: 'DONE', job_id: 'j', receipt: RECEIPT }, 'inside the receipt');
  const hello = MESSAGES[0]!;
  if (hello.type !== 'HELLO') throw new Error('fixture');
  const wgs = Object.fromEntries(Object.entries(hello.waitgroups).map(([k, v]) => [k, { ...v, offered: 1 }]));
  t.strictSame(decode(frame({ ...hello, waitgroups: wgs })), hello, 'inside waitgroup snapshots');
});

t.test('jobId is carried when readable', async (t) => {
  refused(t, decode(frame({ type: 'WANT', job_id: 'j1', service: 'convert' })), 'invalid_field', 'priority', 'j1');
  refused(t, decode(frame({ type: 'NOPE', job_id: 'j1' })), 'unknown_type', 'type', 'j1');
  refused(t, decodeFromFylr(frame({ type: 'DONE', job_id: 'j1' })), 'unknown_type', 'type', 'j1');
  refused(t, decode(frame({ type: 'JOB', job_id: 'j1', token: 't', job: { service: 'c', commands: [{}] } })), 'invalid_field', 'job.commands[0].prog', 'j1');
  // Not readable: absent, not a string, empty, too long.
  refused(t, decode(frame({ type: 'NOPE' })), 'unknown_type', 'type');
  refused(t, decode(frame({ type: 'NOPE', job_id: 5 })), 'unknown_type', 'type');
  refused(t, decode(frame({ type: 'NOPE', job_id: '' })), 'unknown_type', 'type');
  refused(t, decode(frame({ type: 'NOPE', job_id: 'j'.repeat(201) })), 'unknown_type', 'type');
  refused(t, decode(frame({ type: 'NOPE', job_id: 'j'.repeat(200) })), 'unknown_type', 'type', 'j'.repeat(200));
});

t.test('the first broken field in field order is the one reported', async (t) => {
  refused(t, decode(frame({ type: 'WANT', priority: 'x' })), 'invalid_field', 'job_id');
  refused(t, decode(frame({ type: 'WANT', job_id: 'j1', priority: 'x' })), 'invalid_field', 'service', 'j1');
  refused(t, decode(frame({ type: 'OFFER', job_id: 'j1', expires_ms: -1 })), 'invalid_field', 'token', 'j1');
  refused(t, decode(frame({ type: 'POSITION', eta_ms: 'soon' })), 'invalid_field', 'job_id');
  refused(t, decode(frame({ type: 'POSITION', job_id: 'j1', running: 0, ahead: 0, capacity: 0, eta_ms: 'soon' })), 'invalid_field', 'parked', 'j1');
  refused(t, decode(frame({ type: 'HELLO', protocol: 1, draining: 'no' })), 'invalid_field', 'instance_id');
});
