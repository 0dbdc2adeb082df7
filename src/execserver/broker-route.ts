/**
 * `GET /broker`: the websocket shell around Broker. ws does the framing, the payload limit
 * (1009) and answers the peer's pings; this file turns a socket into a BrokerTransport and back.
 */
import type { FastifyInstance } from 'fastify';
import type { RawData, WebSocket } from 'ws';
import type { Broker } from './broker.js';

function toBuffer(data: RawData): Buffer {
  if (Buffer.isBuffer(data)) return data;
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.from(data);
}

export async function brokerRoute(app: FastifyInstance, opts: { broker: Broker }): Promise<void> {
  const { broker } = opts;
  app.get('/broker', { websocket: true }, (socket: WebSocket, req) => {
    const session = broker.open(
      {
        send: (text) => {
          if (socket.readyState === socket.OPEN) socket.send(text);
        },
        close: (code, reason) => socket.close(code, reason),
        terminate: () => socket.terminate(),
        ping: () => {
          if (socket.readyState === socket.OPEN) socket.ping();
        },
      },
      { remoteAddress: req.socket.remoteAddress, localAddress: req.socket.localAddress },
    );
    socket.on('message', (data, isBinary) => session.receive(toBuffer(data), isBinary));
    socket.on('pong', () => session.alive());
    socket.on('ping', () => session.alive());
    // ws reports protocol violations (e.g. a frame over maxPayload: close 1009) as errors, then closes.
    socket.on('error', () => undefined);
    socket.on('close', (code) => session.closed(`close ${code}`));
  });
}
