/**
 * The claim share (seed: "Claim fairness"): how many exec-bound items this fylr may carry.
 *
 *   admission = Σ over connected, non-draining broker instances  ceil(processes / clients) + HEADROOM
 *             + Σ over polling addresses                         held + POLLING_HEADROOM
 *
 * `processes` counts the waitgroups the instance offers a service in (and, for an address with a
 * `/job/<service>` filter, only that service's waitgroup); `clients` is the instance's connected
 * fylr count from HELLO, ours included. An instance reached through several addresses counts
 * once. A polling (old) execserver announces no capacity, so its share follows what this fylr
 * actually holds there (tokens and jobs in flight) plus a small headroom: it grows as slots are
 * found and stops growing when the address answers busy.
 */
import type { HelloMessage } from '../protocol/messages.js';

/** Items claimed beyond the share of each instance, so a freed slot finds a parked want at once. */
export const HEADROOM_PER_INSTANCE = 2;
/** Items claimed beyond those held, per polling address. */
export const POLLING_HEADROOM = 2;

export interface InstanceView {
  hello: HelloMessage;
  /** null: every service; else only these services count (address filters). */
  services: ReadonlySet<string> | null;
}

export function instanceProcesses(view: InstanceView): number {
  const waitgroups = new Set<string>();
  for (const [service, wg] of Object.entries(view.hello.services)) {
    if (view.services === null || view.services.has(service)) waitgroups.add(wg);
  }
  let n = 0;
  for (const wg of waitgroups) n += view.hello.waitgroups[wg]?.processes ?? 0;
  return n;
}

export function instanceShare(view: InstanceView): number {
  if (view.hello.draining) return 0;
  const processes = instanceProcesses(view);
  if (processes <= 0) return 0;
  return Math.ceil(processes / Math.max(1, view.hello.clients)) + HEADROOM_PER_INSTANCE;
}

export function pollingShare(held: number): number {
  return Math.max(0, held) + POLLING_HEADROOM;
}
