/**
 * `slotgate fylr`: the new fylr side as one process, on one HTTP listener (`listen:`):
 *
 *   GET/PUT /pipe/:id            body-mode pipes for the execservers (pipe-server.ts)
 *   POST /items, GET /items/:id  the operator/test API of PROTOCOL.md §7 (items-routes.ts)
 *   GET /status                  per address: transport broker|polling|down, connections,
 *                                instances; admission; the items claimed and running here
 *   GET /healthz
 *
 * plus the broker client (exec-client.ts) and ONE dispatcher (dispatcher.ts) on the shared
 * file_queue. The database is `database:` of the config, else DATABASE_URL, else the local
 * default of pool.ts; the schema is created or migrated on start.
 *
 * Start order: database → listener (the pipe server needs its port) → client connects → the
 * dispatcher starts claiming. Close order: the dispatcher stops (waiting items go back, running
 * ones finish) → client → listener → database.
 *
 * Test hook, not an operator knob: SLOTGATE_DISPATCHER_TIMINGS='{"heartbeatIntervalMs":200,
 * "staleAfterMs":1000}' (any of the DispatcherTimings keys) shortens the dispatcher's timers of
 * a `slotgate fylr` child, as the options below do in-process.
 */
import Fastify, { type FastifyInstance } from 'fastify';
import type pg from 'pg';
import { type Clock, systemClock } from '../clock.js';
import type { FylrConfig } from '../config/types.js';
import { newOwnerId } from '../db/file-queue-claims.js';
import { migrateFileQueue } from '../db/file-queue-schema.js';
import { createPool, databaseUrl } from '../db/pool.js';
import { Dispatcher, type DispatcherLog, type DispatcherOptions, type DispatcherStatus } from './dispatcher.js';
import { type AddressStatus, ExecClient, type ExecClientOptions } from './exec-client.js';
import { itemsRoutes } from './items-routes.js';
import { PipeServer } from './pipe-server.js';

/** The dispatcher's timers and sizes; config-free defaults live in the dispatcher modules. */
export type DispatcherTimings = Pick<
  DispatcherOptions,
  'pollIntervalMs' | 'heartbeatIntervalMs' | 'staleAfterMs' | 'sweepIntervalMs' | 'noSlotRequeueDelayMs' | 'retry' | 'localSlots' | 'localHighReserve'
>;

const TIMING_KEYS = ['pollIntervalMs', 'heartbeatIntervalMs', 'staleAfterMs', 'sweepIntervalMs', 'noSlotRequeueDelayMs', 'localSlots', 'localHighReserve'] as const;

export const TIMINGS_ENV = 'SLOTGATE_DISPATCHER_TIMINGS';

/** Reads SLOTGATE_DISPATCHER_TIMINGS (see the module comment); unknown keys are refused. */
export function timingsFromEnv(env: NodeJS.ProcessEnv = process.env): DispatcherTimings {
  const raw = env[TIMINGS_ENV];
  if (raw === undefined || raw === '') return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    throw new Error(`${TIMINGS_ENV} is not JSON`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new Error(`${TIMINGS_ENV} must be a JSON object`);
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(parsed)) {
    if (k === 'retry') {
      out.retry = v;
      continue;
    }
    if (!(TIMING_KEYS as readonly string[]).includes(k)) throw new Error(`${TIMINGS_ENV}: unknown key ${k}`);
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new Error(`${TIMINGS_ENV}: ${k} must be a number`);
    out[k] = v;
  }
  return out as DispatcherTimings;
}

export interface StartFylrOptions {
  /** Use this schema of the database (tests); default: the connection's search_path. */
  schema?: string;
  clock?: Clock;
  /** `claimed_by` of this process's claims; default newOwnerId(name), new at every start. */
  owner?: string;
  /** Default: SLOTGATE_DISPATCHER_TIMINGS, else the dispatcher's defaults. */
  dispatcher?: DispatcherTimings;
  /** Extra broker-client options (tests: observer, timings). */
  client?: Omit<ExecClientOptions, 'clock' | 'pipes' | 'name'>;
  log?: DispatcherLog;
  /** Size of the database pool; default 10. */
  poolSize?: number;
}

