/**
 * HELLO (PROTOCOL.md §1): the snapshot an execserver sends first on every connection, and what
 * makes a new one worth sending.
 */
import type { WantBook } from '../book/want-book.js';
import type { ServeConfig } from '../config/types.js';
import { type HelloMessage, PROTOCOL_VERSION } from '../protocol/messages.js';
import type { SlotSource } from '../slots/slot-source.js';

export interface HelloView {
  config: ServeConfig;
  source: SlotSource;
  book: WantBook;
  instanceId: string;
  clients: number;
  draining: boolean;
}

export function buildHello(v: HelloView): HelloMessage {
  const services: Record<string, string> = {};
  for (const [svc, def] of Object.entries(v.config.services)) services[svc] = def.waitgroup;
  const waitgroups: HelloMessage['waitgroups'] = {};
  for (const wg of Object.keys(v.config.waitgroups)) {
    waitgroups[wg] = { processes: v.source.processes(wg), running: v.source.running(wg), parked: v.book.parked(wg) };
  }
  return {
    type: 'HELLO',
    protocol: PROTOCOL_VERSION,
    instance_id: v.instanceId,
    name: v.config.name,
    services,
    waitgroups,
    clients: v.clients,
    draining: v.draining,
  };
}

/**
 * What makes a HELLO worth re-sending: services, processes, clients, draining. `running` and
 * `parked` change with every job and are not part of it (idle silence, rule 4; a fylr asks
 * with QUERY when it wants counts).
 */
export function helloSignature(h: HelloMessage): string {
  const processes = Object.entries(h.waitgroups).map(([wg, s]) => `${wg}=${s.processes}`);
  return JSON.stringify([h.services, processes, h.clients, h.draining]);
}
