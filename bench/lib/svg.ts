/**
 * A tiny SVG bar-chart generator, no dependencies: grouped bars, linear or log10 y axis, one
 * colour per series, value labels on the bars. Panels are stacked into one document.
 *
 * Log scale: the axis spans whole decades around the data; a value of 0 (which a log axis cannot
 * show) is drawn as a stub on the baseline labelled "0"; NaN (not measured) as "n/a".
 */

export interface Series {
  name: string;
  color: string;
}

export interface BarGroup {
  label: string;
  /** One value per series, in series order; NaN where there is none. */
  values: number[];
}

export interface Panel {
  title: string;
  unit: string;
  log: boolean;
  series: Series[];
  groups: BarGroup[];
}

const W = 900;
const PANEL_H = 300;
const M = { left: 70, right: 20, top: 46, bottom: 56 };

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

export function fmtValue(v: number): string {
  if (Number.isNaN(v)) return 'n/a';
  if (v === 0) return '0';
  if (!Number.isFinite(v)) return '∞';
  const a = Math.abs(v);
  if (a >= 1e6) return `${(v / 1e6).toFixed(a >= 1e7 ? 0 : 1)}M`;
  if (a >= 1e4) return `${(v / 1e3).toFixed(0)}k`;
  if (a >= 1000) return `${(v / 1e3).toFixed(1)}k`;
  if (a >= 100) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 1) return v.toFixed(2);
  return v.toPrecision(2);
}

function panel(p: Panel, y0: number): string {
  const plotW = W - M.left - M.right;
  const plotH = PANEL_H - M.top - M.bottom;
  const vals = p.groups.flatMap((g) => g.values).filter((v) => Number.isFinite(v) && (!p.log || v > 0));
  let lo: number;
  let hi: number;
  if (p.log) {
    lo = vals.length ? 10 ** Math.floor(Math.log10(Math.min(...vals))) : 1;
    hi = vals.length ? 10 ** Math.ceil(Math.log10(Math.max(...vals))) : 10;
    if (hi <= lo) hi = lo * 10;
  } else {
    lo = 0;
    hi = vals.length ? Math.max(...vals) * 1.1 : 1;
    if (hi <= 0) hi = 1;
  }
  const y = (v: number): number => {
    const f = p.log ? (Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo)) : (v - lo) / (hi - lo);
    return y0 + M.top + plotH * (1 - Math.max(0, Math.min(1, f)));
  };
  const base = y0 + M.top + plotH;
  const out: string[] = [];
  out.push(`<text x="${M.left}" y="${y0 + 22}" font-size="15" font-weight="bold">${esc(p.title)}</text>`);
  // Ticks.
  const ticks: number[] = [];
  if (p.log) for (let t = lo; t <= hi * 1.0001; t *= 10) ticks.push(t);
  else for (let i = 0; i <= 5; i++) ticks.push(lo + ((hi - lo) * i) / 5);
  for (const t of ticks) {
    const ty = y(t);
    out.push(`<line x1="${M.left}" x2="${W - M.right}" y1="${ty.toFixed(1)}" y2="${ty.toFixed(1)}" stroke="#ddd"/>`);
    out.push(`<text x="${M.left - 6}" y="${(ty + 4).toFixed(1)}" font-size="11" text-anchor="end">${esc(fmtValue(t))}</text>`);
  }
  out.push(`<text x="14" y="${(y0 + M.top + plotH / 2).toFixed(1)}" font-size="11" transform="rotate(-90 14 ${(y0 + M.top + plotH / 2).toFixed(1)})" text-anchor="middle">${esc(p.unit)}${p.log ? ' (log)' : ''}</text>`);
  out.push(`<line x1="${M.left}" x2="${W - M.right}" y1="${base}" y2="${base}" stroke="#333"/>`);
  // Bars.
  const gw = plotW / Math.max(1, p.groups.length);
  const bw = Math.min(40, (gw * 0.8) / Math.max(1, p.series.length));
  p.groups.forEach((g, gi) => {
    const gx = M.left + gi * gw + (gw - bw * p.series.length) / 2;
    g.values.forEach((v, si) => {
      const x = gx + si * bw;
      const color = p.series[si]?.color ?? '#888';
      let top: number;
      if (Number.isNaN(v)) top = base;
      else if (v <= 0 && p.log) top = base - 2;
      else top = Number.isFinite(v) ? y(v) : y0 + M.top;
      out.push(`<rect x="${x.toFixed(1)}" y="${top.toFixed(1)}" width="${(bw - 2).toFixed(1)}" height="${Math.max(0, base - top).toFixed(1)}" fill="${color}"><title>${esc(`${p.series[si]?.name}, ${g.label}: ${fmtValue(v)} ${p.unit}`)}</title></rect>`);
      out.push(`<text x="${(x + bw / 2 - 1).toFixed(1)}" y="${(top - 3).toFixed(1)}" font-size="10" text-anchor="middle">${esc(fmtValue(v))}</text>`);
    });
    out.push(`<text x="${(M.left + gi * gw + gw / 2).toFixed(1)}" y="${base + 16}" font-size="11" text-anchor="middle">${esc(g.label)}</text>`);
  });
  // Legend.
  let lx = M.left;
  for (const s of p.series) {
    out.push(`<rect x="${lx}" y="${base + 28}" width="12" height="12" fill="${s.color}"/>`);
    out.push(`<text x="${lx + 16}" y="${base + 38}" font-size="11">${esc(s.name)}</text>`);
    lx += 24 + s.name.length * 6.5;
  }
  return out.join('\n');
}

export function renderSvg(title: string, subtitle: string, panels: Panel[]): string {
  const head = 50;
  const h = head + panels.length * PANEL_H;
  const body = panels.map((p, i) => panel(p, head + i * PANEL_H)).join('\n');
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${h}" viewBox="0 0 ${W} ${h}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="${M.left}" y="24" font-size="17" font-weight="bold">${esc(title)}</text>
<text x="${M.left}" y="42" font-size="11" fill="#555">${esc(subtitle)}</text>
${body}
</svg>
`;
}
