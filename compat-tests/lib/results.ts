/**
 * Results of the compat scenarios, for `npm run compat` (compat-tests/report.ts): each scenario
 * appends one JSON line to the file named by COMPAT_RESULTS (when set; plain `tap` runs skip it).
 */
import { appendFileSync } from 'node:fs';

export const RESULTS_ENV = 'COMPAT_RESULTS';

export type ScenarioKind = 'cell' | 'scenario' | 'failure';

export interface ScenarioMeta {
  kind: ScenarioKind;
  /** Stable id, e.g. `cell:new:gateway` or `failure:fylr-crash-parked-wants`. */
  id: string;
  /** Human title (the tap test name). */
  title: string;
  /** Matrix cells: the fylr row and the execserver column. */
  row?: 'old' | 'new';
  col?: 'legacy' | 'gateway' | 'native';
  /** The seed's failure-matrix row this scenario demonstrates. */
  seedRow?: string;
}

export interface ScenarioResult extends ScenarioMeta {
  pass: boolean;
  jobs: number;
  duration_ms: number;
  /** What the fylr(s) sent to execservers: HTTP requests (old transport) and broker frames. */
  requests: { http: number; frames: number };
  /** Requests the old execservers received (from fylrs or gateways). */
  backend_requests: number;
  notes: string[];
}

export function recordResult(r: ScenarioResult): void {
  const file = process.env[RESULTS_ENV];
  if (!file) return;
  appendFileSync(file, `${JSON.stringify(r)}\n`);
}
