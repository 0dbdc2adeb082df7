/**
 * `slotgate serve | legacy-execserver | fylr | legacy-fylr` (PROTOCOL.md §7). Each prints one JSON
 * line `{"msg": "listening", "url": ...}` to stdout when ready; a bad configuration stops the
 * start with one line on stderr naming the key, and exit code 2.
 */
import { ConfigError } from './config/config-error.js';
import { legacyOnlyFylrKeys, loadFylrConfig, loadServeConfig, parseFylrConfig, readConfigFile } from './config/load-config.js';

const HELP = `slotgate: compatibility gateway and migration shim for the execserver slot broker

Usage:
  slotgate serve [--config FILE] [--listen HOST:PORT]
      Execserver (local slots) or, with backends: in the config, a gateway in front of legacy
      execservers. Without --config it serves an embedded default (services cat, sha256, echo, sleep).
  slotgate legacy-execserver --config FILE [--listen HOST:PORT]
      The reference old execserver (GET /token, PUT /job; no /broker).
  slotgate fylr --config FILE [--listen HOST:PORT]
      A new fylr-side worker: file_queue dispatcher + broker client + pipe server.
  slotgate legacy-fylr --config FILE [--listen HOST:PORT]
      The reference old fylr: parallel + parallelHigh polling workers.
  slotgate --help

Every command prints {"msg":"listening","url":...} on stdout once it serves; SIGTERM drains.
`;

interface Args {
  command: string | undefined;
  config: string | undefined;
  listen: string | undefined;
  help: boolean;
}

function parseArgs(argv: string[]): Args {
  const args: Args = { command: undefined, config: undefined, listen: undefined, help: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    const value = (): string => {
      const v = argv[++i];
      if (v === undefined || v.startsWith('--')) throw new UsageError(`${a} needs a value`);
      return v;
    };
    if (a === '--help' || a === '-h' || a === 'help') args.help = true;
    else if (a === '--config' || a === '-c') args.config = value();
    else if (a.startsWith('--config=')) args.config = a.slice('--config='.length);
    else if (a === '--listen') args.listen = value();
    else if (a.startsWith('--listen=')) args.listen = a.slice('--listen='.length);
    else if (a.startsWith('-')) throw new UsageError(`unknown option ${a}`);
    else if (args.command === undefined) args.command = a;
    else throw new UsageError(`unexpected argument ${a}`);
  }
  return args;
}

class UsageError extends Error {}

export function printListening(url: string, extra: Record<string, unknown> = {}): void {
  process.stdout.write(`${JSON.stringify({ msg: 'listening', url, ...extra })}\n`);
}

/** SIGTERM/SIGINT: graceful stop once; a second signal exits at once. */
function onShutdown(stop: () => Promise<void>): void {
  let stopping = false;
  const handler = (signal: NodeJS.Signals): void => {
    if (stopping) process.exit(signal === 'SIGINT' ? 130 : 143);
    stopping = true;
    process.stdout.write(`${JSON.stringify({ msg: 'draining', signal })}\n`);
    stop().then(
      () => process.exit(0),
      (e: unknown) => {
        process.stderr.write(`slotgate: shutdown failed: ${(e as Error).message}\n`);
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', handler);
  process.on('SIGINT', handler);
}

const overrides = (args: Args): { listen?: string } => (args.listen !== undefined ? { listen: args.listen } : {});

function requireConfig(args: Args): string {
  if (args.config === undefined) throw new UsageError(`slotgate ${args.command} needs --config FILE`);
  return args.config;
}

async function main(argv: string[]): Promise<void> {
  const args = parseArgs(argv);
  if (args.help || args.command === undefined) {
    process.stdout.write(HELP);
    return;
  }
  switch (args.command) {
    case 'serve': {
      const config = loadServeConfig(args.config, overrides(args));
      const { startServe } = await import('./serve.js');
      const server = await startServe(config);
      printListening(server.url, { name: config.name, instance_id: server.instanceId, kind: server.kind });
      onShutdown(() => server.drainAndClose());
      return;
    }
    case 'legacy-execserver': {
      const config = loadServeConfig(requireConfig(args), overrides(args));
      const { startLegacyExecserver } = await import('../legacy/execserver/legacy-execserver.js');
      const server = await startLegacyExecserver(config, { log: false });
      printListening(server.url, { name: config.name, kind: 'legacy-execserver' });
      onShutdown(() => server.close());
      return;
    }
    case 'fylr': {
      const raw = readConfigFile(requireConfig(args));
      const config = parseFylrConfig(raw, overrides(args));
      for (const key of legacyOnlyFylrKeys(raw)) {
        process.stderr.write(`${JSON.stringify({ level: 'warn', msg: `${key} is read only by slotgate legacy-fylr; slotgate fylr ignores it (its dispatcher claims what the execservers' free slots allow: docs/dispatcher.md)` })}\n`);
      }
      const { startFylr } = await import('./fylr/fylr-process.js');
      const fylr = await startFylr(config);
      printListening(fylr.url, { name: config.name, kind: 'fylr' });
      onShutdown(() => fylr.close());
      return;
    }
    case 'legacy-fylr': {
      const config = loadFylrConfig(requireConfig(args), overrides(args));
      const { startLegacyFylr } = await import('../legacy/fylr/legacy-fylr-process.js');
      const fylr = await startLegacyFylr(config);
      printListening(fylr.url, { name: config.name, kind: 'legacy-fylr' });
      onShutdown(() => fylr.close());
      return;
    }
    default:
      throw new UsageError(`unknown command ${JSON.stringify(args.command)} (see slotgate --help)`);
  }
}

main(process.argv.slice(2)).catch((e: unknown) => {
  if (e instanceof ConfigError) {
    process.stderr.write(`slotgate: ${e.message}\n`);
    process.exit(2);
  }
  if (e instanceof UsageError) {
    process.stderr.write(`slotgate: ${e.message}\n\n${HELP}`);
    process.exit(64);
  }
  const err = e as NodeJS.ErrnoException;
  process.stderr.write(`slotgate: ${err.code === 'EADDRINUSE' ? `cannot listen: ${err.message}` : (err.stack ?? String(e))}\n`);
  process.exit(1);
});
