/**
 * Body mode over a legacy `PUT /job`: the request body is stdin, the response body is stdout,
 * committed (status 200 sent) only once stdout outgrows 4000 bytes or the job succeeded. After
 * the commit a failure destroys the socket, so the old client sees a truncated chunked body.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { finished } from 'node:stream/promises';
import type { Receipt } from '../protocol/job.js';
import type { StdinSource, StdoutSink } from '../slots/job-runner.js';

export function requestStdin(req: IncomingMessage): StdinSource {
  return { open: async () => req };
}

export interface ResponseStdout extends StdoutSink {
  readonly committed: boolean;
}

export function responseStdout(res: ServerResponse): ResponseStdout {
  let committed = false;
  return {
    get committed() {
      return committed;
    },
    async commit() {
      committed = true;
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      return { stream: res, accepted: finished(res) };
    },
    abort() {
      res.destroy();
    },
  };
}

/** Answers a legacy PUT whose stdout was not committed: the receipt as JSON. */
export function sendReceipt(res: ServerResponse, receipt: Receipt, bodyMode: boolean): void {
  // §5: a body-mode failure before the commit answers 500 with the receipt; otherwise 200.
  const status = bodyMode && !receipt.ok ? 500 : 200;
  const text = JSON.stringify(receipt);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}
