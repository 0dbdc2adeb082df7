/**
 * Which address a backend's token may be redeemed at. The gateway never addresses anything but
 * its configured backends, whatever a job or a header says; the one thing it accepts from the
 * outside is the `service` URL in a backend's own token response (`tokenResponseSendServerIP`),
 * because a backend that is a balancer in front of several old replicas can only be redeemed at
 * the replica that issued the token. The rule:
 *
 *   1. the URL names the issuing backend itself, or another configured backend:  that backend;
 *   2. otherwise it may only be what tokenResponseSendServerIP produces,
 *      `http(s)://<IP literal>:<port>` with no path, user, query or fragment, and the IP must not
 *      be unspecified, link-local (169.254.0.0/16 and fe80::/10: the cloud metadata addresses),
 *      multicast or broadcast. Such a URL is a replica OF THE ISSUING BACKEND: it is stored in
 *      the gateway token under that backend's MAC, never learnt from an old fylr;
 *   3. anything else (a host name, a path, credentials) is refused: the token is not used.
 *
 * The replica only ever receives what its backend would: `PUT /job/{configured service}` with a
 * job the gateway validated, and the empty give-back job.
 */
import { isIP } from 'node:net';

function parse(text: string): URL | null {
  try {
    return new URL(text);
  } catch {
    return null;
  }
}

function origin(text: string): string | null {
  return parse(text)?.origin ?? null;
}

function forbiddenV4(ip: string): boolean {
  const [a, b] = ip.split('.').map(Number) as [number, number];
  return a === 0 || (a === 169 && b === 254) || a >= 224;
}

function forbiddenV6(ip: string): boolean {
  const v = ip.toLowerCase();
  if (v === '::' || /^fe[89ab]/.test(v) || v.startsWith('ff')) return true;
  // An IPv4-mapped address is judged as the IPv4 address it maps.
  const dotted = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(v);
  if (dotted !== null) return forbiddenV4(dotted[1] as string);
  // URL normalises ::ffff:169.254.169.254 to ::ffff:a9fe:a9fe.
  const hex = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(v);
  if (hex === null) return false;
  const hi = parseInt(hex[1] as string, 16);
  const lo = parseInt(hex[2] as string, 16);
  return forbiddenV4(`${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`);
}

/**
 * The base URL to PUT a token of `backendUrl` to, given the `service` URL its token response
 * named; null when that URL must not be addressed. `configured` lists every backend URL.
 */
export function acceptServiceUrl(named: string, backendUrl: string, configured: readonly string[]): string | null {
  const u = parse(named);
  if (u === null || (u.protocol !== 'http:' && u.protocol !== 'https:')) return null;
  if (u.username !== '' || u.password !== '' || u.search !== '' || u.hash !== '') return null;
  const trimmed = named.replace(/\/+$/, '');
  for (const b of [backendUrl, ...configured]) {
    if (trimmed === b || (u.pathname === '/' && u.origin === origin(b) && parse(b)?.pathname === '/')) return b;
  }
  if (u.pathname !== '/') return null;
  const host = u.hostname.startsWith('[') ? u.hostname.slice(1, -1) : u.hostname;
  const kind = isIP(host);
  if (kind === 4 && !forbiddenV4(host)) return u.origin;
  if (kind === 6 && !forbiddenV6(host)) return u.origin;
  return null;
}
