import { readFileSync } from 'node:fs';
import t from 'tap';
import { BROKER_ERROR_CODES, ERRORS, type ErrorSpec, httpStatusOf, isErrorCode, SlotgateError } from '../src/errors.js';

const DOC = new URL('../docs/errors.md', import.meta.url);

interface DocRow {
  line: number;
  code: string;
  status: string;
  broker: string;
  meaning: string;
}

/**
 * The rows of the catalogue table: the Markdown table whose header reads
 * `| code | HTTP status | broker ERROR frame ... | meaning |`.
 */
function catalogueRows(markdown: string): DocRow[] | string {
  const lines = markdown.split('\n');
  const cells = (l: string): string[] => l.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());
  const header = lines.findIndex((l) => {
    if (!l.trim().startsWith('|')) return false;
    const c = cells(l);
    return c.length === 4 && c[0] === 'code' && c[1] === 'HTTP status' && /^broker ERROR frame/.test(c[2]!) && c[3] === 'meaning';
  });
  if (header < 0) return 'no table with the header | code | HTTP status | broker ERROR frame | meaning |';
  if (!/^\|(\s*:?-{3,}:?\s*\|){4}$/.test(lines[header + 1]?.trim() ?? '')) return `line ${header + 2}: expected the separator row`;
  const rows: DocRow[] = [];
  for (let i = header + 2; i < lines.length && lines[i]!.trim().startsWith('|'); i++) {
    const [code = '', status = '', broker = '', ...meaning] = cells(lines[i]!);
    rows.push({ line: i + 1, code: code.replace(/^`(.*)`$/, '$1'), status, broker, meaning: meaning.join('|') });
  }
  return rows;
}

/** Every disagreement between the documented rows and the catalogue, as sentences. */
function compare(rows: readonly DocRow[], catalogue: Readonly<Record<string, ErrorSpec>>): string[] {
  const problems: string[] = [];
  const seen = new Set<string>();
  for (const r of rows) {
    if (seen.has(r.code)) problems.push(`line ${r.line}: ${r.code} is listed twice`);
    seen.add(r.code);
    if (!Object.hasOwn(catalogue, r.code)) {
      problems.push(`line ${r.line}: ${r.code} is not a code of src/errors.ts`);
      continue;
    }
    const spec = catalogue[r.code]!;
    if (!/^\d{3}$/.test(r.status) || Number(r.status) !== spec.status) problems.push(`line ${r.line}: ${r.code} has status ${r.status}, src/errors.ts says ${spec.status}`);
    if (r.broker !== 'yes' && r.broker !== 'no') problems.push(`line ${r.line}: ${r.code}: broker column must be yes or no, not ${JSON.stringify(r.broker)}`);
    else if ((r.broker === 'yes') !== spec.broker) problems.push(`line ${r.line}: ${r.code} broker ${r.broker}, src/errors.ts says ${spec.broker ? 'yes' : 'no'}`);
    if (r.meaning.length === 0) problems.push(`line ${r.line}: ${r.code} has no meaning`);
  }
  for (const code of Object.keys(catalogue)) {
    if (!seen.has(code)) problems.push(`${code} of src/errors.ts is missing from docs/errors.md`);
  }
  return problems;
}

t.test('docs/errors.md lists exactly the codes of src/errors.ts', async (t) => {
  const rows = catalogueRows(readFileSync(DOC, 'utf8'));
  if (typeof rows === 'string') {
    t.fail(rows);
    return;
  }
  t.equal(rows.length, Object.keys(ERRORS).length, 'one row per code');
  t.strictSame(compare(rows, ERRORS), [], 'no disagreement either way');
});

t.test('the comparison catches each kind of disagreement', async (t) => {
  const doc = readFileSync(DOC, 'utf8');
  const rows = catalogueRows(doc);
  if (typeof rows === 'string') {
    t.fail(rows);
    return;
  }
  const [first, second, ...rest] = rows;
  if (first === undefined || second === undefined) {
    t.fail('the table is too short to tamper with');
    return;
  }
  t.match(compare([second, ...rest], ERRORS), [new RegExp(`^${first.code} of src/errors.ts is missing`)], 'a missing row');
  t.match(compare([...rows, { ...first, line: 999, code: 'made_up' }], ERRORS), [/line 999: made_up is not a code/], 'an extra row');
  t.match(compare([...rows, { ...first, line: 999 }], ERRORS), [new RegExp(`line 999: ${first.code} is listed twice`)], 'a duplicate row');
  t.match(compare([{ ...first, status: '418' }, second, ...rest], ERRORS), [/has status 418/], 'a wrong status');
  t.match(compare([{ ...first, broker: first.broker === 'yes' ? 'no' : 'yes' }, second, ...rest], ERRORS), [/broker (yes|no), src\/errors.ts says/], 'a wrong broker flag');
  t.match(compare([{ ...first, broker: 'true' }, second, ...rest], ERRORS), [/must be yes or no/], 'a broker column that is not yes/no');
  t.match(compare(rows, { ...ERRORS, brand_new: { status: 400, broker: false, description: 'x' } }), [/brand_new of src\/errors.ts is missing/], 'a new code without docs');
  t.type(catalogueRows(doc.replace('| code | HTTP status |', '| Code | HTTP status |')), 'string', 'a renamed header is noticed');
});

t.test('the broker codes are exactly those of PROTOCOL.md §1 rule 5', async (t) => {
  // Rule 5's refusal codes, plus offer_expired which is sent rather than refused.
  const rule5 = ['bad_frame', 'unknown_type', 'invalid_field', 'unknown_service', 'duplicate_job', 'unknown_job', 'no_offer', 'draining', 'too_many_wants', 'offer_expired'];
  t.strictSame([...BROKER_ERROR_CODES].sort(), rule5.sort());
});

t.test('catalogue helpers', async (t) => {
  for (const [code, spec] of Object.entries(ERRORS)) {
    t.ok(/^[a-z][a-z0-9_]*$/.test(code), `${code} is snake_case`);
    t.ok(Number.isInteger(spec.status) && spec.status >= 400 && spec.status <= 599, `${code}: ${spec.status} is an error status`);
    t.ok(spec.description.length > 0, `${code} has a description`);
    t.ok(isErrorCode(code));
  }
  for (const v of ['toString', '__proto__', 'constructor', 'hasOwnProperty', 'BAD_FRAME', '', 5, null, undefined, { code: 'bad_frame' }]) {
    t.notOk(isErrorCode(v), `${String(v)} is not a code`);
  }
  t.equal(httpStatusOf('draining'), 503);
  t.equal(httpStatusOf('token_not_found'), 400);
  const cause = new Error('root');
  const e = new SlotgateError('pipe_used', 'pipe already served', { cause });
  t.ok(e instanceof Error);
  t.equal(e.name, 'SlotgateError');
  t.equal(e.code, 'pipe_used');
  t.equal(e.status, 410);
  t.equal(e.message, 'pipe already served');
  t.equal(e.cause, cause);
  t.type(e.stack, 'string');
});
