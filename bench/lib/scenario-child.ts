/**
 * One scenario in a process of its own (forked by scenario-process.ts): it runs the scenario
 * named in argv[2] and sends the result, or the error's stack, to the parent.
 */
import { isScenarioName, runScenario } from '../scenarios/index.js';
import { benchOptions } from './options.js';

const name = process.argv[2] ?? '';
const send = (msg: unknown): Promise<void> => new Promise((resolve) => process.send?.(msg, () => resolve()));
try {
  if (!isScenarioName(name)) throw new Error(`unknown scenario ${JSON.stringify(name)}`);
  await send({ ok: true, value: await runScenario(name, benchOptions()) });
} catch (e) {
  await send({ ok: false, error: (e as Error)?.stack ?? String(e) });
}
// Sockets of closed servers may linger in keep-alive pools; nothing is left to wait for.
process.exit(0);
