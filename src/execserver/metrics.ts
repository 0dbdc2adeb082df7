/**
 * Prometheus metrics of one execserver/gateway (prom-client, a registry per server so that
 * several servers in one process — tests, benchmarks — do not share counters).
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { ErrorCode } from '../errors.js';
import type { Broker } from './broker.js';
import type { BrokerObserver } from './broker-observer.js';

const LATENCY_BUCKETS_S = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5];

export class ExecserverMetrics implements BrokerObserver {
  readonly registry = new Registry();
  readonly #offers = new Counter({ name: 'slotgate_offers_total', help: 'Offers by outcome', labelNames: ['waitgroup', 'outcome'], registers: [this.registry] });
  readonly #slotFreeToOffer = new Histogram({ name: 'slotgate_slot_free_to_offer_seconds', help: 'From a slot becoming available to its OFFER', labelNames: ['waitgroup'], buckets: LATENCY_BUCKETS_S, registers: [this.registry] });
  readonly #offerToJob = new Histogram({ name: 'slotgate_offer_to_job_seconds', help: 'From OFFER to the JOB that accepts it', labelNames: ['waitgroup'], buckets: LATENCY_BUCKETS_S, registers: [this.registry] });
  readonly #jobs = new Counter({ name: 'slotgate_jobs_total', help: 'Jobs finished by service and result', labelNames: ['waitgroup', 'service', 'result'], registers: [this.registry] });
  readonly #refused = new Counter({ name: 'slotgate_refused_frames_total', help: 'Refused broker frames by code', labelNames: ['code'], registers: [this.registry] });
  readonly #connections = new Gauge({ name: 'slotgate_broker_connections', help: 'Open broker connections', registers: [this.registry] });
  readonly #closed = new Counter({ name: 'slotgate_broker_connections_closed_total', help: 'Closed broker connections by reason', labelNames: ['reason'], registers: [this.registry] });
  readonly legacyTokens = new Counter({ name: 'slotgate_legacy_tokens_total', help: 'Legacy GET /token answers by status', labelNames: ['service', 'status'], registers: [this.registry] });
  readonly legacyJobs = new Counter({ name: 'slotgate_legacy_jobs_total', help: 'Legacy PUT /job answers by status', labelNames: ['service', 'status'], registers: [this.registry] });

  /** Gauges read the broker at scrape time. */
  attach(broker: Broker): void {
    new Gauge({
      name: 'slotgate_parked_wants',
      help: 'Parked wants by waitgroup and priority',
      labelNames: ['waitgroup', 'priority'],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const wg of Object.keys(broker.config.waitgroups)) {
          for (const [p, n] of broker.book.parkedByPriority(wg)) this.set({ waitgroup: wg, priority: String(p) }, n);
        }
      },
    });
    new Gauge({
      name: 'slotgate_running_jobs',
      help: 'Running jobs by waitgroup',
      labelNames: ['waitgroup'],
      registers: [this.registry],
      collect() {
        for (const wg of Object.keys(broker.config.waitgroups)) this.set({ waitgroup: wg }, broker.source.running(wg));
      },
    });
    new Gauge({
      name: 'slotgate_slots',
      help: 'Slots (processes) by waitgroup',
      labelNames: ['waitgroup'],
      registers: [this.registry],
      collect() {
        for (const wg of Object.keys(broker.config.waitgroups)) this.set({ waitgroup: wg }, broker.source.processes(wg));
      },
    });
  }

  offerMade(waitgroup: string, slotFreeToOfferMs: number | null): void {
    this.#offers.inc({ waitgroup, outcome: 'made' });
    if (slotFreeToOfferMs !== null) this.#slotFreeToOffer.observe({ waitgroup }, slotFreeToOfferMs / 1000);
  }
  offerDeclined(waitgroup: string): void {
    this.#offers.inc({ waitgroup, outcome: 'declined' });
  }
  offerExpired(waitgroup: string): void {
    this.#offers.inc({ waitgroup, outcome: 'expired' });
  }
  offerWithdrawn(waitgroup: string): void {
    this.#offers.inc({ waitgroup, outcome: 'withdrawn' });
  }
  jobStarted(waitgroup: string, offerToJobMs: number): void {
    this.#offers.inc({ waitgroup, outcome: 'accepted' });
    this.#offerToJob.observe({ waitgroup }, offerToJobMs / 1000);
  }
  jobDone(waitgroup: string, service: string, ok: boolean): void {
    this.#jobs.inc({ waitgroup, service, result: ok ? 'ok' : 'failed' });
  }
  refused(code: ErrorCode): void {
    this.#refused.inc({ code });
  }
  connectionsChanged(count: number): void {
    this.#connections.set(count);
  }
  connectionClosed(reason: string): void {
    this.#closed.inc({ reason });
  }
}
