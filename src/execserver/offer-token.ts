import { randomBytes } from 'node:crypto';

/**
 * Offer tokens: 128 random bits, base64url (22 characters). A token is only checked against its
 * own connection's offer for that job_id, but it must not be guessable from another job's.
 */
// randomBytes(16) per offer was 9 % of the broker's CPU at 20k jobs/s (bench/README.md); the
// bytes come from a pooled 4 KiB draw instead, each used once: still 128 unpredictable bits.
const TOKEN_BYTES = 16;
let tokenPool = Buffer.alloc(0);
let tokenPoolOffset = 0;

export function newOfferToken(): string {
  if (tokenPoolOffset + TOKEN_BYTES > tokenPool.length) {
    tokenPool = randomBytes(256 * TOKEN_BYTES);
    tokenPoolOffset = 0;
  }
  const token = tokenPool.toString('base64url', tokenPoolOffset, tokenPoolOffset + TOKEN_BYTES);
  tokenPoolOffset += TOKEN_BYTES;
  return token;
}
