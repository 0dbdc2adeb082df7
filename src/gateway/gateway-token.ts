/**
 * The tokens a gateway hands to OLD fylrs (PROTOCOL.md §5 "Served by the new side too").
 *
 *   gw1.<payload>.<mac>      payload = base64url(JSON {b, s, t, u?})
 *                            mac     = base64url(HMAC-SHA256(secret, "gw1." + payload))
 *
 *   b  the configured backend URL that issued the token      s  the service it is for
 *   t  the backend's own token                                u  where the PUT goes, when the
 *                                                                backend named a replica URL
 *
 * A legacy token is instance-local: only the backend (replica) that issued it can redeem it. The
 * gateway token carries that address with it, so the later `PUT /job` can arrive at ANY gateway
 * replica that shares the secret and still reach the right backend: no "Token not found" because
 * a balancer picked another gateway replica. The MAC makes the address unforgeable: a token that
 * does not verify is "Token not found" before any backend is contacted, and even a verified one
 * is only routed to a backend of the configuration (see legacy-api-gateway.ts).
 *
 * Nothing here expires a token: the backend does (10 s, single use) and answers "Token not found"
 * itself for a used or lapsed one.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { isPlainObject } from '../protocol/job.js';

const PREFIX = 'gw1.';

export interface GatewayTokenClaims {
  /** The configured backend URL that issued the token. */
  backend: string;
  service: string;
  /** The backend's own token. */
  token: string;
  /** The replica URL the backend named (`service` of its token response), when it named one. */
  target?: string;
}

export class GatewayTokens {
  readonly #secret: Buffer;

  /** An empty secret draws a random one: tokens then verify on this process only (one replica). */
  constructor(secret: string) {
    this.#secret = secret === '' ? randomBytes(32) : Buffer.from(secret, 'utf8');
  }

  #mac(payload: string): Buffer {
    return createHmac('sha256', this.#secret).update(PREFIX).update(payload).digest();
  }

  seal(claims: GatewayTokenClaims): string {
    const body: Record<string, string> = { b: claims.backend, s: claims.service, t: claims.token };
    if (claims.target !== undefined) body.u = claims.target;
    const payload = Buffer.from(JSON.stringify(body)).toString('base64url');
    return `${PREFIX}${payload}.${this.#mac(payload).toString('base64url')}`;
  }

  /** The claims of an authentic token, or null (forged, tampered, truncated, not ours). */
  open(text: string | undefined): GatewayTokenClaims | null {
    if (typeof text !== 'string' || !text.startsWith(PREFIX)) return null;
    const rest = text.slice(PREFIX.length);
    const dot = rest.indexOf('.');
    if (dot <= 0 || rest.indexOf('.', dot + 1) !== -1) return null;
    const payload = rest.slice(0, dot);
    const given = Buffer.from(rest.slice(dot + 1), 'base64url');
    const expected = this.#mac(payload);
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return null;
    let body: unknown;
    try {
      body = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
    } catch {
      return null;
    }
    if (!isPlainObject(body)) return null;
    const { b, s, t, u } = body;
    if (typeof b !== 'string' || typeof s !== 'string' || typeof t !== 'string') return null;
    if (u !== undefined && typeof u !== 'string') return null;
    return u === undefined ? { backend: b, service: s, token: t } : { backend: b, service: s, token: t, target: u };
  }
}
