/**
 * The one module of slotgate that imports http-proxy (STACK.md: 1.18.1 is old; wrapped here so a
 * maintained fork can replace it in one place). It streams an old fylr's `PUT /job` to a backend
 * and the answer back, both ways, with backpressure and without buffering.
 *
 * The caller decides the target and the path; the proxy adds nothing of the client's choosing:
 * no forwarded headers, the Host header of the target. A backend answer that breaks off (the old
 * execserver destroys the socket when a body-mode job fails after its commit) breaks the
 * client's answer off too, instead of ending it cleanly as a pipe would.
 */
import http from 'node:http';
import https from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import httpProxy from 'http-proxy';

export interface ProxyOutcome {
  /** The backend's status, or null when it never answered. */
  status: number | null;
  error: Error | null;
}

export interface LegacyProxy {
  /**
   * Sends `req` (its body streamed) to `${base}${path}` and streams the answer to `res`.
   * Resolves once the exchange is over; never rejects. `onError` answers the client when the
   * backend could not be reached before any answer was sent.
   */
  forward(req: IncomingMessage, res: ServerResponse, base: string, path: string, onError: (err: Error) => void): Promise<ProxyOutcome>;
  close(): void;
}

export function createLegacyProxy(): LegacyProxy {
  // No keep-alive towards the backends: old execservers answer `Connection: close` anyway.
  const httpAgent = new http.Agent({ keepAlive: false });
  const httpsAgent = new https.Agent({ keepAlive: false });
  const proxy = httpProxy.createProxyServer({ changeOrigin: true, xfwd: false, ws: false });
  // Without a listener http-proxy re-throws target errors; every call passes its own callback.
  proxy.on('error', () => undefined);
  const answered = new WeakMap<ServerResponse, number>();
  proxy.on('proxyRes', (proxyRes: IncomingMessage, _req: IncomingMessage, res: ServerResponse) => {
    answered.set(res, proxyRes.statusCode ?? 0);
    proxyRes.on('close', () => {
      if (!proxyRes.complete) res.destroy();
    });
  });

  return {
    forward(req, res, base, path, onError) {
      return new Promise<ProxyOutcome>((resolve) => {
        let error: Error | null = null;
        res.once('close', () => resolve({ status: answered.get(res) ?? null, error }));
        req.url = path;
        const agent = base.startsWith('https:') ? httpsAgent : httpAgent;
        proxy.web(req, res, { target: base, agent }, (err: Error) => {
          error = err;
          if (!res.headersSent) onError(err);
          else res.destroy();
        });
      });
    },
    close() {
      proxy.close();
      httpAgent.destroy();
      httpsAgent.destroy();
    },
  };
}
