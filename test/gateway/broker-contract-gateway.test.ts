/**
 * The broker contract (test/execserver/broker-contract.ts) against the gateway: the same rules as
 * the native execserver, with every slot a token held from a real old execserver. The slots of
 * the waitgroup are split over two backends whenever there are at least two, so offers and jobs
 * cross backends too.
 */
import t from 'tap';
import { type LegacyExecserver, startLegacyExecserver } from '../../legacy/execserver/legacy-execserver.js';
import { parseServeConfig } from '../../src/config/load-config.js';
import { createGateway } from '../../src/gateway/gateway.js';
import { brokerContract, CONTRACT_COMMANDS, CONTRACT_SERVICES, CONTRACT_WAITGROUP } from '../execserver/broker-contract.js';
import { SECRET } from './gateway-world.js';

brokerContract(t, async (opts) => {
  const split = opts.processes >= 2 ? [Math.ceil(opts.processes / 2), Math.floor(opts.processes / 2)] : [opts.processes];
  const backends: LegacyExecserver[] = [];
  for (const processes of split) {
    backends.push(
      await startLegacyExecserver(
        parseServeConfig({
          listen: '127.0.0.1:0',
          name: 'old-exec',
          waitgroups: { [CONTRACT_WAITGROUP]: processes },
          commands: CONTRACT_COMMANDS,
          services: CONTRACT_SERVICES,
        }),
      ),
    );
  }
  const server = await createGateway({
    config: parseServeConfig({
      listen: '127.0.0.1:0',
      name: 'contract-gateway',
      waitgroups: { [CONTRACT_WAITGROUP]: opts.processes },
      services: CONTRACT_SERVICES,
      backends: backends.map((b, i) => ({ url: b.url, waitgroups: { [CONTRACT_WAITGROUP]: split[i] } })),
      gateway: { secret: SECRET, poll_interval_ms: 100 },
      broker: opts.broker,
    }),
  });
  const url = await server.listen();
  return {
    url,
    runningCount: (wg) => server.source.running(wg),
    async close() {
      await server.close();
      for (const b of backends) await b.close();
    },
  };
});
