/** The example configuration of docs/gateway.md is a valid gateway configuration, and means what the page says. */
import { readFileSync } from 'node:fs';
import t from 'tap';
import { parseServeConfig, parseYamlText } from '../../src/config/load-config.js';
import { GatewaySlotSource } from '../../src/gateway/gateway-slot-source.js';
import { systemClock } from '../../src/clock.js';

const page = readFileSync(new URL('../../docs/gateway.md', import.meta.url), 'utf8');
const yaml = /```yaml\n([\s\S]*?)```/.exec(page)?.[1];

t.test('the example configuration of docs/gateway.md loads as a gateway', async (t) => {
  t.ok(yaml, 'the page has a yaml block');
  const config = parseServeConfig(parseYamlText(yaml as string, 'docs/gateway.md'));
  t.equal(config.backends.length, 4);
  t.ok(config.gateway.secret.length > 0);
  t.equal(config.gateway.advertised_url, 'http://exec-gateway:8083');
  const source = new GatewaySlotSource({ config, clock: systemClock });
  t.teardown(() => source.close());
  // 2 + 2 (top level) + 8 (gpu-exec replaces) + 4 (the pool) slow; gpu-exec has no medium or fast.
  t.equal(source.processes('slow'), 16);
  t.equal(source.processes('medium'), 6 + 6 + 0 + 12);
  t.equal(source.processes('fast'), 10 + 10 + 0 + 20);
});
