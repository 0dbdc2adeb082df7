/**
 * The vocabulary of the want-book: a want is one parked request for one slot (PROTOCOL.md terms).
 * `want-book.ts` re-exports these; import them from there.
 */

/** Identifies one broker connection (one websocket); the unit of fairness in the rotation. */
export type ConnectionId = string;

export interface Want {
  /** Unique per connection, not globally: the book's key is (jobId, connId). */
  jobId: string;
  connId: ConnectionId;
  service: string;
  /** The waitgroup of `service`; the book keeps one independent queue per waitgroup. */
  waitgroup: string;
  /** Higher is served first. Any finite number (the wire sends integers). */
  priority: number;
}
