/** The scenarios of `npm run bench`, by name, in the order the run takes them. */
import type { BenchOptions } from '../lib/options.js';
import { runGatewayRequests } from './gateway-requests.js';
import { runHandoff } from './handoff.js';
import { runIdle } from './idle.js';
import { runRss } from './rss.js';
import { runStreaming } from './streaming.js';
import { runThroughput } from './throughput.js';
import { runWantBook } from './want-book.js';

export const SCENARIOS = ['want-book', 'rss', 'handoff', 'throughput', 'idle', 'contention', 'streaming'] as const;
export type ScenarioName = (typeof SCENARIOS)[number];

export function isScenarioName(s: string): s is ScenarioName {
  return (SCENARIOS as readonly string[]).includes(s);
}

const RUNNERS: Record<ScenarioName, (o: BenchOptions) => Promise<unknown> | unknown> = {
  'want-book': runWantBook,
  rss: runRss,
  handoff: runHandoff,
  throughput: runThroughput,
  idle: runIdle,
  contention: runGatewayRequests,
  streaming: runStreaming,
};

export function runScenario(name: ScenarioName, o: BenchOptions): Promise<unknown> {
  return Promise.resolve(RUNNERS[name](o));
}
