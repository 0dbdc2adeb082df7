/**
 * `file_in` / `file_out` arguments (PROTOCOL.md §3): a file_in is downloaded into the job's temp
 * dir before any command runs, a file_out is uploaded with HTTP PUT after its command succeeded.
 * Only the URL in the job is contacted: redirects are not followed.
 */
import { createReadStream, createWriteStream } from 'node:fs';
import { stat } from 'node:fs/promises';
import { pipeline } from 'node:stream/promises';
import { request } from 'undici';
import { SlotgateError } from '../errors.js';
import type { FileRef } from '../protocol/job.js';

/** The URL without its query and fragment: a query may carry a credential. */
export function displayUrl(url: string): string {
  try {
    const u = new URL(url);
    return `${u.origin}${u.pathname}`;
  } catch {
    return '(invalid URL)';
  }
}

function reason(e: unknown): string {
  const err = e as { code?: string; message?: string };
  return err.code !== undefined ? `${err.code}: ${err.message ?? ''}`.replace(/: $/, '') : (err.message ?? String(e));
}

export async function downloadFile(ref: FileRef, dest: string, signal: AbortSignal): Promise<void> {
  const what = `file_in ${JSON.stringify(ref.name)}: GET ${displayUrl(ref.url)}`;
  let res;
  try {
    res = await request(ref.url, { method: 'GET', signal });
  } catch (e) {
    throw new SlotgateError('file_in_failed', `${what} failed: ${reason(e)}`, { cause: e });
  }
  if (res.statusCode < 200 || res.statusCode > 299) {
    res.body.dump().catch(() => {});
    throw new SlotgateError('file_in_failed', `${what} answered HTTP ${res.statusCode}`);
  }
  try {
    // 'wx': two file_in arguments with one name would otherwise overwrite each other silently.
    await pipeline(res.body, createWriteStream(dest, { flags: 'wx' }), { signal });
  } catch (e) {
    throw new SlotgateError('file_in_failed', `${what} failed while reading the body: ${reason(e)}`, { cause: e });
  }
}

export async function uploadFile(ref: FileRef, src: string, signal: AbortSignal): Promise<void> {
  const what = `file_out ${JSON.stringify(ref.name)}: PUT ${displayUrl(ref.url)}`;
  let size: number;
  try {
    const st = await stat(src);
    if (!st.isFile()) throw new Error('not a regular file');
    size = st.size;
  } catch {
    throw new SlotgateError('file_out_failed', `${what}: the command wrote no file ${JSON.stringify(ref.name)}`);
  }
  let res;
  try {
    res = await request(ref.url, {
      method: 'PUT',
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(size) },
      body: createReadStream(src),
      signal,
    });
  } catch (e) {
    throw new SlotgateError('file_out_failed', `${what} failed: ${reason(e)}`, { cause: e });
  }
  await res.body.dump().catch(() => {});
  if (res.statusCode < 200 || res.statusCode > 299) {
    throw new SlotgateError('file_out_failed', `${what} answered HTTP ${res.statusCode}`);
  }
}
