/**
 * Every chunk of a byte stream handed to `take` in order, with backpressure: a `take` that
 * returns a promise pauses the stream until it settles.
 *
 * Why not `for await (const chunk of stream)`: the async iterator reads the stream in paused
 * mode, and `read()` joins everything buffered since the last turn into one new buffer. An HTTP
 * body arrives as several pieces per socket read (chunked framing never lines up with the 64 KiB
 * reads), so the iterator copies nearly every byte once more and allocates a buffer per read
 * (bench/README.md, "Streaming"). Flowing mode hands each piece over as it was parsed.
 *
 * Resolves when the stream ended and every `take` settled; rejects with the stream's error (a
 * body cut short is an error: `finished` sees a close before the end) or with what a `take`
 * threw or rejected with. After a rejection no more chunks are taken; the caller destroys the
 * stream.
 */
import { finished, type Readable } from 'node:stream';

/** `C`: what the stream yields (Buffer; string for a stream with an encoding set). */
export function forEachChunk<C = Buffer>(stream: Readable, take: (chunk: C) => Promise<void> | void): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let failed = false;
    const fail = (e: unknown): void => {
      if (failed) return;
      failed = true;
      stream.off('data', onData);
      stream.pause();
      stopWatching();
      reject(e);
    };
    const onData = (chunk: C): void => {
      let pending: Promise<void> | void;
      try {
        pending = take(chunk);
      } catch (e) {
        fail(e);
        return;
      }
      if (pending === undefined) return;
      // The stream ends only after it was resumed, so the end never overtakes a pending take.
      stream.pause();
      pending.then(() => {
        if (!failed) stream.resume();
      }, fail);
    };
    const stopWatching = finished(stream, (err) => {
      if (err) {
        fail(err);
        return;
      }
      if (failed) return;
      stopWatching();
      resolve();
    });
    stream.on('data', onData);
  });
}
