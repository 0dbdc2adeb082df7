/**
 * The one catalogue of stable error codes. Every code has an HTTP status (what the legacy API or
 * an admin route answers with it), says whether it travels as a broker `ERROR` frame, and a short
 * description. `docs/errors.md` lists the same codes; test/errors.test.ts checks both ways.
 *
 * Codes are part of the wire contract: never rename one, only add.
 */

export interface ErrorSpec {
  /** HTTP status when the code is answered over HTTP. */
  readonly status: number;
  /** Sent as `ERROR {code}` on a broker connection. */
  readonly broker: boolean;
  readonly description: string;
}

export const ERRORS = {
  // Broker frames (PROTOCOL.md §1 rule 5).
  bad_frame: { status: 400, broker: true, description: 'frame is not JSON, not an object, or binary' },
  unknown_type: { status: 400, broker: true, description: 'frame type unknown, or not valid in this direction' },
  invalid_field: { status: 400, broker: true, description: 'a field is missing, of the wrong type or out of bounds' },
  unknown_service: { status: 404, broker: true, description: 'the service is not offered by this server' },
  duplicate_job: { status: 409, broker: true, description: 'job_id already parked, offered or running on this connection' },
  unknown_job: { status: 404, broker: true, description: 'no want, offer or running job with this job_id' },
  no_offer: { status: 409, broker: true, description: 'JOB or DECLINE without a matching live offer and token' },
  draining: { status: 503, broker: true, description: 'the server is draining and accepts no new work' },
  too_many_wants: { status: 429, broker: true, description: 'over max_wants_per_connection' },
  offer_expired: { status: 408, broker: true, description: 'an offer was not answered within offer_timeout_ms; the want ended' },
  too_many_refusals: { status: 429, broker: false, description: 'more than 100 refused frames within 10 s: connection closed with 1008' },
  frame_too_large: { status: 413, broker: false, description: 'frame over max_payload_bytes: connection closed with 1009' },

  // Legacy HTTP API (PROTOCOL.md §5).
  all_workers_busy: { status: 503, broker: false, description: 'no free slot for the service (or broker wants are parked)' },
  token_not_found: { status: 400, broker: false, description: 'unknown, used, expired or forged token, or a token of another service' },
  bad_request: { status: 400, broker: false, description: 'malformed HTTP request (query, path or body)' },
  invalid_job: { status: 400, broker: false, description: 'the job JSON does not match PROTOCOL.md §3' },

  // Job execution (receipt `error.code`).
  command_not_allowed: { status: 400, broker: false, description: 'prog names no command configured for the service' },
  spawn_failed: { status: 500, broker: false, description: 'the configured program could not be started' },
  command_failed: { status: 500, broker: false, description: 'a command exited non-zero or was killed by a signal' },
  timed_out: { status: 504, broker: false, description: 'the job ran over timeout_sec and was stopped' },
  stopped: { status: 499, broker: false, description: 'the job was cancelled (CANCEL, connection close or drain deadline)' },
  file_in_failed: { status: 502, broker: false, description: 'downloading a file_in argument failed' },
  file_out_failed: { status: 502, broker: false, description: 'uploading a file_out argument failed' },
  pipe_in_failed: { status: 502, broker: false, description: 'reading the stdin pipe failed' },
  pipe_out_failed: { status: 502, broker: false, description: 'writing the stdout pipe failed, or it was aborted' },
  backend_failed: { status: 502, broker: false, description: 'a legacy backend failed or vanished mid-job (gateway)' },
  internal: { status: 500, broker: false, description: 'a bug: the server caught an unexpected exception' },

  // Pipes (PROTOCOL.md §2).
  pipe_not_found: { status: 404, broker: false, description: 'no pipe with this id (never existed or expired)' },
  pipe_used: { status: 410, broker: false, description: 'the pipe was already served once' },

  // fylr side.
  no_slot: { status: 503, broker: false, description: 'no slot within connectTimeoutSec: requeue with start_after +1 min' },
  not_found: { status: 404, broker: false, description: 'no such route or item' },

  // Start-up.
  config_invalid: { status: 500, broker: false, description: 'the configuration is invalid; the message names the key' },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERRORS;

export const BROKER_ERROR_CODES = (Object.keys(ERRORS) as ErrorCode[]).filter((c) => ERRORS[c].broker);

export function isErrorCode(value: unknown): value is ErrorCode {
  return typeof value === 'string' && Object.hasOwn(ERRORS, value);
}

/** An error that carries one of the catalogue's codes. */
export class SlotgateError extends Error {
  readonly code: ErrorCode;

  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'SlotgateError';
    this.code = code;
  }

  get status(): number {
    return ERRORS[this.code].status;
  }
}

export function httpStatusOf(code: ErrorCode): number {
  return ERRORS[code].status;
}