export interface FylrAddressStatus {
  address: string;
  transport: AddressStatus['transport'];
  connections: number;
  instances: string[];
}

export interface FylrStatus {
  kind: 'fylr';
  name: string;
  owner: string;
  addresses: FylrAddressStatus[];
  admission: DispatcherStatus['admission'];
  items: DispatcherStatus['items'];
  dispatcher: { timings: DispatcherStatus['timings']; counters: DispatcherStatus['counters'] };
  client: { waiting: number; leases: number };
}

export interface FylrProcess {
  /** `http://HOST:PORT` of the listener, with the real port. */
  url: string;
  owner: string;
  dispatcher: Dispatcher;
  client: ExecClient;
  pipes: PipeServer;
  pool: pg.Pool;
  app: FastifyInstance;
  status(): FylrStatus;
  /** Stops the dispatcher (see Dispatcher.stop), then the client, the listener and the pool. Idempotent. */
  close(): Promise<void>;
}

export async function startFylr(config: FylrConfig, opts: StartFylrOptions = {}): Promise<FylrProcess> {
  const clock = opts.clock ?? systemClock;
  const owner = opts.owner ?? newOwnerId(config.name);
  const timings = opts.dispatcher ?? timingsFromEnv();
  const pool = createPool(databaseUrl(config.database), {
    ...(opts.schema !== undefined ? { schema: opts.schema } : {}),
    max: opts.poolSize ?? 10,
  });
  const cleanup: (() => Promise<unknown>)[] = [() => pool.end()];
  const unwind = async (): Promise<void> => {
    for (const f of cleanup.reverse()) await f().catch(() => undefined);
  };
  try {
    await migrateFileQueue(pool);

    const pipes = new PipeServer({ clock });
    cleanup.push(async () => pipes.close());
    const client = new ExecClient(config.execserver, { ...opts.client, clock, pipes, name: config.name });
    cleanup.push(() => client.close());
    const dispatcher = new Dispatcher({ pool, client, owner, name: config.name, clock, ...timings, ...(opts.log ? { log: opts.log } : {}) });
    cleanup.push(() => dispatcher.stop());

    const status = (): FylrStatus => {
      const d = dispatcher.status();
      const c = client.status();
      return {
        kind: 'fylr',
        name: config.name,
        owner,
        addresses: c.addresses.map((a) => ({ address: a.url, transport: a.transport, connections: a.connections, instances: a.instances })),
        admission: d.admission,
        items: d.items,
        dispatcher: { timings: d.timings, counters: d.counters },
        client: { waiting: c.waiting, leases: c.leases },
      };
    };

    const app = Fastify({ logger: false, forceCloseConnections: true });
    cleanup.push(() => app.close());
    await app.register(pipes.plugin);
    await app.register(itemsRoutes, { pool });
    app.get('/status', async () => status());
    app.get('/healthz', async () => ({ ok: true }));
    await app.listen({ host: config.listen.host, port: config.listen.port });
    const addr = app.server.address();
    if (addr === null || typeof addr === 'string') throw new Error('listener has no TCP address');
    pipes.setPort(addr.port);
    const host = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
    const url = `http://${host}:${addr.port}`;

    await client.start();
    dispatcher.start();

    let closing: Promise<void> | undefined;
    return {
      url,
      owner,
      dispatcher,
      client,
      pipes,
      pool,
      app,
      status,
      close() {
        closing ??= (async () => {
          await dispatcher.stop();
          await client.close();
          await app.close();
          pipes.close();
          await pool.end();
        })();
        return closing;
      },
    };
  } catch (e) {
    await unwind();
    throw e;
  }
}
