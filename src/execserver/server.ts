/**
 * The execserver process: one fastify listener serving /broker, the legacy API and the admin
 * routes. With a LocalSlotSource it is a native execserver; the gateway passes its own source and
 * legacy routes. Nothing here knows which.
 *
 * Shutdown has two ways: `drainAndClose()` (SIGTERM, `POST /drain`: rule 7, the jobs finish) and
 * `close()` (at once: connections close, running jobs are stopped, and it resolves once they
 * ended).
 */
import websocket from '@fastify/websocket';
import Fastify, { type FastifyInstance, type FastifyPluginAsync } from 'fastify';
import { type Clock, systemClock } from '../clock.js';
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
  /** Rule 7: drain, then close. Idempotent: every call returns the same promise. */
  drainAndClose(): Promise<void>;
  /** Closes at once (running jobs are stopped); resolves when they have ended. Idempotent. */
  close(): Promise<void>;
  /** Settles when the server has closed, by either way. */
  readonly closed: Promise<void>;
}

/**
 * Old fylrs put the whole job JSON into the query string of `PUT /job`; Node's default limit of
 * 16 KiB for the request head would refuse large jobs that the old Go execserver (1 MiB) took.
 */
export const MAX_REQUEST_HEAD_BYTES = 1024 * 1024;

export async function createExecserver(opts: ExecserverOptions): Promise<Execserver> {
  const clock = opts.clock ?? systemClock;
  const config = opts.config;
  const source = opts.source ?? new LocalSlotSource(config, clock);
  const metrics = new ExecserverMetrics();
  const broker = new Broker({ config, source, clock, observer: metrics });
  metrics.attach(broker);

  const app = Fastify({
    logger: opts.logger ?? false,
    forceCloseConnections: true,
    bodyLimit: 1024 * 1024,
    http: { maxHeaderSize: MAX_REQUEST_HEAD_BYTES },
  });
  // Job bodies are streams (stdin of body-mode jobs): no parser may buffer them.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', (_req, _payload, done) => done(null));
  await app.register(websocket, {
    options: { maxPayload: config.broker.max_payload_bytes },
    // ws closes the socket itself on protocol errors (a frame over maxPayload: 1009) and reports
    // the error afterwards; the plugin's default handler would terminate the socket before the
    // close frame is out, and the peer would see 1006 instead of 1009.
    errorHandler: () => undefined,
  });

  let closing: Promise<void> | undefined;
  let draining: Promise<void> | undefined;
  let tokens: LegacyTokens | undefined;
  let closedResolve!: () => void;
  const closed = new Promise<void>((resolve) => {
    closedResolve = resolve;
  });

  const close = (): Promise<void> => {
    closing ??= (async () => {
      broker.closeAll();
      tokens?.releaseAll();
      await app.close();
      await source.close();
      closedResolve();
    })();
    return closing;
  };
  const drainAndClose = (): Promise<void> => {
    draining ??= broker.drain().then(close);
    return draining;
  };

  if (!opts.legacyApi) tokens = new LegacyTokens(source, clock);
  const localTokens = tokens;
  const extraStatus =
    opts.extraStatus ??
    (localTokens ? () => ({ legacy_tokens: { outstanding: localTokens.outstanding, issued: localTokens.issued, expired: localTokens.expired } }) : undefined);

  await app.register(brokerRoute, { broker });
  await app.register(adminRoutes, {
    broker,
    metrics,
    drain: () => {
      void drainAndClose();
    },
    ...(extraStatus ? { extraStatus } : {}),
  });
  if (opts.legacyApi) await app.register(opts.legacyApi({ broker, metrics }));
  else if (localTokens) await app.register(localLegacyApi, { broker, tokens: localTokens, metrics, config });

  return {
    app,
    broker,
    source,
    metrics,
    closed,
    async listen() {
      return app.listen({ host: config.listen.host, port: config.listen.port });
    },
    drainAndClose,
    close,
  };
}
