/**
 * Where the execserver fetches a job's pipes (PROTOCOL.md §2): the fylr replica that owns them,
 * addressed by the LOCAL address of the broker connection that carries the job (what the
 * execserver can route back to), never the shared, load-balanced backend host. An operator
 * behind NAT sets `callbackBackendOwnURL` instead.
 */

/** `127.0.0.1` -> `127.0.0.1`, `::1` -> `[::1]`, `::ffff:10.0.0.5` -> `10.0.0.5`. */
export function hostForUrl(address: string): string {
  const a = address.startsWith('::ffff:') && address.includes('.') ? address.slice('::ffff:'.length) : address;
  // A zone id (fe80::1%eth0) must be percent-encoded inside the brackets (RFC 6874).
  return a.includes(':') ? `[${a.replace('%', '%25')}]` : a;
}

/**
 * The base URL of the pipe endpoints for one broker connection: `ownUrl` when configured, else
 * `http://<connection's local address>:<pipe server port>`. Null when neither is known.
 */
export function pipeBaseUrl(localAddress: string | undefined, port: number | null, ownUrl: string | null): string | null {
  if (ownUrl !== null) return ownUrl.replace(/\/+$/, '');
  if (localAddress === undefined || localAddress === '' || port === null) return null;
  return `http://${hostForUrl(localAddress)}:${port}`;
}
