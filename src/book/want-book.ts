/**
 * The want-book: every parked want of an execserver (or gateway), and the rule that picks the
 * taker of each free slot (PROTOCOL.md §1 rule 1). Pure data structure: no I/O, no timers.
 *
 *   WantBook
 *   ├─ groups: waitgroup ─► Waitgroup { count, order: [9, 5, 0] }     (priorities, highest first)
 *   │                         └─ classes: priority ─► PriorityClass     (priority-class.ts)
 *   │                               rotation: fresh [D]─[E]  ++  served [A 14]─[C 17]   away: [B 12]
 *   │                                           │
 *   │                                           └─ Member (one connection): FIFO w ─► w ─► w
 *   └─ conns: connId ─► { nodes: jobId ─► WantNode, members: Set<Member> }
 *
 * Grant rule per waitgroup: highest priority class first; within a class the member (connection)
 * served least recently *in that class* goes first, a never-served one counting as longest ago,
 * ties among the never served by (most recent) join order; within a member, FIFO.
 *
 * Invariants (checked by `checkInvariants()`, which the model test calls after every step):
 * - A waitgroup exists iff it has wants; a class iff it has wants; `order` is its classes' keys,
 *   strictly descending; counts (book, waitgroup, class, member, per service) are exact sums.
 * - Rotation = `fresh` (never served, join order) ++ `served` (strictly increasing lastServed).
 *   A member is in the rotation iff it has wants.
 * - A member without wants is kept ('away') only if it was served in this class: it carries the
 *   stamp that places it when it re-parks, so a connection that parks one want at a time cannot
 *   jump ahead of connections served before it (no starvation of a connection with many wants).
 * - A conns entry exists iff it has a want or a member; every node is indexed there by jobId.
 *
 * What is remembered, and for how long: a served member's stamp is kept while its class has wants,
 * and dropped (a) by removeConnection and (b) together with the whole class when the class's last
 * want leaves. A never-served member that empties is forgotten at once: re-parking, it is again
 * never served and joins at the back of `fresh`, which is exactly what the rule says. So memory is
 * O(wants + connections x live classes), never more. Forgetting at (b) is a choice: the stamps only
 * order a re-joiner against the connections waiting now; with nobody waiting there is nobody to be
 * unfair to, and keeping them would let dead classes (any integer is a priority) pile up. The
 * consequence, tested: after a class empties, a connection served in it before counts as never
 * served, so it goes ahead of a connection that first parks after it (join order).
 *
 * Costs (P classes in the waitgroup, C members in a class): park, remove, next(), peek O(1) plus,
 * when a class appears or disappears, O(log P) to find its place in `order` (and an O(P) splice,
 * a memmove of a handful of numbers) and, when it disappears, O(its remembered members) to forget
 * them (each was created by a park, so this is amortised O(1)); a remembered member re-joining scans `served` from the
 * back (see PriorityClass#join); position O(classes above + C); next(wg, service) scans (see
 * PriorityClass#firstOfService); removeConnection O(its wants + its members, plus the remembered
 * members of classes it empties); parkedByPriority O(P); stats and checkInvariants are O(everything).
 *
 * The book keeps the Want objects it is given and returns the same objects: do not mutate a want
 * while it is parked.
 */
import { SlotgateError } from '../errors.js';
import { PriorityClass, type Member, type WantNode } from './priority-class.js';
import type { ConnectionId, Want } from './want.js';

export type { ConnectionId, Want } from './want.js';

export interface WantPosition {
  /** Wants that would be granted before this one if no new wants arrived. */
  ahead: number;
  /** Wants parked in its waitgroup (this one included). */
  parked: number;
}

/** Sizes of the internal structures, for leak tests and debugging. */
export interface WantBookStats {
  wants: number;
  waitgroups: number;
  classes: number;
  /** Members in some rotation (a connection with wants in a class). */
  members: number;
  /** Members without wants, kept for their last-served stamp. */
  rememberedMembers: number;
  connections: number;
}

interface Waitgroup {
  count: number;
  readonly classes: Map<number, PriorityClass>;
  /** The keys of `classes`, strictly descending. */
  readonly order: number[];
}

interface ConnEntry {
  readonly nodes: Map<string, WantNode>;
  /** Its members in every class of every waitgroup, in the rotation or remembered. */
  readonly members: Set<Member>;
}

