/** Plain-text tables for the console: left-aligned first column, the rest right-aligned. */

export function table(title: string, header: string[], rows: string[][]): string {
  const all = [header, ...rows];
  const widths = header.map((_, i) => Math.max(...all.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]): string => r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  return [`\n${title}`, line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

export function ms(v: number): string {
  if (Number.isNaN(v)) return 'n/a';
  return v >= 100 ? `${v.toFixed(0)} ms` : v >= 10 ? `${v.toFixed(1)} ms` : `${v.toFixed(3)} ms`;
}

export function num(v: number | null, digits = 0): string {
  if (v === null || Number.isNaN(v)) return 'n/a';
  if (!Number.isFinite(v)) return '∞';
  return v.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

export function times(v: number): string {
  if (Number.isNaN(v)) return 'n/a';
  if (!Number.isFinite(v)) return '∞ ×';
  return v >= 100 ? `${Math.round(v).toLocaleString('en-US')} ×` : `${v.toFixed(2)} ×`;
}
