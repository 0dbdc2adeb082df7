/**
 * One priority class of one waitgroup: a rotation of connections ("members"), each holding the
 * FIFO of the wants it parked in this class. `WantBook` (want-book.ts) owns the indexes by
 * connection and by waitgroup; this file owns the order inside a class.
 *
 *   rotation = fresh ++ served                           remembered (place 'away', no wants)
 *   fresh:  [D] ── [E]            (never served, in join order)     [B lastServed=12]
 *   served: [A 14] ── [C 17]      (by lastServed, oldest first)
 *   member: head ─► want ─► want ─► want ◄─ tail        (doubly linked, seq strictly increasing)
 *
 * Grant order of the current book (no new arrivals) is lexicographic in (j, r): j = index of the
 * want in its member's FIFO, r = rank of the member in the rotation. A served member goes to the
 * back of `served`, so after every member of the rotation is served once the order repeats:
 * round j hands out every member's j-th want, in rotation order. `aheadOf` and `firstOfService`
 * are that formula; the model test checks it against a literal replay of the rule.
 */
import type { ConnectionId, Want } from './want.js';

/** `lastServed` of a member never served in this class (orders before any real stamp). */
export const NEVER_SERVED = -1;

/** Where a member is: in one of the two rotation lists, or remembered without wants. */
export type Place = 'fresh' | 'served' | 'away';

export class WantNode {
  prev: WantNode | undefined = undefined;
  next: WantNode | undefined = undefined;
  /** Strictly increasing along the FIFO; contiguous unless a want left from the middle. */
  seq = 0;

  constructor(
    readonly want: Want,
    readonly member: Member,
  ) {}
}

/** One connection inside one priority class. */
export class Member {
  head: WantNode | undefined = undefined;
  tail: WantNode | undefined = undefined;
  length = 0;
  /** Stamp of this class's counter when last granted; NEVER_SERVED if not since the class began. */
  lastServed = NEVER_SERVED;
  place: Place = 'away';
  /** Links of the rotation list named by `place` (unused while 'away'). */
  rprev: Member | undefined = undefined;
  rnext: Member | undefined = undefined;
  /** service -> wants of this member with that service (entries > 0 only). */
  readonly services = new Map<string, number>();

  constructor(
    readonly connId: ConnectionId,
    readonly cls: PriorityClass,
  ) {}
}

/** An intrusive doubly linked list of members through `rprev` / `rnext`. */
class MemberList {
  head: Member | undefined = undefined;
  tail: Member | undefined = undefined;

  append(m: Member): void {
    this.insertAfter(m, this.tail);
  }

  /** Inserts `m` after `at`, or at the head when `at` is undefined. */
  insertAfter(m: Member, at: Member | undefined): void {
    const after = at === undefined ? this.head : at.rnext;
    m.rprev = at;
    m.rnext = after;
    if (at === undefined) this.head = m;
    else at.rnext = m;
    if (after === undefined) this.tail = m;
    else after.rprev = m;
  }

  remove(m: Member): void {
    if (m.rprev === undefined) this.head = m.rnext;
    else m.rprev.rnext = m.rnext;
    if (m.rnext === undefined) this.tail = m.rprev;
    else m.rnext.rprev = m.rprev;
    m.rprev = undefined;
    m.rnext = undefined;
  }
}

function bump(counts: Map<string, number>, key: string, by: number): void {
  const n = (counts.get(key) ?? 0) + by;
  if (n === 0) counts.delete(key);
  else counts.set(key, n);
}

export class PriorityClass {
  /** Wants parked in this class; a class exists only while this is > 0. */
  count = 0;
  /** Every member, in the rotation or remembered ('away'). At most one per connection. */
  readonly members = new Map<ConnectionId, Member>();
  /** service -> wants in this class with that service (entries > 0 only). */
  readonly services = new Map<string, number>();
  readonly #fresh = new MemberList();
  readonly #served = new MemberList();
  /** Grant counter of this class; stamps are unique, so `served` has no ties. */
  #stamp = 0;

  constructor(
    readonly waitgroup: string,
    readonly priority: number,
  ) {}

  /** Creates the member of a connection that has none here yet. The caller indexes it. */
  addMember(connId: ConnectionId): Member {
    const m = new Member(connId, this);
    this.members.set(connId, m);
    return m;
  }

