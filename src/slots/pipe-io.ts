/**
 * Body-mode streams over the fylr's one-time pipe endpoints (PROTOCOL.md §2): stdin is a GET of
 * `pipes.in`, stdout a chunked PUT to `pipes.out`. Both stream with backpressure; nothing is
 * buffered in full. Aborting the PUT's body mid-way makes undici abort the request, so the pipe
 * server sees an incomplete body, never a clean end.
 */
import { PassThrough, type Readable } from 'node:stream';
import { request } from 'undici';
import { SlotgateError } from '../errors.js';
import type { StdinSource, StdoutSink } from './job-runner.js';

export function pipeStdin(url: string, signal?: AbortSignal): StdinSource {
  return {
    async open(): Promise<Readable> {
      const res = await request(url, { method: 'GET', signal, headersTimeout: 30_000, bodyTimeout: 0 });
      if (res.statusCode !== 200) {
        res.body.resume();
        throw new SlotgateError('pipe_in_failed', `GET stdin pipe answered ${res.statusCode}`);
      }
      return res.body;
    },
  };
}

export function pipeStdout(url: string, signal?: AbortSignal): StdoutSink {
  let body: PassThrough | undefined;
  return {
    async commit() {
      body = new PassThrough({ highWaterMark: 64 * 1024 });
      const accepted = request(url, {
        method: 'PUT',
        body,
        signal,
        headers: { 'content-type': 'application/octet-stream' },
        headersTimeout: 0,
        bodyTimeout: 0,
      }).then(async (res) => {
        await res.body.dump();
        if (res.statusCode < 200 || res.statusCode >= 300) {
          throw new SlotgateError('pipe_out_failed', `PUT stdout pipe answered ${res.statusCode}`);
        }
      });
      // The runner awaits `accepted` only after the stream ends; keep an early rejection handled.
      accepted.catch(() => undefined);
      return { stream: body, accepted };
    },
    abort(error: Error) {
      body?.destroy(error);
    },
  };
}
