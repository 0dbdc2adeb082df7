/**
 * The execserver process: one fastify listener serving /broker, the legacy API and the admin
 * routes. With a LocalSlotSource it is a native execserver; the gateway passes its own source and
 * legacy routes. Nothing here knows which.
 */
import websocket from '@fastify/websocket';
import Fastify, { type FastifyInstance, type FastifyPluginAsync } from 'fastify';
import { type Clock, every, systemClock } from '../clock.js';
import type { ServeConfig } from '../config/types.js';
import { LocalSlotSource } from '../slots/local-slot-source.js';
import type { SlotSource } from '../slots/slot-source.js';
import { adminRoutes } from './admin-routes.js';
import { Broker } from './broker.js';
import { brokerRoute } from './broker-route.js';
import { localLegacyApi } from './legacy-api-local.js';
import { LegacyTokens } from './legacy-tokens.js';
import { ExecserverMetrics } from './metrics.js';

export interface ExecserverOptions {
  config: ServeConfig;
  clock?: Clock;
  /** Defaults to local slots (a native execserver). */
  source?: SlotSource;
  /** The legacy API; defaults to the native one over `source`. */
  legacyApi?: (ctx: { broker: Broker; metrics: ExecserverMetrics }) => FastifyPluginAsync;
  extraStatus?: () => Record<string, unknown>;
  logger?: boolean;
}

export interface Execserver {
  readonly app: FastifyInstance;
  readonly broker: Broker;
  readonly source: SlotSource;
  readonly metrics: ExecserverMetrics;
  /** Listens on config.listen; resolves with the base URL (the real port for port 0). */
  listen(): Promise<string>;
  /** Rule 7: drain, then close. */
  drainAndClose(): Promise<void>;
  close(): Promise<void>;
}

function inUseTotal(source: SlotSource, config: ServeConfig): number {
  return Object.keys(config.waitgroups).reduce((n, wg) => n + source.inUse(wg), 0);
}

export async function createExecserver(opts: ExecserverOptions): Promise<Execserver> {
  const clock = opts.clock ?? systemClock;
  const config = opts.config;
  const source = opts.source ?? new LocalSlotSource(config, clock);
  const metrics = new ExecserverMetrics();
  const broker = new Broker({ config, source, clock, observer: metrics });
  metrics.attach(broker);

  const app = Fastify({ logger: opts.logger ?? false, forceCloseConnections: true, bodyLimit: 1024 * 1024 });
  // Job bodies are streams (stdin of body-mode jobs): no parser may buffer them.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', (_req, _payload, done) => done(null));
  await app.register(websocket, { options: { maxPayload: config.broker.max_payload_bytes } });
  await app.register(brokerRoute, { broker });
  await app.register(adminRoutes, { broker, metrics, ...(opts.extraStatus ? { extraStatus: opts.extraStatus } : {}) });
  let tokens: LegacyTokens | undefined;
  if (opts.legacyApi) {
    await app.register(opts.legacyApi({ broker, metrics }));
  } else {
    tokens = new LegacyTokens(source, clock);
    await app.register(localLegacyApi, { broker, tokens, metrics });
  }

  let closed = false;
  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    broker.closeAll();
    tokens?.releaseAll();
    await app.close();
    await source.close();
  };

  return {
    app,
    broker,
    source,
    metrics,
    async listen() {
      const address = await app.listen({ host: config.listen.host, port: config.listen.port });
      return address.replace('[::1]', '[::1]');
    },
    async drainAndClose() {
      await broker.drain();
      // Legacy tokens still out may be redeemed until they lapse; wait for every slot to come home.
      await new Promise<void>((resolve) => {
        if (inUseTotal(source, config) === 0) return resolve();
        const stop = every(clock, 25, () => {
          if (inUseTotal(source, config) === 0) {
            stop();
            resolve();
          }
        });
      });
      await close();
    },
    close,
  };
}
