/** Shared by the job-runner tests: a recording stdout sink, a file server, process-group probes. */
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { type IncomingMessage, type Server, type ServerResponse, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import type { StdoutSink } from '../../src/slots/job-runner.js';

const PF_EXITING = 0x4;
const SIGKILL_BIT = 1n << 8n; // signal 9

/** Has this process a SIGKILL pending (it will never run user code again)? */
function killPending(pid: string): boolean {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    for (const key of ['SigPnd', 'ShdPnd']) {
      const m = new RegExp(`^${key}:\\s*([0-9a-f]+)`, 'm').exec(status);
      if (m && (BigInt(`0x${m[1]}`) & SIGKILL_BIT) !== 0n) return true;
    }
  } catch {
    return true; // gone meanwhile
  }
  return false;
}

/**
 * Processes of process group `pgid` that can still run, from /proc: not zombies (PID 1 here
 * may not reap orphans), not already exiting, not holding a pending SIGKILL.
 */
export function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'utf8');
    } catch {
      continue;
    }
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const state = rest[0];
    if (Number(rest[2]) !== pgid || state === 'Z' || state === 'X') continue;
    if ((Number(rest[6]) & PF_EXITING) !== 0 || killPending(name)) continue;
    out.push(Number(name));
  }
  return out;
}

export interface RecordingSink extends StdoutSink {
  events: string[];
  bytes: number;
  data(): Buffer;
  sha256(): string;
  ended: boolean;
  /** Largest writableLength seen inside write(): how much the runner let pile up. */
  maxBuffered: number;
  /** Resolves when commit() is called. */
  committed: Promise<void>;
  /** Resolves once at least `n` bytes arrived. */
  received(n: number): Promise<void>;
}

export interface SinkOptions {
  /** accepted rejects with this once the stream ended. */
  rejectWith?: Error;
  /** Keep the bytes (small outputs only). */
  keep?: boolean;
  /** Call back each write on a later turn of the event loop: a slow peer. */
  slow?: boolean;
  highWaterMark?: number;
}

export function recordingSink(opts: SinkOptions = {}): RecordingSink {
  const hash = createHash('sha256');
  const chunks: Buffer[] = [];
  const waiters: { n: number; resolve: () => void }[] = [];
  let onCommit: () => void = () => {};
  let stream: Writable | null = null;
  const sink: RecordingSink = {
    events: [],
    bytes: 0,
    ended: false,
    maxBuffered: 0,
    committed: new Promise<void>((resolve) => (onCommit = resolve)),
    data: () => Buffer.concat(chunks),
    sha256: () => hash.copy().digest('hex'),
    received(n) {
      if (sink.bytes >= n) return Promise.resolve();
      return new Promise((resolve) => waiters.push({ n, resolve }));
    },
    async commit() {
      sink.events.push('commit');
      const s = new Writable({
        highWaterMark: opts.highWaterMark ?? 16 * 1024,
        write(chunk: Buffer, _enc, cb) {
          sink.maxBuffered = Math.max(sink.maxBuffered, s.writableLength);
          sink.bytes += chunk.length;
          hash.update(chunk);
          if (opts.keep) chunks.push(Buffer.from(chunk));
          for (const w of waiters.splice(0)) {
            if (sink.bytes >= w.n) w.resolve();
            else waiters.push(w);
          }
          if (opts.slow) setImmediate(cb);
          else cb();
        },
        final(cb) {
          sink.ended = true;
          sink.events.push('end');
          cb();
        },
      });
      stream = s;
      const accepted = new Promise<void>((resolve, reject) => {
        s.on('finish', () => (opts.rejectWith ? reject(opts.rejectWith) : resolve()));
        s.on('close', () => {
          if (!s.writableFinished) reject(new Error('stream destroyed'));
        });
        s.on('error', reject);
      });
      onCommit();
      return { stream: s, accepted };
    },
    abort(error) {
      sink.events.push('abort');
      stream?.destroy(error);
    },
  };
  return sink;
}

export interface FileServer {
  url: string;
  /** PUT bodies by path. */
  puts: Map<string, Buffer>;
  gets: string[];
  close(): Promise<void>;
}

/** Serves GET from `files` (404 otherwise), stores PUT bodies; `/fail/...` answers 500. */
export async function fileServer(files: Record<string, string | Buffer>): Promise<FileServer> {
  const puts = new Map<string, Buffer>();
  const gets: string[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    if (req.method === 'GET') {
      gets.push(path);
      const body = files[path];
      if (body === undefined) {
        res.writeHead(404).end('not found');
        return;
      }
      res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(body);
      return;
    }
    if (req.method === 'PUT') {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        if (path.startsWith('/fail/')) {
          res.writeHead(500).end('no');
          return;
        }
        puts.set(path, Buffer.concat(chunks));
        res.writeHead(201).end();
      });
      return;
    }
    res.writeHead(405).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    puts,
    gets,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
