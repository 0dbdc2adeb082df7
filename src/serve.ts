/**
 * `slotgate serve`: a native execserver, or a gateway when the config lists backends.
 */
import type { ServeConfig } from './config/types.js';
import { createExecserver, type Execserver } from './execserver/server.js';

export interface RunningServe {
  url: string;
  instanceId: string;
  kind: 'execserver' | 'gateway';
  server: Execserver;
  drainAndClose(): Promise<void>;
  close(): Promise<void>;
}

export async function startServe(config: ServeConfig): Promise<RunningServe> {
  if (config.backends.length > 0) {
    if (config.gateway.secret === '') {
      // Works for one replica; several behind a balancer would refuse each other's tokens.
      process.stderr.write(
        `${JSON.stringify({ level: 'warn', msg: 'gateway.secret is empty: a random one is used, so legacy tokens only verify on this replica; set the same gateway.secret on every replica' })}\n`,
      );
    }
    const { createGateway } = await import('./gateway/gateway.js');
    const server = await createGateway({ config });
    const url = await server.listen();
    return { url, instanceId: server.broker.instanceId, kind: 'gateway', server, drainAndClose: () => server.drainAndClose(), close: () => server.close() };
  }
  const server = await createExecserver({ config });
  const url = await server.listen();
  return { url, instanceId: server.broker.instanceId, kind: 'execserver', server, drainAndClose: () => server.drainAndClose(), close: () => server.close() };
}
