import type http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

export interface LocalListener {
  /** `http://127.0.0.1:PORT`, no trailing slash. */
  url: string;
  port: number;
  /**
   * Stops listening and destroys every open connection at once (the caller's own clean-up may
   * follow synchronously); resolves once the server closed.
   */
  close(): Promise<void>;
}

/** Starts `server` on 127.0.0.1, port 0, keeping track of its connections for `close()`. */
export async function listenLocal(server: http.Server): Promise<LocalListener> {
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sockets) s.destroy();
      return closed;
    },
  };
}
