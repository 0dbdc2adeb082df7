/**
 * A stand-in for a legacy backend whose `GET /token` answers a test chooses, and times (a
 * `service` URL the gateway must refuse, an answer held back until the test releases it). It
 * records every request. `PUT /job` answers an ok receipt; everything else is 404. It is for
 * behaviour the real legacy execserver cannot be made to show; the rest of the gateway tests use
 * legacy/execserver/.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { okReceipt } from '../../src/protocol/job.js';

export interface FakeRequest {
  method: string;
  url: string;
  /** The `job` query of a PUT, parsed. */
  job?: { service?: string; commands?: unknown[]; token?: string };
}

export interface TokenAnswer {
  status: number;
  body: unknown;
}

export interface FakeBackend {
  url: string;
  requests: FakeRequest[];
  close(): Promise<void>;
}

/** `tokenAnswer` may return a promise: the answer goes out when it resolves. */
export async function startFakeBackend(tokenAnswer: (service: string) => TokenAnswer | Promise<TokenAnswer>): Promise<FakeBackend> {
  const requests: FakeRequest[] = [];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    const entry: FakeRequest = { method: req.method ?? '', url: req.url ?? '' };
    requests.push(entry);
    req.resume();
    const send = (a: TokenAnswer): void => {
      res.writeHead(a.status, { 'content-type': 'application/json', connection: 'close' }).end(JSON.stringify(a.body));
    };
    const token = /^\/token\/(.+)$/.exec(url.pathname);
    if (token) {
      void Promise.resolve(tokenAnswer(decodeURIComponent(token[1] as string))).then(send);
      return;
    }
    if (req.method === 'PUT' && url.pathname.startsWith('/job/')) {
      entry.job = JSON.parse(url.searchParams.get('job') ?? '{}') as FakeRequest['job'];
      send({ status: 200, body: okReceipt(0) });
      return;
    }
    send({ status: 404, body: { Error: 'Not found', Status: 404 } });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
