/**
 * `createGateway`: the execserver shell of src/execserver/server.ts with the gateway's slot
 * source (legacy tokens held from the configured backends) and the gateway's legacy API (old
 * fylrs' tokens sealed with the shared secret, PUTs proxied to the issuing backend). Everything
 * else (/broker, the want-book, admin routes, drain) is the native execserver's.
 */
import { type Clock, systemClock } from '../clock.js';
import type { ServeConfig } from '../config/types.js';
import { createExecserver, type Execserver } from '../execserver/server.js';
import { GatewaySlotSource } from './gateway-slot-source.js';
import { GatewayTokens } from './gateway-token.js';
import { gatewayLegacyApi } from './legacy-api-gateway.js';
import { createLegacyProxy } from './proxy.js';

export interface GatewayOptions {
  /** Must list `backends`. */
  config: ServeConfig;
  clock?: Clock;
  logger?: boolean;
}

export async function createGateway(opts: GatewayOptions): Promise<Execserver> {
  const { config } = opts;
  if (config.backends.length === 0) throw new Error('createGateway: the configuration lists no backends');
  const clock = opts.clock ?? systemClock;
  const source = new GatewaySlotSource({ config, clock });
  const tokens = new GatewayTokens(config.gateway.secret);
  const proxy = createLegacyProxy();
  const server = await createExecserver({
    config,
    clock,
    source,
    legacyApi: ({ broker, metrics }) => gatewayLegacyApi({ config, broker, metrics, source, tokens, proxy }),
    extraStatus: () => ({ gateway: source.status() }),
    ...(opts.logger !== undefined ? { logger: opts.logger } : {}),
  });
  // Draining (SIGTERM, POST /drain): no more token requests, tokens nobody holds go back.
  source.watchDraining(() => server.broker.draining);
  return server;
}
