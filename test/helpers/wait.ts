/**
 * Waiting for a condition that no frame or event announces (a process count, a port that stops
 * answering): polls `check` until it holds, and fails with `what` after `timeoutMs`. Not a sleep:
 * it returns as soon as the condition holds.
 */
import { setTimeout as delay } from 'node:timers/promises';

export async function eventually<T>(
  check: () => T | Promise<T>,
  opts: { what?: string; timeoutMs?: number; intervalMs?: number } = {},
): Promise<NonNullable<T>> {
  const deadline = Date.now() + (opts.timeoutMs ?? 10_000);
  let last: T | undefined;
  for (;;) {
    last = await check();
    if (last) return last as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${opts.what ?? 'a condition'} (last: ${JSON.stringify(last)})`);
    await delay(opts.intervalMs ?? 10);
  }
}

/** Rejects after `ms` unless `p` settles first (a hang becomes a failure with a message). */
export async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
