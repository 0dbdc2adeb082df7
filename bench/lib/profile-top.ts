/**
 * Prints the top frames of a V8 .cpuprofile (node --cpu-prof) by self time, and by inclusive time
 * for frames in this repository: what goes into bench/README.md instead of the profile itself.
 *
 *   node --import tsx bench/lib/profile-top.ts FILE.cpuprofile [N]
 */
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
  children?: number[];
}

interface Profile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples?: number[];
}

export interface FrameTime {
  frame: string;
  selfPct: number;
  totalPct: number;
}

function label(n: ProfileNode): string {
  const f = n.callFrame;
  const file = f.url.replace(/^file:\/\//, '').replace(/^.*\/work\/main\//, '').replace(/^.*node_modules\//, 'node_modules/');
  return `${f.functionName || '(anonymous)'} ${file ? `${file}:${f.lineNumber + 1}` : ''}`.trim();
}

export function topFrames(path: string, n = 15): { self: FrameTime[]; ours: FrameTime[]; idlePct: number } {
  const p = JSON.parse(readFileSync(path, 'utf8')) as Profile;
  const byId = new Map(p.nodes.map((x) => [x.id, x]));
  const parent = new Map<number, number>();
  for (const x of p.nodes) for (const c of x.children ?? []) parent.set(c, x.id);
  const total = p.nodes.reduce((a, x) => a + (x.hitCount ?? 0), 0) || 1;
  const self = new Map<string, number>();
  const incl = new Map<string, number>();
  let idle = 0;
  for (const x of p.nodes) {
    const hits = x.hitCount ?? 0;
    if (hits === 0) continue;
    const l = label(x);
    if (x.callFrame.functionName === '(idle)') idle += hits;
    self.set(l, (self.get(l) ?? 0) + hits);
    // Inclusive: every distinct frame on the path to the root.
    const seen = new Set<string>();
    for (let id: number | undefined = x.id; id !== undefined; id = parent.get(id)) {
      const k = label(byId.get(id) as ProfileNode);
      if (seen.has(k)) continue;
      seen.add(k);
      incl.set(k, (incl.get(k) ?? 0) + hits);
    }
  }
  const pct = (h: number): number => (100 * h) / total;
  const rows = [...self.entries()].map(([frame, h]) => ({ frame, selfPct: pct(h), totalPct: pct(incl.get(frame) ?? h) }));
  rows.sort((a, b) => b.selfPct - a.selfPct);
  const ours = [...incl.entries()]
    .filter(([k]) => /\b(src|bench|legacy)\//.test(k) && !k.includes('node_modules'))
    .map(([frame, h]) => ({ frame, selfPct: pct(self.get(frame) ?? 0), totalPct: pct(h) }))
    .sort((a, b) => b.totalPct - a.totalPct);
  return { self: rows.slice(0, n), ours: ours.slice(0, n), idlePct: pct(idle) };
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const file = process.argv[2];
  if (!file) {
    console.error('usage: profile-top.ts FILE.cpuprofile [N]');
    process.exit(64);
  }
  const t = topFrames(file, Number(process.argv[3] ?? 15));
  console.log(`idle ${t.idlePct.toFixed(1)} %\n\nself time:`);
  for (const r of t.self) console.log(`  ${r.selfPct.toFixed(1).padStart(5)} %  ${r.frame}`);
  console.log('\ninclusive, our code:');
  for (const r of t.ours) console.log(`  ${r.totalPct.toFixed(1).padStart(5)} %  (self ${r.selfPct.toFixed(1)} %)  ${r.frame}`);
}
