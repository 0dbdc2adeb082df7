import assert from 'node:assert/strict';
import t from 'tap';
import fc from 'fast-check';
import { ERRORS, type ErrorCode } from '../../src/errors.js';
import { decode, decodeFromExec, decodeFromFylr, encode, isProtocolError, type ProtocolError } from '../../src/protocol/codec.js';
import type { FileRef, JobArg, JobCommand, JobSpec, Receipt } from '../../src/protocol/job.js';
import { EXEC_MESSAGE_TYPES, FYLR_MESSAGE_TYPES, type Message, type MessageType } from '../../src/protocol/messages.js';

const RUNS = { numRuns: 1000 };

const FYLR = new Set<string>(FYLR_MESSAGE_TYPES);
const EXEC = new Set<string>(EXEC_MESSAGE_TYPES);
const ALL = new Set<string>([...FYLR, ...EXEC]);
const CODEC_CODES = new Set<string>(['bad_frame', 'unknown_type', 'invalid_field']);

const DECODERS: [string, (text: string) => Message | ProtocolError, ReadonlySet<string>][] = [
  ['decode', (text) => decode(text), ALL],
  ['decodeFromFylr', decodeFromFylr, FYLR],
  ['decodeFromExec', decodeFromExec, EXEC],
];

/** What any decode result must look like; throws an AssertionError otherwise. */
function checkResult(r: Message | ProtocolError, accepted: ReadonlySet<string>): void {
  if (isProtocolError(r)) {
    assert.ok(CODEC_CODES.has(r.code), `code ${r.code}`);
    assert.equal(typeof r.message, 'string');
    if (r.code === 'bad_frame') {
      assert.equal(r.field, undefined);
      assert.equal(r.jobId, undefined);
    } else {
      assert.equal(typeof r.field, 'string');
      assert.ok(r.field!.length > 0);
      if (r.code === 'unknown_type') assert.equal(r.field, 'type');
    }
    if (r.jobId !== undefined) {
      assert.equal(typeof r.jobId, 'string');
      assert.ok(r.jobId.length >= 1 && r.jobId.length <= 200);
    }
    return;
  }
  assert.ok(accepted.has(r.type), `type ${String(r.type)} not accepted here`);
  // A decoded message is in normal form: encoding and decoding it again changes nothing.
  assert.deepStrictEqual(decode(encode(r)), r);
}

/** decode never throws, under every decoder, and its result is well-formed. */
function decodesSafely(text: string): void {
  for (const [, fn, accepted] of DECODERS) checkResult(fn(text), accepted);
}

// ---------------------------------------------------------------------------------------------
// Robustness: arbitrary input.

t.test('arbitrary strings never make decode throw', async (t) => {
  for (const unit of ['grapheme-ascii', 'grapheme', 'grapheme-composite', 'binary'] as const) {
    fc.assert(fc.property(fc.string({ unit, maxLength: 200 }), decodesSafely), RUNS);
    t.pass(`fc.string({unit: '${unit}'})`);
  }
  // Strings that look like frames: a JSON object prefix with random content.
  fc.assert(
    fc.property(fc.constantFrom('{', '{"type":', '{"type":"WANT",', '[', '"'), fc.string({ unit: 'grapheme', maxLength: 100 }), (p, s) => decodesSafely(p + s)),
    RUNS,
  );
  t.pass('frame-like prefixes');
});

t.test('arbitrary JSON never makes decode throw', async (t) => {
  fc.assert(fc.property(fc.json(), decodesSafely), RUNS);
  t.pass('fc.json()');
  fc.assert(fc.property(fc.json({ stringUnit: 'binary' }), decodesSafely), RUNS);
  t.pass("fc.json({stringUnit: 'binary'})");
  fc.assert(
    fc.property(fc.jsonValue(), (v) => {
      const text = JSON.stringify(v);
      decodesSafely(text);
      // Anything but an object is bad_frame.
      if (typeof v !== 'object' || v === null || Array.isArray(v)) assert.equal((decode(text) as ProtocolError).code, 'bad_frame');
    }),
    RUNS,
  );
  t.pass('fc.jsonValue()');
});

const FIELD_NAMES = [
  'type', 'job_id', 'service', 'priority', 'token', 'expires_ms', 'job', 'receipt', 'protocol', 'instance_id', 'name',
  'services', 'waitgroups', 'clients', 'draining', 'running', 'ahead', 'capacity', 'parked', 'eta_ms', 'code', 'message',
];

