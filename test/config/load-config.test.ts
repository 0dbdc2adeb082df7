import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { ConfigError } from '../../src/config/config-error.js';
import { legacyOnlyFylrKeys, loadServeConfig, parseFylrConfig, parseServeConfig } from '../../src/config/load-config.js';
import { parse } from 'yaml';

const base = {
  waitgroups: { slow: 2, medium: 6 },
  commands: { magick: { prog: '/usr/bin/magick', args: [], env: [] } },
  services: { convert: { waitgroup: 'medium', commands: ['magick'] } },
};

function keyOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (e) {
    if (e instanceof ConfigError) return e.key;
    throw e;
  }
  return undefined;
}

t.test('the example of PROTOCOL.md §6 parses with its defaults', async (t) => {
  const c = parseServeConfig(
    parse(`
listen: 127.0.0.1:8083
name: exec-a
waitgroups: {slow: 2, medium: 6, fast: 10}
commands: {magick: {prog: /usr/bin/magick, args: [], env: []}}
services: {convert: {waitgroup: medium, commands: [magick]}}
broker: {offer_timeout_ms: 5000, ping_interval_ms: 10000, max_wants_per_connection: 10000, max_payload_bytes: 4194304}
`),
  );
  t.same(c.listen, { host: '127.0.0.1', port: 8083 });
  t.equal(c.name, 'exec-a');
  t.same(c.waitgroups, { slow: 2, medium: 6, fast: 10 });
  t.same(c.services.convert, { waitgroup: 'medium', commands: ['magick'] });
  t.equal(c.broker.max_payload_bytes, 4194304);
  t.same(c.backends, []);
  t.equal(c.gateway.poll_interval_ms, 1000);
});

t.test('the embedded default serves cat, sha256, echo and sleep', async (t) => {
  const c = loadServeConfig(undefined);
  t.same(Object.keys(c.services).sort(), ['cat', 'echo', 'sha256', 'sleep']);
  for (const svc of Object.values(c.services)) t.ok(c.waitgroups[svc.waitgroup]! > 0);
});

t.test('--listen overrides listen, port 0 allowed', async (t) => {
  t.same(parseServeConfig(base, { listen: '127.0.0.1:0' }).listen, { host: '127.0.0.1', port: 0 });
  t.same(parseServeConfig({ ...base, listen: '[::1]:9000' }).listen, { host: '::1', port: 9000 });
  t.equal(keyOf(() => parseServeConfig(base, { listen: 'nope' })), '--listen');
});

t.test('each kind of mistake names its key', async (t) => {
  const cases: [unknown, string][] = [
    [{ ...base, waitgroups: { slow: -1 } }, 'waitgroups.slow'],
    [{ ...base, waitgroups: { slow: 'two' } }, 'waitgroups.slow'],
    [{ ...base, services: { convert: { waitgroup: 'nope', commands: [] } } }, 'services.convert.waitgroup'],
    [{ ...base, services: { convert: { waitgroup: 'medium', commands: ['rm'] } } }, 'services.convert.commands[0]'],
    [{ ...base, commands: { magick: { args: [] } } }, 'commands.magick.prog'],
    [{ ...base, commands: { magick: { prog: 'x', env: ['NOEQUALS'] } } }, 'commands.magick.env[0]'],
    [{ ...base, broker: { offer_timeout_ms: 0 } }, 'broker.offer_timeout_ms'],
    [{ ...base, broker: { bogus: 1 } }, 'broker.bogus'],
    [{ ...base, colour: 'blue' }, 'colour'],
    [{ ...base, backends: [{ url: 'ftp://x' }] }, 'backends[0].url'],
    [{ ...base, backends: [{ url: 'http://old:8083' }], broker: { offer_timeout_ms: 10000 } }, 'broker.offer_timeout_ms'],
    [{ ...base, backends: [{ url: 'http://old:8083', waitgroups: { huge: 3 } }] }, 'backends[0].waitgroups.huge'],
    [{ ...base, services: undefined }, 'services'],
  ];
  for (const [raw, key] of cases) t.equal(keyOf(() => parseServeConfig(raw)), key, `names ${key}`);
});

t.test('the message is one line that names the key and the problem', async (t) => {
  try {
    parseServeConfig({ ...base, waitgroups: { slow: 1.5 } });
    t.fail('should throw');
  } catch (e) {
    t.type(e, ConfigError);
    t.equal((e as Error).message, 'config: waitgroups.slow: must be an integer, got 1.5');
    t.notMatch((e as Error).message, /\n/);
  }
});

t.test('a gateway needs no commands and accepts backends as strings or mappings', async (t) => {
  const c = parseServeConfig({
    waitgroups: { medium: 6 },
    services: { convert: { waitgroup: 'medium', commands: ['magick'] } },
    backends: ['http://old-1:8083/', { url: 'http://old-2:8083', waitgroups: { medium: 2 } }],
    gateway: { secret: 's3cret', advertised_url: 'http://gw:8083' },
  });
  t.same(c.backends, [{ url: 'http://old-1:8083' }, { url: 'http://old-2:8083', waitgroups: { medium: 2 } }]);
  t.same(c.commands, {});
  t.equal(c.gateway.secret, 's3cret');
});

t.test('a missing or unparsable file names --config or the file', async (t) => {
  t.equal(keyOf(() => loadServeConfig('/nonexistent/slotgate.yml')), '--config');
  const dir = mkdtempSync(join(tmpdir(), 'slotgate-cfg-'));
  const file = join(dir, 'bad.yml');
  writeFileSync(file, 'waitgroups: {slow: [\n');
  t.equal(keyOf(() => loadServeConfig(file)), file);
});

t.test('fylr configuration', async (t) => {
  const c = parseFylrConfig({
    listen: '127.0.0.1:0',
    execserver: { addresses: ['http://exec:8083/'], connectTimeoutSec: 5, callbackBackendInternalURL: 'http://fylr:8081' },
    database: 'postgres://postgres@127.0.0.1/test',
  });
  t.same(c.execserver.addresses, ['http://exec:8083']);
  t.equal(c.execserver.connectTimeoutSec, 5);
  t.equal(c.execserver.parallel, 18);
  t.equal(c.execserver.parallelHigh, 10);
  t.equal(c.execserver.max_connections_per_address, 8);
  t.equal(c.execserver.reprobe_interval_ms, 60000);
  t.equal(keyOf(() => parseFylrConfig({ execserver: { addresses: [] } })), 'execserver.addresses');
  t.equal(keyOf(() => parseFylrConfig({ execserver: { addresses: ['x'] } })), 'execserver.addresses[0]');
  t.equal(keyOf(() => parseFylrConfig({ execserver: { addresses: ['http://a'] }, database: 'mysql://x' })), 'database');
  t.equal(keyOf(() => parseFylrConfig({ execserver: { addresses: ['http://a'], parallel: 0 } })), 'execserver.parallel');
});

t.test('legacyOnlyFylrKeys names the old worker-pool sizes a fylr.yml sets', async (t) => {
  t.same(legacyOnlyFylrKeys({ execserver: { addresses: ['http://x'], parallel: 18, parallelHigh: 0 } }), ['execserver.parallel', 'execserver.parallelHigh']);
  t.same(legacyOnlyFylrKeys({ execserver: { addresses: ['http://x'], parallelHigh: 10 } }), ['execserver.parallelHigh']);
  t.same(legacyOnlyFylrKeys({ execserver: { addresses: ['http://x'] } }), []);
  t.same(legacyOnlyFylrKeys(null), []);
  t.same(legacyOnlyFylrKeys({ execserver: 'nonsense' }), []);
});
