"""Draws the step benchmark's headline (benches/step.rs results CSV) as an SVG bar chart.

python benches/plot.py RESULTS.csv CHART.svg [TITLE]

Per model and optimizer, fp32 then bf16: this crate's captured step, PyTorch's best
torch.cuda.graph (capturable or fused optimizer) and torch.compile + graph, in µs per step on a
log scale. Standard library only, so it runs in the venv scripts/setup.sh makes.
"""
import csv
import math
import sys
from xml.sax.saxutils import escape

SERIES = [  # (label, colour, modes whose minimum is the bar)
    ("this crate, fp32", "#1f77b4", ["graph"]),
    ("torch.cuda.graph, fp32", "#aec7e8", ["torch_graph_capturable", "torch_graph_fused"]),
    ("torch.compile + graph, fp32", "#c7c7c7", ["torch_compile_graph"]),
    ("this crate, bf16", "#d62728", ["graph_bf16"]),
    ("torch.cuda.graph, bf16", "#ff9896", ["torch_graph_bf16_capturable", "torch_graph_bf16_fused"]),
    ("torch.compile + graph, bf16", "#8c8c8c", ["torch_compile_graph_bf16"]),
]


def main(src, dst, title):
    rows = list(csv.DictReader(open(src)))
    val = {(r["model"], r["opt"], r["mode"]): float(r["us_per_step"]) for r in rows}
    groups = []
    for r in rows:
        if (r["model"], r["opt"]) not in groups:
            groups.append((r["model"], r["opt"]))
    bars = []  # (group index, series index, value)
    for g, (model, opt) in enumerate(groups):
        for s, (_, _, modes) in enumerate(SERIES):
            found = [val[(model, opt, m)] for m in modes if (model, opt, m) in val]
            if found:
                bars.append((g, s, min(found)))
    if not bars:
        sys.exit(f"plot.py: no rows to draw in {src}")
    lo = 10 ** math.floor(math.log10(min(v for _, _, v in bars)))
    hi = 10 ** math.ceil(math.log10(max(v for _, _, v in bars)))
    width, height, left, top, bottom = 1100, 440, 70, 40, 90
    plot_w, plot_h = width - left - 20, height - top - bottom
    y = lambda v: top + plot_h * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))
    group_w = plot_w / len(groups)
    bar_w = group_w * 0.8 / len(SERIES)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>']
    decade = lo
    while decade <= hi:
        for k in range(1, 10):
            v = decade * k
            if v > hi:
                break
            yy = y(v)
            out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#{"bbb" if k == 1 else "eee"}"/>')
            if k in (1, 2, 5):
                out.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{v:g}</text>')
        decade *= 10
    out.append(f'<text transform="translate(18,{top + plot_h / 2}) rotate(-90)" text-anchor="middle">µs per training step (log scale, lower is better)</text>')
    for g, s, v in bars:
        x = left + g * group_w + group_w * 0.1 + s * bar_w
        out.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bar_w - 1:.1f}" height="{top + plot_h - y(v):.1f}" fill="{SERIES[s][1]}"><title>{escape(SERIES[s][0])}: {v:.1f} µs</title></rect>')
    for g, (model, opt) in enumerate(groups):
        x = left + g * group_w + group_w / 2
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{escape(model)}</text>')
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 30}" text-anchor="middle">{escape(opt)}</text>')
    for s, (label, colour, _) in enumerate(SERIES):
        x = left + (s % 3) * 300
        yy = height - 32 + (s // 3) * 16
        out.append(f'<rect x="{x}" y="{yy - 9}" width="12" height="10" fill="{colour}"/><text x="{x + 16}" y="{yy}">{escape(label)}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "tch-cuda-graphs: training step time")