t.test('objects with a valid type and random fields never make decode throw', async (t) => {
  const randomFields = fc.dictionary(fc.oneof(fc.constantFrom(...FIELD_NAMES), fc.string()), fc.jsonValue({ maxDepth: 3 }), { maxKeys: 12 });
  fc.assert(
    fc.property(fc.constantFrom(...ALL), randomFields, (type, fields) => {
      const text = JSON.stringify({ ...fields, type });
      decodesSafely(text);
      const r = decode(text);
      if (isProtocolError(r)) assert.equal(r.code, 'invalid_field', 'a known type is never bad_frame or unknown_type');
      else assert.equal(r.type, type);
    }),
    RUNS,
  );
  t.pass('valid type, random fields');
});

// ---------------------------------------------------------------------------------------------
// Arbitraries for valid messages.

/** A string of at most `max` UTF-16 units: ASCII, any code point (incl. lone surrogates), or exactly `max`. */
function boundedString(max: number, min = 0): fc.Arbitrary<string> {
  return fc.oneof(
    fc.string({ minLength: min, maxLength: max }),
    fc.string({ unit: 'binary', minLength: min, maxLength: Math.floor(max / 2) }),
    fc.constant('x'.repeat(max)),
  );
}
const rec = { noNullPrototype: true } as const;
const anyString = fc.oneof(fc.string(), fc.string({ unit: 'binary' }));
const jobId = boundedString(200, 1);
const token = boundedString(1024, 1);
const service = boundedString(100, 1);
const nonNegInt = fc.oneof(fc.nat(100), fc.maxSafeNat());
/** Finite and >= 0; never -0 (JSON has no -0 to give back). */
const nonNegNumber = fc.oneof(nonNegInt, fc.double({ min: 0, noNaN: true, noDefaultInfinity: true }).filter((x) => !Object.is(x, -0)));
const dict = <T>(value: fc.Arbitrary<T>): fc.Arbitrary<Record<string, T>> =>
  fc.dictionary(fc.oneof(fc.string(), fc.constantFrom('__proto__', 'constructor', 'toString', 'a.b')), value, { maxKeys: 6, noNullPrototype: true });

const url: fc.Arbitrary<string> = fc.webUrl({ withQueryParameters: true, withFragments: true });
const fileName = fc
  .oneof(fc.string({ minLength: 1, maxLength: 255 }), fc.string({ unit: 'binary', minLength: 1, maxLength: 127 }), fc.constantFrom('..a', '...', 'a..b', '.hidden'))
  .filter((s) => s !== '.' && s !== '..' && !/[/\\\0]/.test(s));
const fileRef: fc.Arbitrary<FileRef> = fc.record({ url, name: fileName }, rec);
const jobArg: fc.Arbitrary<JobArg> = fc.oneof(
  fc.record({ type: fc.constant('value' as const), value: anyString }, rec),
  fc.record({ type: fc.constant('file_in' as const), file: fileRef }, rec),
  fc.record({ type: fc.constant('file_out' as const), file: fileRef }, rec),
);
const body = fc.constant({ type: 'body' as const });
const jobCommand: fc.Arbitrary<JobCommand> = fc.record(
  { prog: boundedString(100, 1), args: fc.array(jobArg, { maxLength: 5 }), stdin: body, stdout: body },
  { requiredKeys: ['prog', 'args'], noNullPrototype: true },
);
const jobSpec: fc.Arbitrary<JobSpec> = fc.record(
  {
    service,
    timeout_sec: fc.oneof(fc.integer({ min: 1, max: 604800 }), fc.double({ min: 0, minExcluded: true, max: 604800, noNaN: true })),
    commands: fc.array(jobCommand, { maxLength: 4 }),
    pipes: fc.record({ in: url, out: url }, { requiredKeys: [], noNullPrototype: true }),
    token,
  },
  { requiredKeys: ['service', 'commands'], noNullPrototype: true },
);
const exitCode = fc.option(fc.oneof(fc.integer({ min: -1, max: 255 }), fc.maxSafeInteger()), { nil: null });
const receipt: fc.Arbitrary<Receipt> = fc.record(
  {
    ok: fc.boolean(),
    exit_code: exitCode,
    duration_ms: nonNegNumber,
    timed_out: fc.boolean(),
    stopped: fc.boolean(),
    stderr_line: anyString,
    stdout_prefix: anyString,
    output_bytes: nonNegInt,
    commands: fc.array(fc.record({ prog: anyString, exit_code: exitCode, duration_ms: nonNegNumber }, { noNullPrototype: true }), { maxLength: 4 }),
    error: fc.option(fc.record({ code: boundedString(100, 1), message: anyString }, { noNullPrototype: true }), { nil: null }),
  },
  { noNullPrototype: true },
);

