import pg from 'pg';

export const DEFAULT_DATABASE_URL = 'postgres://postgres@127.0.0.1:5432/test';

/** The database URL: explicit, else DATABASE_URL, else the local default of these machines. */
export function databaseUrl(explicit?: string | null): string {
  return explicit ?? process.env.DATABASE_URL ?? DEFAULT_DATABASE_URL;
}

/**
 * A pg pool whose sessions use `schema` first in their search_path, so that tests (and several
 * independent fleets on one server) can each keep a `file_queue` of their own.
 */
export function createPool(url: string, opts: { schema?: string; max?: number } = {}): pg.Pool {
  const config: pg.PoolConfig = { connectionString: url, max: opts.max ?? 10 };
  if (opts.schema !== undefined) {
    if (!/^[a-z_][a-z0-9_]{0,62}$/.test(opts.schema)) throw new Error(`bad schema name ${opts.schema}`);
    config.options = `-c search_path=${opts.schema},public`;
  }
  const pool = new pg.Pool(config);
  // An idle client that errors (server restart) must not crash the process; the next query retries.
  pool.on('error', () => undefined);
  return pool;
}
