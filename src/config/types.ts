/** Configuration shapes (PROTOCOL.md §6), after validation and defaults. */

export interface ListenAddress {
  host: string;
  port: number;
}

export interface CommandConfig {
  /** Absolute path, or a bare name looked up in the minimal PATH. */
  prog: string;
  args: string[];
  /** `KEY=VALUE` strings added to the minimal environment. */
  env: string[];
}

export interface ServiceConfig {
  waitgroup: string;
  /** Names of `commands` entries a job of this service may run. */
  commands: string[];
}

export interface BackendConfig {
  url: string;
  /** Overrides the top-level `waitgroups` for this backend. */
  waitgroups?: Record<string, number>;
}

export interface BrokerConfig {
  offer_timeout_ms: number;
  ping_interval_ms: number;
  max_wants_per_connection: number;
  max_payload_bytes: number;
}

export interface GatewayConfig {
  /** HMAC key shared by gateway replicas, for the tokens handed to old fylrs. */
  secret: string;
  /** Where old fylrs reach this gateway (or its balancer); rewrites `service` URLs. */
  advertised_url: string | null;
  poll_interval_ms: number;
}

export interface ServeConfig {
  listen: ListenAddress;
  name: string;
  waitgroups: Record<string, number>;
  commands: Record<string, CommandConfig>;
  services: Record<string, ServiceConfig>;
  backends: BackendConfig[];
  broker: BrokerConfig;
  gateway: GatewayConfig;
  /** Legacy execserver only: token responses name this instance's own address. */
  tokenResponseSendServerIP: boolean;
  /** Default job timeout when a job names none. */
  default_timeout_sec: number;
}

export interface ExecserverClientConfig {
  addresses: string[];
  connectTimeoutSec: number;
  callbackBackendInternalURL: string | null;
  /** Overrides the pipe URL host read off the broker connection (NAT). */
  callbackBackendOwnURL: string | null;
  /** legacy-fylr only */
  parallel: number;
  /** legacy-fylr only */
  parallelHigh: number;
  /** Re-probe interval of the address pool (covered mark, broker fallback). */
  reprobe_interval_ms: number;
  /** Cap on broker connections per address. */
  max_connections_per_address: number;
}

export interface FylrConfig {
  listen: ListenAddress;
  name: string;
  execserver: ExecserverClientConfig;
  /** null: DATABASE_URL, else an embedded PostgreSQL. */
  database: string | null;
}

export const BROKER_DEFAULTS: BrokerConfig = {
  offer_timeout_ms: 5000,
  ping_interval_ms: 10000,
  max_wants_per_connection: 10000,
  max_payload_bytes: 4 * 1024 * 1024,
};

/** Legacy tokens live 10 s (PROTOCOL.md §5). */
export const LEGACY_TOKEN_TTL_MS = 10_000;
