/**
 * Prometheus metrics of one execserver/gateway (prom-client, a registry per server so that
 * several servers in one process — tests, benchmarks — do not share counters). Counters and
 * histograms are fed by the BrokerObserver calls and by the legacy API; gauges read the broker
 * at scrape time.
 *
 *   slotgate_parked_wants{waitgroup,priority}          slotgate_running_jobs{waitgroup,priority}
 *   slotgate_offers_total{waitgroup,outcome}           outcome: made, accepted, declined, expired, withdrawn
 *   slotgate_slot_free_to_offer_seconds{waitgroup}     a slot freed while wants waited -> its OFFER
 *   slotgate_offer_to_job_seconds{waitgroup}           OFFER -> the JOB that accepts it
 *   slotgate_refused_frames_total{code}                slotgate_broker_connections (+ _closed_total{reason})
 *   slotgate_legacy_tokens_total{service,status}       200 issued, 503 busy/gated, 404 unknown service
 *   slotgate_legacy_jobs_total{service,status}         slotgate_jobs_total{waitgroup,service,result}
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
      help: 'Running jobs by waitgroup and the priority of their WANT ("legacy": PUT /job of an old fylr)',
      labelNames: ['waitgroup', 'priority'],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const wg of Object.keys(broker.config.waitgroups)) {
          for (const [p, n] of broker.runningByPriority(wg)) this.set({ waitgroup: wg, priority: p }, n);
        }
      },
    });
    new Gauge({
      name: 'slotgate_offered_slots',
      help: 'Slots reserved by an OFFER not yet answered, by waitgroup',
      labelNames: ['waitgroup'],
      registers: [this.registry],
      collect() {
        const st = broker.status();
        for (const [wg, s] of Object.entries(st.waitgroups)) this.set({ waitgroup: wg }, s.offered);
      },
    });
    new Gauge({
      name: 'slotgate_draining',
      help: '1 while the server drains',
      registers: [this.registry],
      collect() {
        this.set(broker.draining ? 1 : 0);
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

  // The per-job hooks use labelled children cached by key: resolving a label object on every
  // call was a visible share of the broker's CPU at 20k jobs/s (bench/README.md).
  readonly #childCache = new Map<string, unknown>();
  #cached<T>(key: string, make: () => T): T {
    let child = this.#childCache.get(key) as T | undefined;
    if (child === undefined) this.#childCache.set(key, (child = make()));
    return child;
  }
  #offer(waitgroup: string, outcome: string): void {
    this.#cached(`offers|${waitgroup}|${outcome}`, () => this.#offers.labels({ waitgroup, outcome })).inc();
  }

  offerMade(waitgroup: string, slotFreeToOfferMs: number | null): void {
    this.#offer(waitgroup, 'made');
    if (slotFreeToOfferMs !== null) {
      this.#cached(`free|${waitgroup}`, () => this.#slotFreeToOffer.labels({ waitgroup })).observe(slotFreeToOfferMs / 1000);
    }
  }
  offerDeclined(waitgroup: string): void {
    this.#offer(waitgroup, 'declined');
  }
  offerExpired(waitgroup: string): void {
    this.#offer(waitgroup, 'expired');
  }
  offerWithdrawn(waitgroup: string): void {
    this.#offer(waitgroup, 'withdrawn');
  }
  jobStarted(waitgroup: string, offerToJobMs: number): void {
    this.#offer(waitgroup, 'accepted');
    this.#cached(`job|${waitgroup}`, () => this.#offerToJob.labels({ waitgroup })).observe(offerToJobMs / 1000);
  }
  jobDone(waitgroup: string, service: string, ok: boolean): void {
    const result = ok ? 'ok' : 'failed';
    this.#cached(`done|${waitgroup}|${service}|${result}`, () => this.#jobs.labels({ waitgroup, service, result })).inc();
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