/** Index of `p` in the descending array `order`, or of where it would be inserted. */
function searchDescending(order: readonly number[], p: number): number {
  let lo = 0;
  let hi = order.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((order[mid] as number) > p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

export class WantBook {
  readonly #groups = new Map<string, Waitgroup>();
  readonly #conns = new Map<ConnectionId, ConnEntry>();
  #size = 0;

  /** Parks a want. Throws SlotgateError `duplicate_job` if (jobId, connId) is parked already. */
  park(want: Want): void {
    if (!Number.isFinite(want.priority)) {
      throw new RangeError(`want-book: priority of ${want.jobId} must be a finite number, got ${want.priority}`);
    }
    let conn = this.#conns.get(want.connId);
    if (conn?.nodes.has(want.jobId)) {
      throw new SlotgateError('duplicate_job', `job ${want.jobId} is already parked on connection ${want.connId}`);
    }
    if (conn === undefined) {
      conn = { nodes: new Map(), members: new Set() };
      this.#conns.set(want.connId, conn);
    }
    let group = this.#groups.get(want.waitgroup);
    if (group === undefined) {
      group = { count: 0, classes: new Map(), order: [] };
      this.#groups.set(want.waitgroup, group);
    }
    let cls = group.classes.get(want.priority);
    if (cls === undefined) {
      cls = new PriorityClass(want.waitgroup, want.priority);
      group.classes.set(want.priority, cls);
      group.order.splice(searchDescending(group.order, want.priority), 0, want.priority);
    }
    let member = cls.members.get(want.connId);
    if (member === undefined) {
      member = cls.addMember(want.connId);
      conn.members.add(member);
    }
    conn.nodes.set(want.jobId, cls.push(member, want));
    group.count++;
    this.#size++;
  }

  has(jobId: string, connId: ConnectionId): boolean {
    return this.#conns.get(connId)?.nodes.has(jobId) ?? false;
  }

  get(jobId: string, connId: ConnectionId): Want | undefined {
    return this.#conns.get(connId)?.nodes.get(jobId)?.want;
  }

  /** Withdraws one want (UNWANT, offer made elsewhere). Does not count as a grant. O(1). */
  remove(jobId: string, connId: ConnectionId): Want | undefined {
    const node = this.#conns.get(connId)?.nodes.get(jobId);
    if (node === undefined) return undefined;
    this.#detach(node);
    return node.want;
  }

  /**
   * Drops everything of a connection (it closed), including its last-served stamps. Returns the
   * removed wants grouped by (waitgroup, class) in the order the connection first parked there,
   * FIFO inside each group.
   */
  removeConnection(connId: ConnectionId): Want[] {
    const conn = this.#conns.get(connId);
    const out: Want[] = [];
    if (conn === undefined) return out;
    this.#conns.delete(connId);
    for (const member of conn.members) {
      const cls = member.cls;
      const group = this.#groups.get(cls.waitgroup) as Waitgroup;
      const n = member.length;
      cls.removeMember(member, out);
      group.count -= n;
      this.#size -= n;
      if (cls.count === 0) this.#dropClass(group, cls);
      if (group.count === 0) this.#groups.delete(cls.waitgroup);
    }
    return out;
  }

  /**
   * Takes the want that gets the next free slot of this waitgroup. O(1) (plus O(log P) if its
   * class empties).
   *
   * With `service`: the first want in grant order whose service is that one (the gateway's
   * legacy tokens are per service), and the rotation moves as if that want had been granted: its
   * connection becomes the most recently served of its class, nobody else moves. This variant
   * SCANS: the classes from the top until one holds the service (O(1) each via counts), then
   * that class's rotation and FIFOs as far as needed (PriorityClass#firstOfService).
   */
  next(waitgroup: string, service?: string): Want | undefined {
    const group = this.#groups.get(waitgroup);
    if (group === undefined) return undefined;
    let node: WantNode | undefined;
    if (service === undefined) {
      node = this.#top(group)?.first()?.head;
    } else {
      for (const p of group.order) {
        node = (group.classes.get(p) as PriorityClass).firstOfService(service);
        if (node !== undefined) break;
      }
    }
    if (node === undefined) return undefined;
    node.member.cls.markServed(node.member);
    this.#detach(node);
    return node.want;
  }

  /** The want next(waitgroup) would take, without taking it. O(1). */
  peek(waitgroup: string): Want | undefined {
    const group = this.#groups.get(waitgroup);
    return group === undefined ? undefined : this.#top(group)?.first()?.head?.want;
  }

  /**
   * Where a want stands: `ahead` is how many wants next() would grant before it if no new wants
   * arrived (the grant rule replayed in closed form, nothing changes). O(classes above + members
   * of its class), see PriorityClass#aheadOf.
   */
  position(jobId: string, connId: ConnectionId): WantPosition | undefined {
    const node = this.#conns.get(connId)?.nodes.get(jobId);
    if (node === undefined) return undefined;
    const cls = node.member.cls;
    const group = this.#groups.get(cls.waitgroup) as Waitgroup;
    let ahead = cls.aheadOf(node);
    for (const p of group.order) {
      if (p === cls.priority) break;
      ahead += (group.classes.get(p) as PriorityClass).count;
    }
    return { ahead, parked: group.count };
  }

  parked(waitgroup: string): number {
    return this.#groups.get(waitgroup)?.count ?? 0;
  }

  /** priority -> parked wants, highest priority first; only classes with wants. */
  parkedByPriority(waitgroup: string): Map<number, number> {
    const out = new Map<number, number>();
    const group = this.#groups.get(waitgroup);
    if (group !== undefined) {
      for (const p of group.order) out.set(p, (group.classes.get(p) as PriorityClass).count);
    }
    return out;
  }

  /** Wants parked by this connection, all waitgroups (for max_wants_per_connection). */
  connectionWants(connId: ConnectionId): number {
    return this.#conns.get(connId)?.nodes.size ?? 0;
  }

  get size(): number {
    return this.#size;
  }

  /** Waitgroups with at least one parked want (a live view: safe to next() while iterating). */
  waitgroups(): Iterable<string> {
    return this.#groups.keys();
  }

  stats(): WantBookStats {
    let classes = 0;
    let members = 0;
    let remembered = 0;
    for (const group of this.#groups.values()) {
      for (const cls of group.classes.values()) {
        classes++;
        for (const m of cls.members.values()) {
          if (m.place === 'away') remembered++;
          else members++;
        }
      }
    }
    return {
      wants: this.#size,
      waitgroups: this.#groups.size,
      classes,
      members,
      rememberedMembers: remembered,
      connections: this.#conns.size,
    };
  }

  /** Throws if any invariant of the top comment is broken. O(everything): for tests. */
  checkInvariants(): void {
    const fail = (what: string): never => {
      throw new Error(`want-book invariant: ${what}`);
    };
    let total = 0;
    const membersSeen = new Set<Member>();
    for (const [name, group] of this.#groups) {
      if (group.count <= 0) fail(`empty waitgroup ${name} kept`);
      if (group.order.length !== group.classes.size) fail(`order of ${name} has ${group.order.length} entries`);
      let sum = 0;
      group.order.forEach((p, i) => {
        if (i > 0 && (group.order[i - 1] as number) <= p) fail(`order of ${name} not strictly descending`);
        const cls = group.classes.get(p);
        if (cls === undefined) fail(`order of ${name} names missing class ${p}`);
        else {
          if (cls.waitgroup !== name || cls.priority !== p) fail(`class ${p} misfiled in ${name}`);
          cls.checkInvariants();
          sum += cls.count;
          for (const m of cls.members.values()) {
            const conn = this.#conns.get(m.connId);
            if (conn === undefined || !conn.members.has(m)) fail(`member ${m.connId} of ${name}/${p} not indexed`);
            membersSeen.add(m);
            for (let n = m.head; n !== undefined; n = n.next) {
              if (conn?.nodes.get(n.want.jobId) !== n) fail(`want ${n.want.jobId} not indexed`);
            }
          }
        }
      });
      if (sum !== group.count) fail(`count of ${name} is ${group.count}, classes hold ${sum}`);
      total += sum;
    }
    if (total !== this.#size) fail(`size is ${this.#size}, waitgroups hold ${total}`);
    let indexedNodes = 0;
    let indexedMembers = 0;
    for (const [connId, conn] of this.#conns) {
      if (conn.nodes.size === 0 && conn.members.size === 0) fail(`empty connection ${connId} kept`);
      for (const [jobId, n] of conn.nodes) {
        if (n.want.jobId !== jobId || n.want.connId !== connId) fail(`node ${jobId} misfiled`);
      }
      for (const m of conn.members) if (!membersSeen.has(m)) fail(`stale member of ${connId}`);
      indexedNodes += conn.nodes.size;
      indexedMembers += conn.members.size;
    }
    if (indexedNodes !== this.#size) fail(`${indexedNodes} indexed wants, size ${this.#size}`);
    if (indexedMembers !== membersSeen.size) fail(`${indexedMembers} indexed members, ${membersSeen.size} in classes`);
  }

  #top(group: Waitgroup): PriorityClass | undefined {
    const p = group.order[0];
    return p === undefined ? undefined : group.classes.get(p);
  }

  /** Unlinks one want from every structure, dropping whatever becomes empty. */
  #detach(node: WantNode): void {
    const member = node.member;
    const cls = member.cls;
    const want = node.want;
    const conn = this.#conns.get(member.connId) as ConnEntry;
    const group = this.#groups.get(cls.waitgroup) as Waitgroup;
    if (cls.unlink(node)) conn.members.delete(member);
    conn.nodes.delete(want.jobId);
    group.count--;
    this.#size--;
    if (cls.count === 0) this.#dropClass(group, cls);
    if (group.count === 0) this.#groups.delete(cls.waitgroup);
    if (conn.nodes.size === 0 && conn.members.size === 0) this.#conns.delete(member.connId);
  }

  /** A class without wants goes, and with it every remembered stamp (see the top comment). */
  #dropClass(group: Waitgroup, cls: PriorityClass): void {
    for (const m of cls.members.values()) {
      const conn = this.#conns.get(m.connId);
      if (conn === undefined) continue;
      conn.members.delete(m);
      if (conn.nodes.size === 0 && conn.members.size === 0) this.#conns.delete(m.connId);
    }
    cls.members.clear();
    group.classes.delete(cls.priority);
    group.order.splice(searchDescending(group.order, cls.priority), 1);
  }
}
