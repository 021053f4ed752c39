"""Draws loss curves (CSV files of iter,train_loss,val_loss[,val_se]) as one SVG chart, standard
library only, and prints the final validation loss of each series.

A series is LABEL=FILE.csv, or LABEL=A.csv,B.csv,... for runs of several seeds: its curve is the
mean over the runs, with a band of one standard deviation either side, and the summary gives each
run's final validation loss, their mean, standard deviation and standard error, the mean of the
evaluations' own standard errors (val_se), and each series' mean against the first series'.

python benches/plot_loss.py OUT.svg LABEL=FILE.csv[,FILE.csv...] [LABEL=...]
"""
import csv
import math
import sys
from xml.sax.saxutils import escape

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def mean_std(xs):
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0)


def load(paths):
    """Runs of one series -> [(iter, train mean, val mean, val std)] over the iterations all share,
    and the runs' rows."""
    runs = [list(csv.DictReader(open(p))) for p in paths]
    iters = sorted(set.intersection(*({float(r["iter"]) for r in run} for run in runs)))
    curve = []
    for it in iters:
        rows = [next(r for r in run if float(r["iter"]) == it) for run in runs]
        tr, _ = mean_std([float(r["train_loss"]) for r in rows])
        va, sd = mean_std([float(r["val_loss"]) for r in rows])
        curve.append((it, tr, va, sd))
    return curve, runs


def summary(series):
    """Prints the final validation losses; returns nothing."""
    base = None
    for label, _, runs in series:
        finals = [float(run[-1]["val_loss"]) for run in runs]
        ses = [float(run[-1]["val_se"]) for run in runs if run[-1].get("val_se")]
        m, sd = mean_std(finals)
        se = sd / math.sqrt(len(finals))
        line = (f"{label}: final val loss {' '.join(f'{f:.4f}' for f in finals)}; mean {m:.4f}, std {sd:.4f}, "
                f"standard error {se:.4f}")
        if ses:
            line += f"; evaluation noise (mean standard error of one evaluation) {sum(ses) / len(ses):.4f}"
        if base is None:
            base = (m, se)
        else:
            diff, se_diff = m - base[0], math.sqrt(se ** 2 + base[1] ** 2)
            line += (f"; against {series[0][0]}: {diff:+.4f} ({diff / base[0] * 100:+.2f}%), standard error of the "
                     f"difference {se_diff:.4f}")
        print(line)


def draw(dst, series):
    pts = [p for _, c, _ in series for p in c]
    if not pts:
        sys.exit("plot_loss.py: no rows")
    x_max = max(p[0] for p in pts)
    y_lo = min(min(p[1], p[2] - p[3]) for p in pts)
    y_hi = max(max(p[1], p[2] + p[3]) for p in pts)
    y_lo, y_hi = y_lo - 0.05 * (y_hi - y_lo), y_hi + 0.05 * (y_hi - y_lo)
    w, h, left, top, bottom = 800, 420, 60, 30, 60
    pw, ph = w - left - 20, h - top - bottom
    X = lambda v: left + pw * v / x_max
    Y = lambda v: top + ph * (1 - (v - y_lo) / (y_hi - y_lo))
    title = "loss by iteration (solid: validation, mean over seeds with a band of ±1 std; dashed: train)"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#888"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#888"/>']
    for k in range(6):
        v = y_lo + (y_hi - y_lo) * k / 5
        out.append(f'<text x="{left - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
        it = x_max * k / 5
        out.append(f'<text x="{X(it):.1f}" y="{top + ph + 16}" text-anchor="middle">{it:.0f}</text>')
    for i, (label, c, runs) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        if len(runs) > 1:
            band = [f"{X(p[0]):.1f},{Y(p[2] + p[3]):.1f}" for p in c] + \
                   [f"{X(p[0]):.1f},{Y(p[2] - p[3]):.1f}" for p in reversed(c)]
            out.append(f'<polygon points="{" ".join(band)}" fill="{colour}" fill-opacity="0.2" stroke="none"/>')
        for col, dash in ((2, ""), (1, ' stroke-dasharray="4 3"')):
            d = " ".join(f"{X(p[0]):.1f},{Y(p[col]):.1f}" for p in c)
            out.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        name = label if len(runs) == 1 else f"{label} ({len(runs)} seeds)"
        out.append(f'<rect x="{left + 10 + 240 * i}" y="{h - 22}" width="12" height="10" fill="{colour}"/>'
                   f'<text x="{left + 26 + 240 * i}" y="{h - 13}">{escape(name)}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


def main(dst, specs):
    series = []
    for label, files in specs:
        curve, runs = load(files.split(","))
        series.append((label, curve, runs))
    draw(dst, series)
    summary(series)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]])
