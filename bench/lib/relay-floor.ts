/**
 * The physical floor for streaming through a relay: a bare TCP relay (`net` sockets piped both
 * ways, no HTTP parsing, no framing, no copies of our own) in front of one backend. Put where the
 * gateway sits, it costs what any userspace process in the path must: every byte read and written
 * once more in each direction. Whatever the gateway takes beyond this is the cost of its own work.
 */
import net, { type AddressInfo } from 'node:net';

export class RelayFloor {
  readonly #server: net.Server;
  readonly #sockets = new Set<net.Socket>();
  /** Bytes relayed, both directions. */
  bytes = 0;
  connections = 0;

  private constructor(server: net.Server) {
    this.#server = server;
  }

  static async start(target: string): Promise<{ relay: RelayFloor; url: string }> {
    const to = new URL(target);
    const server = net.createServer();
    const relay = new RelayFloor(server);
    server.on('connection', (client) => {
      relay.connections++;
      const upstream = net.connect({ host: to.hostname, port: Number(to.port) });
      for (const s of [client, upstream]) {
        relay.#sockets.add(s);
        s.on('close', () => relay.#sockets.delete(s));
        s.on('error', () => (s === client ? upstream : client).destroy());
        s.on('data', (chunk: Buffer) => (relay.bytes += chunk.length));
      }
      client.pipe(upstream);
      upstream.pipe(client);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as AddressInfo).port;
    return { relay, url: `http://127.0.0.1:${port}` };
  }

  close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }
}
