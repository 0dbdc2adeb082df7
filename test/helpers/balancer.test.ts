import http from 'node:http';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { request } from 'undici';
import { WebSocket, WebSocketServer } from 'ws';
import { startBalancer } from './balancer.js';

interface Target {
  url: string;
  close(): Promise<void>;
}

/** A plain HTTP server answering its own name, and a websocket server that greets with it. */
async function target(t: { teardown(fn: () => unknown): void }, name: string): Promise<Target> {
  const server = http.createServer((req, res) => {
    res.setHeader('connection', 'close');
    res.end(`${name} ${req.method} ${req.url}`);
  });
  const wss = new WebSocketServer({ server });
  wss.on('connection', (ws) => ws.send(`hello from ${name}`));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> => (closed ??= shut());
  const shut = async (): Promise<void> => {
    for (const c of wss.clients) c.terminate();
    wss.close();
    server.closeAllConnections();
    await new Promise<void>((r) => server.close(() => r()));
  };
  t.teardown(close);
  return { url, close };
}

async function get(url: string): Promise<{ status: number; text: string }> {
  const res = await request(url);
  return { status: res.statusCode, text: await res.body.text() };
}

async function wsGreeting(url: string): Promise<string> {
  const ws = new WebSocket(url.replace(/^http/, 'ws') + '/broker');
  const [data] = (await once(ws, 'message')) as [Buffer];
  ws.close();
  return data.toString();
}

t.test('round-robin per request, counts per target', async (t) => {
  const a = await target(t, 'a');
  const b = await target(t, 'b');
  const lb = await startBalancer([a.url, b.url], { mode: 'round-robin' });
  t.teardown(() => lb.close());
  const seen: string[] = [];
  for (let i = 0; i < 6; i++) {
    const r = await get(`${lb.url}/token/x`);
    t.equal(r.status, 200);
    seen.push(r.text.split(' ')[0]!);
  }
  t.same(seen, ['a', 'b', 'a', 'b', 'a', 'b']);
  t.same(lb.counts, { [a.url]: 3, [b.url]: 3 });
  t.equal((await get(`${lb.url}/job/x?q=1`)).text, 'a GET /job/x?q=1', 'path and query passed through');
});

t.test('websocket upgrades are passed through and round-robined', async (t) => {
  const a = await target(t, 'a');
  const b = await target(t, 'b');
  const lb = await startBalancer([a.url, b.url], { mode: 'round-robin' });
  t.teardown(() => lb.close());
  const greetings = [await wsGreeting(lb.url), await wsGreeting(lb.url), await wsGreeting(lb.url)];
  t.same(greetings, ['hello from a', 'hello from b', 'hello from a']);
  t.same(lb.counts, { [a.url]: 2, [b.url]: 1 });
});

t.test('setTargets adds and removes replicas at run time', async (t) => {
  const a = await target(t, 'a');
  const b = await target(t, 'b');
  const lb = await startBalancer([a.url], { mode: 'round-robin' });
  t.teardown(() => lb.close());
  t.equal((await get(lb.url)).text.split(' ')[0], 'a');
  t.equal((await get(lb.url)).text.split(' ')[0], 'a');
  lb.setTargets([a.url, b.url]);
  const two = [(await get(lb.url)).text[0], (await get(lb.url)).text[0]].sort();
  t.same(two, ['a', 'b']);
  lb.setTargets([b.url]);
  t.same(lb.targets(), [b.url]);
  t.equal((await get(lb.url)).text[0], 'b');
  t.equal((await get(lb.url)).text[0], 'b');
  lb.setTargets([]);
  t.equal((await get(lb.url)).status, 502, 'no targets: 502');
});

t.test('a target that refuses the connection answers 502', async (t) => {
  const a = await target(t, 'a');
  const gone = await target(t, 'gone');
  await gone.close();
  const lb = await startBalancer([a.url, gone.url], { mode: 'round-robin' });
  t.teardown(() => lb.close());
  t.equal((await get(lb.url)).status, 200);
  t.equal((await get(lb.url)).status, 502);
  t.equal((await get(lb.url)).status, 200);
  // An upgrade to the refusing target fails instead of hanging.
  lb.setTargets([gone.url]);
  const ws = new WebSocket(lb.url.replace(/^http/, 'ws') + '/broker');
  ws.on('error', () => undefined);
  const [, res] = (await once(ws, 'unexpected-response')) as [unknown, http.IncomingMessage];
  t.equal(res.statusCode, 502);
  ws.terminate();
});
