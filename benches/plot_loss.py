"""Draws loss curves (CSV files of iter,train_loss,val_loss) as one SVG chart, standard library only.

python benches/plot_loss.py OUT.svg LABEL=FILE.csv [LABEL=FILE.csv ...]
"""
import csv
import sys
from xml.sax.saxutils import escape

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def main(dst, series):
    curves = []
    for label, path in series:
        rows = list(csv.DictReader(open(path)))
        curves.append((label, [(float(r["iter"]), float(r["train_loss"]), float(r["val_loss"])) for r in rows]))
    pts = [p for _, c in curves for p in c]
    if not pts:
        sys.exit("plot_loss.py: no rows")
    x_max = max(p[0] for p in pts)
    y_lo, y_hi = min(min(p[1], p[2]) for p in pts), max(max(p[1], p[2]) for p in pts)
    y_lo, y_hi = y_lo - 0.05 * (y_hi - y_lo), y_hi + 0.05 * (y_hi - y_lo)
    w, h, left, top, bottom = 800, 420, 60, 30, 60
    pw, ph = w - left - 20, h - top - bottom
    X = lambda v: left + pw * v / x_max
    Y = lambda v: top + ph * (1 - (v - y_lo) / (y_hi - y_lo))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">loss by iteration (solid: validation, dashed: train)</text>',
           f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#888"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#888"/>']
    for k in range(6):
        v = y_lo + (y_hi - y_lo) * k / 5
        out.append(f'<text x="{left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        it = x_max * k / 5
        out.append(f'<text x="{X(it):.1f}" y="{top + ph + 16}" text-anchor="middle">{it:.0f}</text>')
    for i, (label, c) in enumerate(curves):
        colour = COLOURS[i % len(COLOURS)]
        for col, dash in ((2, ""), (1, ' stroke-dasharray="4 3"')):
            d = " ".join(f"{X(p[0]):.1f},{Y(p[col]):.1f}" for p in c)
            out.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(f'<rect x="{left + 10 + 200 * i}" y="{h - 22}" width="12" height="10" fill="{colour}"/>'
                   f'<text x="{left + 26 + 200 * i}" y="{h - 13}">{escape(label)}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]])
