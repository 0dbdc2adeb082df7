/**
 * Broker frames (PROTOCOL.md §1) as one discriminated union on `type`. Field names are the wire's
 * snake_case. Adding a type here makes the compiler point at every `switch` that must handle it
 * (each ends in `assertNever`).
 */
import type { ErrorCode } from '../errors.js';
import type { JobSpec, Receipt } from './job.js';

export const PROTOCOL_VERSION = 1;

export interface WaitgroupSnapshot {
  processes: number;
  running: number;
  parked: number;
}

export interface HelloMessage {
  type: 'HELLO';
  protocol: number;
  instance_id: string;
  name: string;
  /** service -> waitgroup */
  services: Record<string, string>;
  waitgroups: Record<string, WaitgroupSnapshot>;
  clients: number;
  draining: boolean;
}

export interface WantMessage {
  type: 'WANT';
  job_id: string;
  service: string;
  /** Higher is served first. */
  priority: number;
}

export interface UnwantMessage {
  type: 'UNWANT';
  job_id: string;
}

export interface OfferMessage {
  type: 'OFFER';
  job_id: string;
  token: string;
  expires_ms: number;
}

export interface JobMessage {
  type: 'JOB';
  job_id: string;
  token: string;
  job: JobSpec;
}

export interface DeclineMessage {
  type: 'DECLINE';
  job_id: string;
  token: string;
}

export interface DoneMessage {
  type: 'DONE';
  job_id: string;
  receipt: Receipt;
}

export interface CancelMessage {
  type: 'CANCEL';
  job_id: string;
}

export interface QueryMessage {
  type: 'QUERY';
  job_id: string;
}

export interface PositionMessage {
  type: 'POSITION';
  job_id: string;
  running: number;
  ahead: number;
  capacity: number;
  parked: number;
  eta_ms: number | null;
}

export interface ErrorMessage {
  type: 'ERROR';
  /** One of the catalogue's broker codes when sent by us; any snake_case word when read (a newer peer may know more). */
  code: ErrorCode | (string & {});
  message: string;
  job_id?: string;
}

/** What a fylr sends to an execserver. */
export type FylrMessage = WantMessage | UnwantMessage | JobMessage | DeclineMessage | CancelMessage | QueryMessage;
/** What an execserver (native or gateway) sends to a fylr. */
export type ExecMessage = HelloMessage | OfferMessage | DoneMessage | PositionMessage | ErrorMessage;
export type Message = FylrMessage | ExecMessage;
export type MessageType = Message['type'];

export const FYLR_MESSAGE_TYPES = ['WANT', 'UNWANT', 'JOB', 'DECLINE', 'CANCEL', 'QUERY'] as const satisfies readonly FylrMessage['type'][];
export const EXEC_MESSAGE_TYPES = ['HELLO', 'OFFER', 'DONE', 'POSITION', 'ERROR'] as const satisfies readonly ExecMessage['type'][];

export function assertNever(x: never): never {
  throw new Error(`unreachable: ${JSON.stringify(x)}`);
}
