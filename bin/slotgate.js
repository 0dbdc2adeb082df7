#!/usr/bin/env node
// Runs the TypeScript sources directly (tsx), so `npx slotgate` works straight after
// `npm install` on a fresh clone with no build step to forget.
import { register } from 'tsx/esm/api';

register();
await import('../src/cli.ts');
