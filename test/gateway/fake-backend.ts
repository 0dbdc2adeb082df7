/**
 * A stand-in for a legacy backend whose `GET /token` answer a test chooses (a `service` URL the
 * gateway must refuse, a 404) and that records every request it gets. Everything else is 404.
 * For behaviour the real legacy execserver cannot be made to show; the rest of the gateway tests
 * use legacy/execserver/.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface FakeBackend {
  url: string;
  requests: { method: string; url: string }[];
  close(): Promise<void>;
}

export async function startFakeBackend(tokenAnswer: () => { status: number; body: unknown }): Promise<FakeBackend> {
  const requests: { method: string; url: string }[] = [];
  const server = http.createServer((req, res) => {
    requests.push({ method: req.method ?? '', url: req.url ?? '' });
    req.resume();
    const answer = /^\/token\//.test(req.url ?? '') ? tokenAnswer() : { status: 404, body: { Error: 'Not found', Status: 404 } };
    const text = JSON.stringify(answer.body);
    res.writeHead(answer.status, { 'content-type': 'application/json', connection: 'close' }).end(text);
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
