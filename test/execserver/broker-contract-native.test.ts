/** The broker contract (broker-contract.ts) against the native execserver: local slots, real processes. */
import t from 'tap';
import { createExecserver } from '../../src/execserver/server.js';
import { brokerContract, contractServeConfig } from './broker-contract.js';

brokerContract(t, async (opts) => {
  const server = await createExecserver({ config: contractServeConfig(opts) });
  const url = await server.listen();
  return {
    url,
    runningCount: (wg) => server.source.running(wg),
    close: () => server.close(),
  };
});
