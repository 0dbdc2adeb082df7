import t from 'tap';
import { ExecClient } from '../../src/fylr/exec-client.js';
import { HEADROOM_PER_INSTANCE } from '../../src/fylr/admission.js';
import { clientConfig, rawPeer, startExec, waitFor } from './fixtures.js';

t.test('admission follows HELLO clients: 5 clients on a 40-slot instance -> 8 + headroom; a client leaving grows the share', async (t) => {
  const a = await startExec(t, { name: 'a', waitgroups: { w: 40 }, services: { sleep: 'w' } });
  const peers = await Promise.all([1, 2, 3, 4].map(() => rawPeer(t, a.url)));
  const client = new ExecClient(clientConfig([a.url]));
  t.teardown(() => client.close());
  let changes = 0;
  client.onChange(() => changes++);
  await client.start();
  await waitFor(() => client.admission() === 8 + HEADROOM_PER_INSTANCE, 'admission 8 + headroom');
  t.equal(HEADROOM_PER_INSTANCE, 2);
  t.equal(client.admission(), 10);
  t.equal(client.status().admission, 10);
  const before = changes;
  await peers[0]!.close();
  await waitFor(() => client.admission() === 10 + HEADROOM_PER_INSTANCE, 'ceil(40/4) + headroom');
  t.ok(changes > before, 'the dispatcher is told (onChange)');
  await Promise.all(peers.slice(1).map((p) => p.close()));
  await waitFor(() => client.admission() === 40 + HEADROOM_PER_INSTANCE, 'alone: the whole instance + headroom');
});

t.test('admission sums over instances; one instance reached by two addresses counts once; 0 with nothing connected', async (t) => {
  const a = await startExec(t, { name: 'a', waitgroups: { w: 6 }, services: { sleep: 'w' } });
  const b = await startExec(t, { name: 'b', waitgroups: { w: 3, v: 4 }, services: { sleep: 'w', cat: 'v' } });
  const client = new ExecClient(clientConfig([a.url, b.url, a.url.replace('127.0.0.1', 'localhost')]));
  t.teardown(() => client.close());
  await client.start();
  // a: 2 connections from us (two addresses) -> clients 2 -> ceil(6/2)+2 = 5; b: ceil(7/1)+2 = 9.
  await waitFor(() => a.exec.broker.connectionCount === 2, 'both addresses reach a');
  await waitFor(() => client.admission() === 5 + 9, 'a counted once, b summed');
  t.equal(client.hasExecserver(), true);

  await a.close();
  await b.close();
  await waitFor(() => client.admission() === 0, 'nothing connected: 0');
  t.equal(client.hasExecserver(), false);
  t.same(client.status().addresses.map((x) => x.transport), ['down', 'down', 'down']);
});

t.test('an address that never answers: start() resolves after the first failure; admission 0', async (t) => {
  const a = await startExec(t, { name: 'gone' });
  const url = a.url;
  await a.close();
  const client = new ExecClient(clientConfig([url]));
  t.teardown(() => client.close());
  await client.start();
  t.equal(client.admission(), 0);
  t.equal(client.hasExecserver(), false);
  t.equal(client.status().addresses[0]!.transport, 'down');
});
