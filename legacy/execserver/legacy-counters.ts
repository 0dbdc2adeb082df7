/**
 * What the reference legacy execserver counts, for tests and benchmarks that assert on it
 * ("no waitgroup ever over its processes", "every job ran once", "the token expired").
 * Plain objects, so a test can compare or print them as JSON.
 */

export type LegacyRoute = 'token' | 'job' | 'healthz' | 'other';

export interface LegacyExecCounters {
  /** Responses by route and HTTP status: `requests.token[503]`. */
  requests: Record<LegacyRoute, Record<number, number>>;
  /** Jobs whose token was redeemed and that started, per service (jobs without commands too). */
  jobs: Record<string, number>;
  /** Jobs without commands (a token given back), per service; also counted in `jobs`. */
  emptyJobs: Record<string, number>;
  /** Jobs running now, per waitgroup. */
  running: Record<string, number>;
  /** The most jobs ever running at once, per waitgroup: never above its `processes`. */
  maxRunning: Record<string, number>;
  /** The most slots ever held at once (reserved by a token or running), per waitgroup. */
  maxHeld: Record<string, number>;
  tokensIssued: number;
  tokensRedeemed: number;
  /** Tokens that lapsed unused; their slots were freed. */
  tokensExpired: number;
}

export function newCounters(): LegacyExecCounters {
  return {
    requests: { token: {}, job: {}, healthz: {}, other: {} },
    jobs: {},
    emptyJobs: {},
    running: {},
    maxRunning: {},
    maxHeld: {},
    tokensIssued: 0,
    tokensRedeemed: 0,
    tokensExpired: 0,
  };
}

export function bump(map: Record<string | number, number>, key: string | number, by = 1): number {
  map[key] = (map[key] ?? 0) + by;
  return map[key];
}
