/**
 * Writes of one event-loop turn leave in one syscall: the first write of a turn corks the stream
 * and a nextTick uncorks it, before the loop polls for I/O again, so nothing waits for a later
 * turn. Corks nest, so a writer that corks around its own writes (ws does, per frame) is held too.
 *
 * Why: on loopback every write is a syscall, a TCP segment and a wake-up of the reader, and on
 * this project's 2-core VMs that was the largest cost of small frames (broker connections) and,
 * for body streams, an HTTP body arriving as two pieces per socket read meant two writes per read
 * on the way out (bench/README.md).
 *
 * Call the returned function before each write.
 */
export interface Corkable {
  cork(): void;
  uncork(): void;
}

export function batchedPerTurn(w: Corkable): () => void {
  let corked = false;
  const uncork = (): void => {
    corked = false;
    w.uncork();
  };
  return () => {
    if (corked) return;
    corked = true;
    w.cork();
    process.nextTick(uncork);
  };
}
