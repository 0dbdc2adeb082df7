import type { Clock } from '../../src/clock.js';
import type { ServeConfig } from '../../src/config/types.js';
import { createExecserver, type Execserver } from '../../src/execserver/server.js';
import type { LocalSlotSource } from '../../src/slots/local-slot-source.js';
import { BrokerPeer } from './broker-peer.js';

export interface ServedNative {
  server: Execserver;
  url: string;
  source: LocalSlotSource;
  /** A broker peer, terminated at teardown. */
  peer(): Promise<BrokerPeer>;
}

/** A native execserver on 127.0.0.1:0 with peers that are all closed at the test's end. */
export async function serveNative(t: { teardown(fn: () => unknown): void }, config: ServeConfig, clock?: Clock): Promise<ServedNative> {
  const server = await createExecserver({ config, ...(clock ? { clock } : {}) });
  const url = await server.listen();
  const peers: BrokerPeer[] = [];
  t.teardown(async () => {
    for (const p of peers) p.terminate();
    await server.close();
  });
  return {
    server,
    url,
    source: server.source as LocalSlotSource,
    async peer() {
      const p = await BrokerPeer.connect(url);
      peers.push(p);
      return p;
    },
  };
}