const ARBITRARIES: { [K in MessageType]: fc.Arbitrary<Extract<Message, { type: K }>> } = {
  HELLO: fc.record(
    {
      type: fc.constant('HELLO' as const),
      protocol: fc.oneof(fc.constant(1), fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER })),
      instance_id: boundedString(200, 1),
      name: boundedString(200),
      services: dict(anyString),
      waitgroups: dict(fc.record({ processes: nonNegInt, running: nonNegInt, parked: nonNegInt }, rec)),
      clients: nonNegInt,
      draining: fc.boolean(),
    },
    rec,
  ),
  WANT: fc.record({ type: fc.constant('WANT' as const), job_id: jobId, service, priority: fc.oneof(fc.integer({ min: -10, max: 10 }), fc.maxSafeInteger()) }, rec),
  UNWANT: fc.record({ type: fc.constant('UNWANT' as const), job_id: jobId }, rec),
  OFFER: fc.record({ type: fc.constant('OFFER' as const), job_id: jobId, token, expires_ms: nonNegNumber }, rec),
  JOB: fc.record({ type: fc.constant('JOB' as const), job_id: jobId, token, job: jobSpec }, rec),
  DECLINE: fc.record({ type: fc.constant('DECLINE' as const), job_id: jobId, token }, rec),
  DONE: fc.record({ type: fc.constant('DONE' as const), job_id: jobId, receipt }, rec),
  CANCEL: fc.record({ type: fc.constant('CANCEL' as const), job_id: jobId }, rec),
  QUERY: fc.record({ type: fc.constant('QUERY' as const), job_id: jobId }, rec),
  POSITION: fc.record(
    {
      type: fc.constant('POSITION' as const),
      job_id: jobId,
      running: nonNegInt,
      ahead: nonNegInt,
      capacity: nonNegInt,
      parked: nonNegInt,
      eta_ms: fc.option(nonNegNumber, { nil: null }),
    },
    rec,
  ),
  ERROR: fc.record(
    {
      type: fc.constant('ERROR' as const),
      code: fc.constantFrom(...(Object.keys(ERRORS) as ErrorCode[])),
      message: anyString,
      job_id: jobId,
    },
    { requiredKeys: ['type', 'code', 'message'], noNullPrototype: true },
  ),
};
const anyMessage: fc.Arbitrary<Message> = fc.oneof(...Object.values(ARBITRARIES));

t.test('decode(encode(m)) deep-equals m for every valid message', async (t) => {
  for (const [type, arb] of Object.entries(ARBITRARIES) as [MessageType, fc.Arbitrary<Message>][]) {
    fc.assert(
      fc.property(arb, (m) => {
        const text = encode(m);
        assert.deepStrictEqual(decode(text), m);
        assert.deepStrictEqual((FYLR.has(type) ? decodeFromFylr : decodeFromExec)(text), m);
        const wrong = (FYLR.has(type) ? decodeFromExec : decodeFromFylr)(text);
        assert.ok(isProtocolError(wrong) && wrong.code === 'unknown_type', 'the other direction refuses it');
      }),
      RUNS,
    );
    t.pass(type);
  }
});

t.test('unknown fields added anywhere at the top level are dropped', async (t) => {
  const extra = fc.dictionary(
    fc.string().filter((k) => !FIELD_NAMES.includes(k)),
    fc.jsonValue({ maxDepth: 2 }),
    { maxKeys: 5, noNullPrototype: true },
  );
  fc.assert(
    fc.property(anyMessage, extra, (m, more) => {
      assert.deepStrictEqual(decode(JSON.stringify({ ...more, ...m })), m);
    }),
    RUNS,
  );
  t.pass('extra fields');
});

t.test('one broken field is refused naming that field', async (t) => {
  const mutation = anyMessage.chain((m) =>
    fc.record({
      m: fc.constant(m),
      key: fc.constantFrom(...Object.keys(m).filter((k) => k !== 'type')),
      value: fc.oneof(fc.jsonValue({ maxDepth: 2 }), fc.constant(undefined)),
    }),
  );
  let refusals = 0;
  fc.assert(
    fc.property(mutation, ({ m, key, value }) => {
      const text = JSON.stringify({ ...m, [key]: value });
      decodesSafely(text);
      const r = decode(text);
      if (isProtocolError(r)) {
        refusals++;
        assert.equal(r.code, 'invalid_field');
        const f = r.field ?? '';
        assert.ok(f === key || f.startsWith(`${key}.`) || f.startsWith(`${key}[`), `field ${f} for a broken ${key}`);
        if (key !== 'job_id' && 'job_id' in m) assert.equal(r.jobId, m.job_id, 'the intact job_id is carried');
      } else {
        assert.equal(r.type, m.type);
      }
    }),
    RUNS,
  );
  t.ok(refusals > RUNS.numRuns / 4, `most mutations are refused (${refusals})`);
});
