/**
 * The old transport's wire, read by the new side (the fylr's polling fallback, the gateway's
 * backend client) and by the reference old fylr in legacy/. A legacy peer's error text is
 * translated into a typed error here, once (STYLE.md: translate at the boundary).
 */
import { SlotgateError } from '../errors.js';
import { isPlainObject, type Receipt } from './job.js';

export interface LegacyAddress {
  /** As configured. */
  address: string;
  /** Where `/token/...` and `/job/...` go. */
  base: string;
  /** A `/job/<service>` path limits the address to that service. */
  onlyService: string | null;
}

/** `http://exec:8083` or `http://exec:8083/job/convert` (only for the service convert). */
export function parseLegacyAddress(address: string): LegacyAddress {
  const u = new URL(address);
  const m = /^(.*)\/job\/([^/]+)\/?$/.exec(u.pathname);
  const path = (m ? m[1]! : u.pathname).replace(/\/+$/, '');
  return { address, base: `${u.origin}${path}`, onlyService: m ? decodeURIComponent(m[2]!) : null };
}

/** The `Error` of a legacy `{"Error": "...", "Status": N}` body, or null. */
export function legacyErrorText(body: string): string | null {
  try {
    const j: unknown = JSON.parse(body);
    if (isPlainObject(j) && typeof j.Error === 'string') return j.Error;
  } catch {
    /* not JSON */
  }
  return null;
}

/**
 * A legacy error answer as a typed error. `where` names the peer in the message
 * ("execserver", "backend http://old:8083").
 */
export function translateLegacyError(status: number, body: string, where = 'execserver'): SlotgateError {
  const text = legacyErrorText(body);
  // The old execserver answers a token of another service with "Token not valid for service ...".
  if (text === 'Token not found' || (text !== null && /^Token not valid/.test(text))) {
    return new SlotgateError('token_not_found', `${where} answered ${text} (the PUT reached an instance that did not issue the token, or it expired)`);
  }
  if (text === 'All workers busy') return new SlotgateError('all_workers_busy', `${where}: all workers busy`);
  if (text !== null && /^Unknown service/.test(text)) return new SlotgateError('unknown_service', `${where}: ${text}`);
  const detail = text ?? body.slice(0, 200);
  if (status === 400 && text !== null && /^invalid job/i.test(text)) return new SlotgateError('invalid_job', `${where}: ${text}`);
  if (status === 400) return new SlotgateError('bad_request', `${where} refused the request: ${detail}`);
  return new SlotgateError('backend_failed', `${where} answered ${status}${detail ? `: ${detail}` : ''}`);
}

/** A legacy PUT's answer is a receipt when it is an object with a boolean `ok`. */
export function isReceipt(v: unknown): v is Receipt {
  return isPlainObject(v) && typeof v.ok === 'boolean';
}

/** A receipt the server may send along a body-mode answer (`x-receipt` header, JSON). */
export function receiptFromHeader(headers: Record<string, string | string[] | undefined>): Receipt | null {
  const raw = headers['x-receipt'];
  if (typeof raw !== 'string') return null;
  try {
    const j: unknown = JSON.parse(raw);
    return isReceipt(j) ? j : null;
  } catch {
    return null;
  }
}
