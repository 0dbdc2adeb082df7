import t from 'tap';
import { GatewayTokens } from '../../src/gateway/gateway-token.js';

const claims = { backend: 'http://old-1:8083', service: 'convert', token: 'b7c1e0f2-legacy-token' };

t.test('a sealed token opens to its claims on every replica that shares the secret', async (t) => {
  const a = new GatewayTokens('s3cret');
  const b = new GatewayTokens('s3cret');
  const sealed = a.seal(claims);
  t.match(sealed, /^gw1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/);
  t.same(b.open(sealed), claims);
  const withTarget = a.seal({ ...claims, target: 'http://10.1.2.3:8083' });
  t.same(b.open(withTarget), { ...claims, target: 'http://10.1.2.3:8083' });
  t.ok(sealed.length < 1024, 'fits the job JSON token limit');
});

t.test('forged, tampered, truncated and foreign tokens do not open', async (t) => {
  const tokens = new GatewayTokens('s3cret');
  const sealed = tokens.seal(claims);
  const [prefix, payload, mac] = sealed.split('.') as [string, string, string];
  const otherPayload = Buffer.from(JSON.stringify({ b: 'http://evil:80', s: 'convert', t: 'x' })).toString('base64url');
  const flip = (s: string, i: number) => s.slice(0, i) + (s[i] === 'A' ? 'B' : 'A') + s.slice(i + 1);
  const bad = {
    'other secret': new GatewayTokens('other').seal(claims),
    'payload swapped, mac kept': `${prefix}.${otherPayload}.${mac}`,
    'payload byte flipped': `${prefix}.${flip(payload, 3)}.${mac}`,
    'mac byte flipped': `${prefix}.${payload}.${flip(mac, 5)}`,
    'mac truncated': `${prefix}.${payload}.${mac.slice(0, -2)}`,
    'no mac': `${prefix}.${payload}`,
    'extra part': `${sealed}.x`,
    'other prefix': `gw2.${payload}.${mac}`,
    'a raw legacy token': 'b7c1e0f2-legacy-token',
    empty: '',
  };
  for (const [what, text] of Object.entries(bad)) t.equal(tokens.open(text), null, what);
  t.equal(tokens.open(undefined), null, 'absent');
});

t.test('without a configured secret each process draws its own: tokens verify on that process only', async (t) => {
  const a = new GatewayTokens('');
  const b = new GatewayTokens('');
  const sealed = a.seal(claims);
  t.same(a.open(sealed), claims);
  t.equal(b.open(sealed), null);
});
