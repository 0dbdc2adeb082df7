/**
 * The public surface of slotgate: what a fylr integration or an operator's tooling may import.
 * Everything not named here is internal and may change without notice.
 */

// Wire contract
export type * from './protocol/messages.js';
export { PROTOCOL_VERSION, assertNever } from './protocol/messages.js';
export { decode, decodeFromExec, decodeFromFylr, encode, ProtocolError, isProtocolError } from './protocol/codec.js';
export type { JobSpec, JobCommand, JobArg, Receipt, CommandResult } from './protocol/job.js';
export { validateJob, FieldProblem, STDOUT_COMMIT_BYTES } from './protocol/job.js';
export { ERRORS, type ErrorCode, SlotgateError } from './errors.js';

// Time
export { type Clock, systemClock, ManualClock } from './clock.js';

// Configuration
export type { ServeConfig, FylrConfig, ExecserverClientConfig } from './config/types.js';
export { loadServeConfig, parseServeConfig, loadFylrConfig, parseFylrConfig } from './config/load-config.js';
export { ConfigError } from './config/config-error.js';

// Execserver side
export { createExecserver, type Execserver, type ExecserverOptions } from './execserver/server.js';
export { createGateway } from './gateway/gateway.js';
export type { SlotSource, Slot } from './slots/slot-source.js';
export { WantBook, type Want } from './book/want-book.js';

// fylr side
export { ExecClient, type ExecClientOptions } from './fylr/exec-client.js';
export type { AcquireRequest, AcquireResult, SlotLease, RunIo } from './fylr/lease.js';
export { PipeServer } from './fylr/pipe-server.js';
export { startFylr } from './fylr/fylr-process.js';
export { migrateFileQueue } from './db/file-queue-schema.js';
