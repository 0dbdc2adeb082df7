/**
 * Bounded captures of a command's output for the receipt (PROTOCOL.md §4): the first bytes of
 * stdout (`stdout_prefix`) and the last bytes of stderr (`stderr_line`). Neither ever holds more
 * than its limit, however much a command writes.
 */

/** Length of the longest prefix of `buf` that does not end inside a UTF-8 sequence. */
export function utf8SafeEnd(buf: Uint8Array): number {
  const len = buf.length;
  // Walk back over at most 3 continuation bytes (10xxxxxx) to the start of the last sequence.
  let i = len - 1;
  while (i >= 0 && i >= len - 4 && ((buf[i] as number) & 0xc0) === 0x80) i--;
  if (i < 0) return len;
  const lead = buf[i] as number;
  const need = lead < 0x80 ? 1 : (lead & 0xe0) === 0xc0 ? 2 : (lead & 0xf0) === 0xe0 ? 3 : (lead & 0xf8) === 0xf0 ? 4 : 1;
  return i + need > len ? i : len;
}

/** Index of the first byte of `buf` that is not a UTF-8 continuation byte (at most 3 skipped). */
export function utf8SafeStart(buf: Uint8Array): number {
  let i = 0;
  while (i < buf.length && i < 3 && ((buf[i] as number) & 0xc0) === 0x80) i++;
  return i;
}

/** Decodes at most `maxBytes` of `buf` as UTF-8 without cutting a character in half. */
export function decodeUtf8Prefix(buf: Uint8Array, maxBytes: number): string {
  const head = buf.length > maxBytes ? buf.subarray(0, maxBytes) : buf;
  return Buffer.from(head.buffer, head.byteOffset, utf8SafeEnd(head)).toString('utf8');
}

/** Keeps the first `limitBytes` bytes pushed into it and counts all of them. */
export class PrefixCapture {
  readonly limitBytes: number;
  #chunks: Buffer[] = [];
  #kept = 0;
  #total = 0;

  constructor(limitBytes: number) {
    this.limitBytes = limitBytes;
  }

  push(chunk: Buffer): void {
    this.#total += chunk.length;
    const room = this.limitBytes - this.#kept;
    if (room <= 0) return;
    const part = chunk.length > room ? chunk.subarray(0, room) : chunk;
    // Copy: the caller may reuse or hand on its buffer.
    this.#chunks.push(Buffer.from(part));
    this.#kept += part.length;
  }

  /** Bytes pushed so far, kept or not. */
  get totalBytes(): number {
    return this.#total;
  }

  /** More was pushed than kept. */
  get truncated(): boolean {
    return this.#total > this.#kept;
  }

  bytes(): Buffer {
    if (this.#chunks.length > 1) this.#chunks = [Buffer.concat(this.#chunks)];
    return this.#chunks[0] ?? Buffer.alloc(0);
  }

  /** The kept bytes as UTF-8, ending on a character boundary. */
  text(): string {
    return decodeUtf8Prefix(this.bytes(), this.limitBytes);
  }
}

/** Keeps the last `limitBytes` bytes pushed into it. */
export class TailCapture {
  readonly limitBytes: number;
  #buf: Buffer = Buffer.alloc(0);
  #dropped = false;

  constructor(limitBytes: number) {
    this.limitBytes = limitBytes;
  }

  push(chunk: Buffer): void {
    if (chunk.length >= this.limitBytes) {
      this.#dropped ||= this.#buf.length > 0 || chunk.length > this.limitBytes;
      this.#buf = Buffer.from(chunk.subarray(chunk.length - this.limitBytes));
      return;
    }
    const joined = Buffer.concat([this.#buf, chunk]);
    if (joined.length > this.limitBytes) {
      this.#dropped = true;
      this.#buf = Buffer.from(joined.subarray(joined.length - this.limitBytes));
    } else {
      this.#buf = joined;
    }
  }

  /** Earlier bytes were dropped to stay within the limit. */
  get dropped(): boolean {
    return this.#dropped;
  }

  /**
   * The last line that holds more than white space, trimmed. `cutAtStart` says that the line
   * may have begun before the kept bytes (its start was dropped).
   */
  lastLine(): { line: string; cutAtStart: boolean } {
    const start = this.#dropped ? utf8SafeStart(this.#buf) : 0;
    const text = this.#buf.subarray(start).toString('utf8');
    const lines = text.split('\n');
    for (let i = lines.length - 1; i >= 0; i--) {
      const line = (lines[i] as string).trim();
      if (line !== '') return { line, cutAtStart: i === 0 && this.#dropped };
    }
    return { line: '', cutAtStart: false };
  }
}
