/**
 * One configured legacy backend as the gateway keeps it: its client, the slots it offers per
 * waitgroup (PROTOCOL.md §6: `backends[].waitgroups` replaces the top-level `waitgroups` for that
 * backend; a waitgroup it does not list has no slots there), the tokens the gateway holds from it,
 * and counters for /status.
 */
import type { ServeConfig } from '../config/types.js';
import { BackendClient } from './backend-client.js';

export interface BackendStatus {
  url: string;
  processes: Record<string, number>;
  /** Tokens held from it per waitgroup (free, offered, running or being given back). */
  held: Record<string, number>;
  /** `GET /token` answers of the slot pump by outcome (200, 503, 404, error). */
  token_requests: Record<string, number>;
  jobs_relayed: number;
  jobs_failed: number;
  tokens_given_back: number;
  /** Replica URLs its token responses named and the gateway accepted. */
  replicas: string[];
  last_error: string | null;
}

export class Backend {
  readonly index: number;
  readonly client: BackendClient;
  readonly #processes: Record<string, number>;
  readonly #held = new Map<string, number>();
  readonly #tokenRequests: Record<string, number> = {};
  readonly #replicas = new Set<string>();
  jobsRelayed = 0;
  jobsFailed = 0;
  tokensGivenBack = 0;
  lastError: string | null = null;

  constructor(index: number, url: string, processes: Record<string, number>) {
    this.index = index;
    this.client = new BackendClient(url);
    this.#processes = processes;
  }

  get url(): string {
    return this.client.url;
  }

  processes(waitgroup: string): number {
    return this.#processes[waitgroup] ?? 0;
  }

  held(waitgroup: string): number {
    return this.#held.get(waitgroup) ?? 0;
  }

  hold(waitgroup: string, delta: 1 | -1): void {
    this.#held.set(waitgroup, this.held(waitgroup) + delta);
  }

  countTokenRequest(outcome: string): void {
    this.#tokenRequests[outcome] = (this.#tokenRequests[outcome] ?? 0) + 1;
  }

  /** Requests the slot pump sent to this backend so far. */
  get tokenRequests(): number {
    return Object.values(this.#tokenRequests).reduce((a, b) => a + b, 0);
  }

  sawReplica(url: string): void {
    if (url !== this.url) this.#replicas.add(url);
  }

  status(): BackendStatus {
    return {
      url: this.url,
      processes: { ...this.#processes },
      held: Object.fromEntries(this.#held),
      token_requests: { ...this.#tokenRequests },
      jobs_relayed: this.jobsRelayed,
      jobs_failed: this.jobsFailed,
      tokens_given_back: this.tokensGivenBack,
      replicas: [...this.#replicas],
      last_error: this.lastError,
    };
  }
}

export function backendsOf(config: ServeConfig): Backend[] {
  return config.backends.map((b, i) => new Backend(i, b.url, { ...(b.waitgroups ?? config.waitgroups) }));
}
