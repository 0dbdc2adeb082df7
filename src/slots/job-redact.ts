/**
 * Secrets never appear in a receipt (PROTOCOL.md §4). The secrets are the values of the
 * configured commands' `env` entries (`KEY=VALUE`, the VALUE part) of at least
 * MIN_SECRET_CHARS characters; every occurrence in receipt text becomes "[redacted]".
 *
 * Receipt text is often a cut-out of a longer stream (the first 4000 bytes of stdout, the tail
 * of stderr). A secret that straddles the cut would survive in part, so text that continues
 * past an edge also loses a partial secret at that edge.
 */

export const REDACTED = '[redacted]';
export const MIN_SECRET_CHARS = 4;

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

export class Redactor {
  readonly #secrets: string[];
  readonly #pattern: RegExp | null;
  readonly #maxLen: number;

  constructor(secrets: Iterable<string>) {
    const unique = [...new Set([...secrets].filter((s) => s.length >= MIN_SECRET_CHARS))];
    // Longest first: a secret that contains another is replaced whole.
    unique.sort((a, b) => b.length - a.length);
    this.#secrets = unique;
    this.#pattern = unique.length > 0 ? new RegExp(unique.map(escapeRegExp).join('|'), 'g') : null;
    this.#maxLen = unique[0]?.length ?? 0;
  }

  get size(): number {
    return this.#secrets.length;
  }

  redact(text: string): string {
    return this.#pattern === null ? text : text.replace(this.#pattern, REDACTED);
  }

  /** Drops the longest end of `text` that is the beginning of a secret. */
  cutTrailingPartial(text: string): string {
    for (let k = Math.min(this.#maxLen - 1, text.length); k >= 1; k--) {
      const tail = text.slice(text.length - k);
      if (this.#secrets.some((s) => s.length > k && s.startsWith(tail))) return text.slice(0, text.length - k);
    }
    return text;
  }

  /** Drops the longest beginning of `text` that is the end of a secret. */
  cutLeadingPartial(text: string): string {
    for (let k = Math.min(this.#maxLen - 1, text.length); k >= 1; k--) {
      const head = text.slice(0, k);
      if (this.#secrets.some((s) => s.length > k && s.endsWith(head))) return text.slice(k);
    }
    return text;
  }

  /**
   * Redacts a cut-out of a longer text. `continuesAfter` / `continuesBefore` say whether the
   * original went on past the end / began before the start of `text`.
   */
  redactExcerpt(text: string, edges: { continuesAfter?: boolean; continuesBefore?: boolean }): string {
    if (this.#pattern === null) return text;
    let out = this.redact(text);
    if (edges.continuesAfter) out = this.cutTrailingPartial(out);
    if (edges.continuesBefore) out = this.cutLeadingPartial(out);
    return out;
  }
}
