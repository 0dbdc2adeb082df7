/**
 * Body mode of the old `PUT /job` (PROTOCOL.md §5): the request body is the job's stdin, the
 * response body its stdout. The response is committed (200 and its headers sent, chunked) only
 * when stdout outgrows 4000 bytes or the job succeeded; before that a failure can still answer
 * 500 with the receipt. After the commit a failure destroys the socket, so the client sees a
 * chunked body without its last chunk, never a clean end.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Writable } from 'node:stream';
import type { StdinSource, StdoutSink } from '../../src/slots/job-runner.js';

export function requestStdin(req: IncomingMessage): StdinSource {
  // The runner drains, not destroys, what a command left unread: the socket still carries the answer.
  return { open: async () => req };
}

export interface ResponseStdout extends StdoutSink {
  readonly committed: boolean;
}

export interface ResponseStdoutHooks {
  /** The 200 and its headers are about to go out. */
  onCommit(): void;
  /** The job succeeded and the last chunk is about to go out. */
  onEnd(): void;
}

/**
 * The stream handed to the runner forwards to the response, so that `onEnd` runs before the
 * client can see the end of the body (a client may ask for the next token the moment it does).
 */
function forwardTo(res: ServerResponse, onEnd: () => void): Writable {
  return new Writable({
    write(chunk: Buffer, _enc, cb) {
      if (res.destroyed) return cb(new Error('the client closed the connection'));
      if (res.write(chunk)) return cb();
      const onDrain = (): void => {
        res.off('close', onClose);
        cb();
      };
      const onClose = (): void => {
        res.off('drain', onDrain);
        cb(new Error('the client closed the connection'));
      };
      res.once('drain', onDrain);
      res.once('close', onClose);
    },
    final(cb) {
      onEnd();
      res.end(() => cb());
    },
  });
}

export function responseStdout(res: ServerResponse, hooks: ResponseStdoutHooks): ResponseStdout {
  let committed = false;
  return {
    get committed() {
      return committed;
    },
    async commit() {
      committed = true;
      if (res.destroyed) throw new Error('the client closed the connection');
      res.writeHead(200, { 'content-type': 'application/octet-stream', connection: 'close' });
      hooks.onCommit();
      const accepted = new Promise<void>((resolve, reject) => {
        res.once('finish', () => resolve());
        res.once('close', () => {
          if (!res.writableFinished) reject(new Error('the client closed the connection'));
        });
      });
      accepted.catch(() => {});
      return { stream: forwardTo(res, hooks.onEnd), accepted };
    },
    abort() {
      res.destroy();
    },
  };
}
