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
    const { createGateway } = await import('./gateway/gateway.js');
    const server = await createGateway({ config });
    const url = await server.listen();
    return { url, instanceId: server.broker.instanceId, kind: 'gateway', server, drainAndClose: () => server.drainAndClose(), close: () => server.close() };
  }
  const server = await createExecserver({ config });
  const url = await server.listen();
  return { url, instanceId: server.broker.instanceId, kind: 'execserver', server, drainAndClose: () => server.drainAndClose(), close: () => server.close() };
}
