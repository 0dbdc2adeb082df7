/**
 * `slotgate legacy-fylr`: the old fylr side as one process — the polling worker pool on the
 * shared file_queue, plus the operator API of PROTOCOL.md §7 on `listen`:
 *
 *   POST /items, GET /items/:id   (src/fylr/items-routes.ts, shared with the new fylr)
 *   GET  /status                  every address's transport ('polling'), workers, items, counters
 *   GET  /healthz
 *
 * Prints nothing; the CLI prints the listening line.
 */
import { randomBytes } from 'node:crypto';
import Fastify from 'fastify';
import type pg from 'pg';
import { type Clock, systemClock } from '../../src/clock.js';
import type { FylrConfig } from '../../src/config/types.js';
import { migrateFileQueue } from '../../src/db/file-queue-schema.js';
import { createPool, databaseUrl } from '../../src/db/pool.js';
import { itemsRoutes } from '../../src/fylr/items-routes.js';
import { LegacyCounters, type LegacyCountersSnapshot } from './counters.js';
import { parseLegacyAddress } from './polling-client.js';
import { type Log, LegacyWorkerPool, type WorkerPoolStatus } from './worker-pool.js';

export interface StartLegacyFylrOptions {
  clock?: Clock;
  log?: Log;
  /** Use this schema of the database (tests); default: the connection's search_path. */
  schema?: string;
  /** `claimed_by` of this fylr's claims; default `<name>-<random>`. */
  owner?: string;
  /** Idle poll and slot-retry interval; default 1000. */
  pollIntervalMs?: number;
  /** Default 60 000. */
  requeueDelayMs?: number;
}

export interface LegacyFylrStatus {
  kind: 'legacy-fylr';
  name: string;
  owner: string;
  addresses: { address: string; transport: 'polling'; only_service: string | null }[];
  workers: WorkerPoolStatus;
  items: { claimed: number[]; running: number[] };
  counters: LegacyCountersSnapshot;
}

export interface LegacyFylr {
  /** `http://HOST:PORT` of the listener, with the real port. */
  url: string;
  owner: string;
  counters: LegacyCounters;
  workers: LegacyWorkerPool;
  status(): LegacyFylrStatus;
  /** Stops the workers (see LegacyWorkerPool.stop), then the listener and the database pool. */
  close(): Promise<void>;
}

export async function startLegacyFylr(config: FylrConfig, opts: StartLegacyFylrOptions = {}): Promise<LegacyFylr> {
  const clock = opts.clock ?? systemClock;
  const counters = new LegacyCounters(clock);
  const owner = opts.owner ?? `${config.name}-${randomBytes(4).toString('hex')}`;
  const ex = config.execserver;
  // Every worker may hold a connection for its claim, plus the HTTP routes.
  const pool: pg.Pool = createPool(databaseUrl(config.database), {
    ...(opts.schema !== undefined ? { schema: opts.schema } : {}),
    max: Math.min(ex.parallel + ex.parallelHigh + 2, 50),
  });
  try {
    await migrateFileQueue(pool);
  } catch (e) {
    await pool.end().catch(() => undefined);
    throw e;
  }

  const workers = new LegacyWorkerPool({
    pool,
    owner,
    addresses: ex.addresses,
    connectTimeoutSec: ex.connectTimeoutSec,
    parallel: ex.parallel,
    parallelHigh: ex.parallelHigh,
    clock,
    counters,
    ...(opts.pollIntervalMs !== undefined ? { pollIntervalMs: opts.pollIntervalMs } : {}),
    ...(opts.requeueDelayMs !== undefined ? { requeueDelayMs: opts.requeueDelayMs } : {}),
    ...(opts.log !== undefined ? { log: opts.log } : {}),
  });

  const status = (): LegacyFylrStatus => {
    const w = workers.status();
    return {
      kind: 'legacy-fylr',
      name: config.name,
      owner,
      addresses: ex.addresses.map((a) => ({ address: a, transport: 'polling', only_service: parseLegacyAddress(a).onlyService })),
      workers: w,
      items: { claimed: w.claimed, running: w.running_items },
      counters: counters.snapshot(),
    };
  };

  const app = Fastify({ logger: false });
  await app.register(itemsRoutes, { pool });
  app.get('/status', async () => status());
  app.get('/healthz', async () => ({ ok: true }));

  let url: string;
  try {
    await app.listen({ host: config.listen.host, port: config.listen.port });
    const addr = app.server.address();
    if (addr === null || typeof addr === 'string') throw new Error('listener has no TCP address');
    const host = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
    url = `http://${host}:${addr.port}`;
  } catch (e) {
    await app.close().catch(() => undefined);
    await pool.end().catch(() => undefined);
    throw e;
  }

  workers.start();

  let closing: Promise<void> | undefined;
  return {
    url,
    owner,
    counters,
    workers,
    status,
    close() {
      closing ??= (async () => {
        await workers.stop();
        await app.close();
        await pool.end();
      })();
      return closing;
    },
  };
}
