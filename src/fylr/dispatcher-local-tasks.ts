/**
 * The local-bound actions (LOCAL_ACTIONS): work a fylr does itself, on one slot of the
 * dispatcher's local semaphore, never on an execserver.
 *
 *   checksum   sha256 of `payload.file` (a path, streamed) or `payload.data` (a string), else of
 *              the payload's JSON; the hex digest is the receipt's `stdout_prefix`.
 *   sync       stand-ins for fylr's own work (index sync, moving files between stores): they
 *   copy_move  hold their slot for `payload.hold_ms` (default 0, at most 60 000) and succeed.
 *
 * A local task resolves with a receipt (PROTOCOL.md §4), ok or not; it does not throw.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import type { Clock } from '../clock.js';
import { failedReceipt, isPlainObject, okReceipt, type Receipt } from '../protocol/job.js';

export const MAX_HOLD_MS = 60_000;

async function sha256OfFile(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

function hold(clock: Clock, ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (ms <= 0 || signal?.aborted) return resolve();
    const onAbort = (): void => {
      clock.clearTimeout(timer);
      resolve();
    };
    const timer = clock.setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

export async function runLocalTask(action: string, payload: unknown, clock: Clock, signal?: AbortSignal): Promise<Receipt> {
  const started = clock.now();
  const elapsed = (): number => Math.max(0, Math.round(clock.now() - started));
  const p = isPlainObject(payload) ? payload : {};
  try {
    switch (action) {
      case 'checksum': {
        let digest: string;
        if (typeof p.file === 'string') digest = await sha256OfFile(p.file);
        else digest = createHash('sha256').update(typeof p.data === 'string' ? p.data : JSON.stringify(payload ?? null)).digest('hex');
        return { ...okReceipt(elapsed()), stdout_prefix: digest, output_bytes: digest.length };
      }
      case 'sync':
      case 'copy_move': {
        const ms = typeof p.hold_ms === 'number' && Number.isFinite(p.hold_ms) ? Math.min(MAX_HOLD_MS, Math.max(0, p.hold_ms)) : 0;
        await hold(clock, ms, signal);
        return okReceipt(elapsed());
      }
      default:
        return failedReceipt('invalid_job', `${JSON.stringify(action)} is not a local action`);
    }
  } catch (e) {
    return { ...failedReceipt('command_failed', `${action} failed: ${(e as Error).message}`, elapsed()), stderr_line: (e as Error).message };
  }
}
