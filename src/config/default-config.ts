/**
 * The embedded default of `slotgate serve` with no --config: a few harmless services so a new
 * user sees a working server at once. Every program is a coreutils tool reading stdin or args.
 */
export const DEFAULT_SERVE_CONFIG_YAML = `
listen: 127.0.0.1:8083
name: slotgate-demo
waitgroups: {fast: 4, slow: 2}
commands:
  cat: {prog: cat, args: [], env: []}
  sha256: {prog: sha256sum, args: [], env: []}
  sleep: {prog: sleep, args: [], env: []}
  echo: {prog: echo, args: [], env: []}
services:
  cat: {waitgroup: fast, commands: [cat]}
  sha256: {waitgroup: fast, commands: [sha256]}
  echo: {waitgroup: fast, commands: [echo]}
  sleep: {waitgroup: slow, commands: [sleep]}
`;
