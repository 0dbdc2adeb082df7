/**
 * Read-only reports of the broker's state: POSITION (QUERY, `GET /queue/{job_id}`), `/status`,
 * running jobs by priority (metrics). Pure functions over a view the Broker hands out; nothing
 * here changes the book, an offer or a job.
 */
import type { ConnectionId, WantBook } from '../book/want-book.js';
import type { ServeConfig } from '../config/types.js';
import type { PositionMessage } from '../protocol/messages.js';
import type { SlotSource } from '../slots/slot-source.js';
import type { BrokerConnection, RunningJob } from './broker-connection.js';
import type { RunStats } from './run-stats.js';

export interface WaitgroupStatus {
  processes: number;
  running: number;
  in_use: number;
  parked: number;
  offered: number;
  parked_by_priority: Record<string, number>;
}

export interface BrokerStatus {
  instance_id: string;
  name: string;
  kind: SlotSource['kind'];
  draining: boolean;
  waitgroups: Record<string, WaitgroupStatus>;
  connections: {
    id: string;
    remote_address: string | null;
    local_address: string | null;
    connected_ms: number;
    parked: number;
    offered: number;
    running: number;
    frames_in: number;
    frames_out: number;
  }[];
}

/** Running jobs by priority; jobs that did not come through the broker (legacy PUTs) as 'legacy'. */
export type RunningByPriority = Map<string, number>;

export interface BrokerReportView {
  readonly instanceId: string;
  readonly config: ServeConfig;
  readonly source: SlotSource;
  readonly book: WantBook;
  readonly stats: RunStats;
  readonly now: number;
  readonly draining: boolean;
  readonly connections: ReadonlyMap<ConnectionId, BrokerConnection>;
  /** Every broker job not ended, closed connections' included. */
  readonly jobs: ReadonlySet<RunningJob>;
}

/**
 * POSITION for a job of this connection: a parked want (ahead by the grant rule replayed), an
 * offered job (ahead 0, eta one run) or a running one (ahead 0, eta the mean run time left).
 */
export function positionOf(v: BrokerReportView, connId: ConnectionId, jobId: string): PositionMessage | undefined {
  const conn = v.connections.get(connId);
  if (!conn) return undefined;
  const want = v.book.get(jobId, connId);
  const offer = conn.offers.get(jobId);
  const running = conn.running.get(jobId);
  const waitgroup = want?.waitgroup ?? offer?.slot.waitgroup ?? running?.slot.waitgroup;
  const service = want?.service ?? offer?.want.service ?? running?.service;
  if (waitgroup === undefined || service === undefined) return undefined;
  const capacity = v.source.processes(waitgroup);
  const ahead = want ? (v.book.position(jobId, connId)?.ahead ?? 0) : 0;
  let eta: number | null;
  if (want) eta = v.stats.etaMs(service, ahead, capacity, capacity - v.source.inUse(waitgroup));
  else if (offer) eta = v.stats.meanMs(service);
  else eta = v.stats.remainingMs(service, v.now - running!.startedAt);
  return {
    type: 'POSITION',
    job_id: jobId,
    running: v.source.running(waitgroup),
    ahead,
    capacity,
    parked: v.book.parked(waitgroup),
    eta_ms: eta === null ? null : Math.round(eta),
  };
}

export function runningByPriorityOf(v: BrokerReportView, waitgroup: string): RunningByPriority {
  const out: RunningByPriority = new Map();
  let broker = 0;
  for (const job of v.jobs) {
    if (job.slot.waitgroup !== waitgroup) continue;
    broker++;
    const p = String(job.priority);
    out.set(p, (out.get(p) ?? 0) + 1);
  }
  const other = v.source.running(waitgroup) - broker;
  if (other > 0) out.set('legacy', other);
  return out;
}

export function statusOf(v: BrokerReportView): BrokerStatus {
  const offeredBy = new Map<string, number>();
  for (const c of v.connections.values()) {
    for (const o of c.offers.values()) offeredBy.set(o.slot.waitgroup, (offeredBy.get(o.slot.waitgroup) ?? 0) + 1);
  }
  const waitgroups: Record<string, WaitgroupStatus> = {};
  for (const wg of Object.keys(v.config.waitgroups)) {
    waitgroups[wg] = {
      processes: v.source.processes(wg),
      running: v.source.running(wg),
      in_use: v.source.inUse(wg),
      parked: v.book.parked(wg),
      offered: offeredBy.get(wg) ?? 0,
      parked_by_priority: Object.fromEntries([...v.book.parkedByPriority(wg)].map(([p, n]) => [String(p), n])),
    };
  }
  return {
    instance_id: v.instanceId,
    name: v.config.name,
    kind: v.source.kind,
    draining: v.draining,
    waitgroups,
    connections: [...v.connections.values()].map((c) => ({
      id: c.id,
      remote_address: c.info.remoteAddress ?? null,
      local_address: c.info.localAddress ?? null,
      connected_ms: Math.round(v.now - c.connectedAt),
      parked: v.book.connectionWants(c.id),
      offered: c.offers.size,
      running: c.running.size,
      frames_in: c.framesIn,
      frames_out: c.framesOut,
    })),
  };
}
