/**
 * A configured execserver address, as fylr.yml has it: `http://exec:8083`, a path prefix
 * (`http://lb/exec`), and optionally a `/job/<service>` suffix that limits the address to that
 * one service (the old per-address service filter). The broker lives at `<base>/broker`.
 */
import { parseLegacyAddress } from '../protocol/legacy-wire.js';

export interface ExecAddress {
  /** As configured: the key in status and logs. */
  readonly address: string;
  /** `http(s)://host:port[/prefix]`, no trailing slash: where `/token`, `/job` and `/broker` live. */
  readonly base: string;
  /** `ws(s)://host:port[/prefix]/broker`. */
  readonly brokerUrl: string;
  /** Only this service may be sent to the address, or null for any. */
  readonly onlyService: string | null;
}

export function parseExecAddress(address: string): ExecAddress {
  const legacy = parseLegacyAddress(address);
  const brokerUrl = `${legacy.base.replace(/^http/, 'ws')}/broker`;
  return { address, base: legacy.base, brokerUrl, onlyService: legacy.onlyService };
}

/** May a job of `service` go to this address at all? */
export function addressServes(addr: ExecAddress, service: string): boolean {
  return addr.onlyService === null || addr.onlyService === service;
}
