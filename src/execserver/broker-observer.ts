/**
 * What the broker tells the outside about itself (metrics, logs). Every method is optional to
 * implement; the broker never waits for an observer.
 */
import type { ErrorCode } from '../errors.js';

export interface BrokerObserver {
  wantParked?(waitgroup: string, priority: number): void;
  wantLeft?(waitgroup: string, priority: number): void;
  offerMade?(waitgroup: string, slotFreeToOfferMs: number | null): void;
  offerDeclined?(waitgroup: string): void;
  offerExpired?(waitgroup: string): void;
  offerWithdrawn?(waitgroup: string): void;
  jobStarted?(waitgroup: string, offerToJobMs: number): void;
  jobDone?(waitgroup: string, service: string, ok: boolean, durationMs: number): void;
  refused?(code: ErrorCode): void;
  connectionsChanged?(count: number): void;
  connectionClosed?(reason: string): void;
}
