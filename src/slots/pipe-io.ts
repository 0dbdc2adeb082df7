/**
 * Body-mode streams over the fylr's one-time pipe endpoints (PROTOCOL.md §2): stdin is a GET of
 * `pipes.in`, stdout a chunked PUT to `pipes.out`. Both stream with backpressure; nothing is
 * buffered in full. Aborting the PUT mid-way destroys the request, so the pipe server sees an
 * incomplete chunked body, never a clean end.
 *
 * node:http rather than undici: the stdout PUT then streams straight into the request with no
 * PassThrough in between, which cut the execserver's cost from ~5 to ~3.4 CPU s per GB in the
 * streaming benchmark (bench/README.md). Each pipe is used once, so no connection is kept alive.
 */
import http from 'node:http';
import https from 'node:https';
import type { Readable } from 'node:stream';
import { SlotgateError } from '../errors.js';
import type { StdinSource, StdoutSink } from './job-runner.js';

function clientFor(url: string): typeof http {
  return new URL(url).protocol === 'https:' ? (https as unknown as typeof http) : http;
}

export function pipeStdin(url: string, signal?: AbortSignal): StdinSource {
  return {
    open(): Promise<Readable> {
      return new Promise<Readable>((resolve, reject) => {
        const req = clientFor(url).get(url, { agent: false, ...(signal ? { signal } : {}) }, (res) => {
          if (res.statusCode !== 200) {
            res.resume();
            reject(new SlotgateError('pipe_in_failed', `GET stdin pipe answered ${res.statusCode}`));
            return;
          }
          resolve(res);
        });
        req.on('error', (e) => reject(new SlotgateError('pipe_in_failed', `GET stdin pipe failed: ${(e as NodeJS.ErrnoException).code ?? e.message}`, { cause: e })));
      });
    },
  };
}

export function pipeStdout(url: string, signal?: AbortSignal): StdoutSink {
  let req: http.ClientRequest | undefined;
  return {
    async commit() {
      const r = clientFor(url).request(url, {
        method: 'PUT',
        agent: false,
        headers: { 'content-type': 'application/octet-stream' },
        ...(signal ? { signal } : {}),
      });
      req = r;
      const accepted = new Promise<void>((resolve, reject) => {
        r.on('response', (res) => {
          res.resume();
          res.on('end', () => {
            const status = res.statusCode ?? 0;
            if (status >= 200 && status < 300) resolve();
            else reject(new SlotgateError('pipe_out_failed', `PUT stdout pipe answered ${status}`));
          });
          res.on('error', reject);
        });
        r.on('error', (e) => reject(new SlotgateError('pipe_out_failed', `PUT stdout pipe failed: ${(e as NodeJS.ErrnoException).code ?? e.message}`, { cause: e })));
      });
      // The runner awaits `accepted` only after the stream ends; keep an early rejection handled.
      accepted.catch(() => undefined);
      return { stream: r, accepted };
    },
    abort(error: Error) {
      req?.destroy(error);
    },
  };
}