  /** Appends a want to the member's FIFO; a member without wants (re-)joins the rotation. */
  push(member: Member, want: Want): WantNode {
    const node = new WantNode(want, member);
    const tail = member.tail;
    if (tail === undefined) {
      member.head = node;
    } else {
      node.seq = tail.seq + 1;
      node.prev = tail;
      tail.next = node;
    }
    member.tail = node;
    member.length++;
    if (member.place === 'away') this.#join(member);
    this.count++;
    bump(this.services, want.service, 1);
    bump(member.services, want.service, 1);
    return node;
  }

  /**
   * A never-served member joins at the back of `fresh` (ties among the never served go by join
   * order) in O(1). A remembered member goes into `served` at its old stamp: a scan from the
   * back, O(members served since it was), short because a re-joiner was usually served a moment
   * ago; O(members in the class) at worst.
   */
  #join(member: Member): void {
    if (member.lastServed === NEVER_SERVED) {
      member.place = 'fresh';
      this.#fresh.append(member);
      return;
    }
    let at = this.#served.tail;
    while (at !== undefined && at.lastServed > member.lastServed) at = at.rprev;
    member.place = 'served';
    this.#served.insertAfter(member, at);
  }

  /** The member the next grant of this class goes to. */
  first(): Member | undefined {
    return this.#fresh.head ?? this.#served.head;
  }

  /** Records a grant to `member` (in the rotation): it moves to the back. O(1). */
  markServed(member: Member): void {
    this.#listOf(member).remove(member);
    member.lastServed = ++this.#stamp;
    member.place = 'served';
    this.#served.append(member);
  }

  /**
   * Unlinks one want. A member left without wants leaves the rotation; if it was never served it
   * is forgotten (returns true: the caller drops it from its connection's index), otherwise it is
   * remembered as 'away' with its stamp. O(1).
   */
  unlink(node: WantNode): boolean {
    const m = node.member;
    if (node.prev === undefined) m.head = node.next;
    else node.prev.next = node.next;
    if (node.next === undefined) m.tail = node.prev;
    else node.next.prev = node.prev;
    node.prev = undefined;
    node.next = undefined;
    m.length--;
    this.count--;
    bump(this.services, node.want.service, -1);
    bump(m.services, node.want.service, -1);
    if (m.length > 0) return false;
    this.#listOf(m).remove(m);
    m.place = 'away';
    if (m.lastServed !== NEVER_SERVED) return false;
    this.members.delete(m.connId);
    return true;
  }

  /** Takes a member out entirely (connection closed), pushing its wants to `out` in FIFO order. */
  removeMember(m: Member, out: Want[]): void {
    for (let n = m.head; n !== undefined; n = n.next) {
      out.push(n.want);
      bump(this.services, n.want.service, -1);
    }
    if (m.place !== 'away') this.#listOf(m).remove(m);
    this.count -= m.length;
    m.head = undefined;
    m.tail = undefined;
    m.length = 0;
    m.services.clear();
    m.place = 'away';
    this.members.delete(m.connId);
  }

  /** The member after `m` in the rotation (`fresh` runs on into `served`). */
  #after(m: Member): Member | undefined {
    return m.rnext ?? (m.place === 'fresh' ? this.#served.head : undefined);
  }

  /**
   * How many wants of this class would be granted before `node`: its own earlier wants, plus from
   * each member ahead of it in the rotation min(length, j + 1) and from each behind min(length, j).
   * O(members in the rotation), plus O(FIFO length) when a want left the middle of this FIFO
   * since the last call (the FIFO is renumbered once, see `#indexOf`).
   */
  aheadOf(node: WantNode): number {
    const mine = node.member;
    const j = this.#indexOf(node);
    let ahead = j;
    let before = true;
    for (let m = this.first(); m !== undefined; m = this.#after(m)) {
      if (m === mine) before = false;
      else ahead += Math.min(m.length, before ? j + 1 : j);
    }
    return ahead;
  }

  /**
   * The first want in grant order whose service is `service`: the minimum (j, r) over members
   * having that service. This one scans: every member of the rotation, and each member's FIFO
   * only up to the best j found so far. O(members + wants scanned); the per-class and per-member
   * service counts skip classes and members without the service in O(1).
   */
  firstOfService(service: string): WantNode | undefined {
    if (!this.services.has(service)) return undefined;
    let best: WantNode | undefined;
    let bestJ = Infinity;
    for (let m = this.first(); m !== undefined; m = this.#after(m)) {
      if (!m.services.has(service)) continue;
      let j = 0;
      for (let n = m.head; n !== undefined && j < bestJ; n = n.next, j++) {
        if (n.want.service === service) {
          best = n;
          bestJ = j;
          break;
        }
      }
      if (bestJ === 0) break;
    }
    return best;
  }

  /**
   * The index of `node` in its FIFO. Seqs are contiguous (tail - head + 1 === length) unless a
   * want left from the middle; then the FIFO is renumbered once, O(length), and stays O(1) until
   * the next removal from the middle.
   */
  #indexOf(node: WantNode): number {
    const m = node.member;
    const head = m.head as WantNode;
    const tail = m.tail as WantNode;
    if (tail.seq - head.seq + 1 !== m.length) {
      let seq = 0;
      for (let n: WantNode | undefined = head; n !== undefined; n = n.next) n.seq = seq++;
    }
    return node.seq - head.seq;
  }

  #listOf(m: Member): MemberList {
    if (m.place === 'away') throw new Error(`want-book: member ${m.connId} is not in the rotation`);
    return m.place === 'fresh' ? this.#fresh : this.#served;
  }

  /** Throws if a structural invariant of this class is broken. O(wants in the class). For tests. */
  checkInvariants(): void {
    const fail = (what: string): never => {
      throw new Error(`want-book invariant (${this.waitgroup}/${this.priority}): ${what}`);
    };
    if (this.count <= 0) fail('a class exists only with wants');
    const inRotation = new Set<Member>();
    let prevStamp = -Infinity;
    for (const [list, place] of [
      [this.#fresh, 'fresh'],
      [this.#served, 'served'],
    ] as const) {
      let prev: Member | undefined;
      for (let m = list.head; m !== undefined; m = m.rnext) {
        if (m.place !== place) fail(`member ${m.connId} in list ${place} says ${m.place}`);
        if (m.rprev !== prev) fail(`broken rprev at ${m.connId}`);
        if (m.length === 0) fail(`member ${m.connId} without wants in the rotation`);
        if (place === 'fresh' && m.lastServed !== NEVER_SERVED) fail(`served member ${m.connId} in fresh`);
        if (place === 'served') {
          if (m.lastServed <= prevStamp) fail('served list not ordered by stamp');
          prevStamp = m.lastServed;
        }
        if (this.members.get(m.connId) !== m) fail(`member ${m.connId} not indexed`);
        inRotation.add(m);
        prev = m;
      }
      if (list.tail !== prev) fail(`broken tail of ${place}`);
    }
    let total = 0;
    const services = new Map<string, number>();
    for (const [connId, m] of this.members) {
      if (m.connId !== connId || m.cls !== this) fail(`member ${connId} misfiled`);
      if (m.place === 'away') {
        if (m.length !== 0 || m.head !== undefined) fail(`away member ${connId} has wants`);
        if (m.lastServed === NEVER_SERVED) fail(`never-served member ${connId} remembered without wants`);
        continue;
      }
      if (!inRotation.has(m)) fail(`member ${connId} says ${m.place} but is not linked`);
      let n = 0;
      let prev: WantNode | undefined;
      const own = new Map<string, number>();
      for (let w = m.head; w !== undefined; w = w.next) {
        if (w.prev !== prev || w.member !== m) fail(`broken FIFO of ${connId}`);
        if (prev !== undefined && w.seq <= prev.seq) fail(`seq not increasing in ${connId}`);
        if (w.want.connId !== connId || w.want.priority !== this.priority || w.want.waitgroup !== this.waitgroup) {
          fail(`want ${w.want.jobId} filed under the wrong member`);
        }
        bump(own, w.want.service, 1);
        bump(services, w.want.service, 1);
        prev = w;
        n++;
      }
      if (m.tail !== prev || n !== m.length) fail(`length/tail of ${connId}`);
      if (!sameCounts(own, m.services)) fail(`service counts of ${connId}`);
      total += n;
    }
    if (total !== this.count) fail(`count ${this.count} but ${total} wants`);
    if (!sameCounts(services, this.services)) fail('service counts of the class');
  }
}

function sameCounts(a: Map<string, number>, b: Map<string, number>): boolean {
  if (a.size !== b.size) return false;
  for (const [k, v] of a) if (b.get(k) !== v) return false;
  return true;
}
