"""Draws benches/step.rs results (CSV) as a grouped bar chart: µs per step, log scale."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = list(csv.DictReader(open(sys.argv[1])))
modes = ["tch_eager", "tch_eager_fused", "graph", "torch_eager", "torch_graph_capturable", "torch_graph_fused"]
labels = {"graph": "this crate: graph", "tch_eager": "tch eager", "tch_eager_fused": "tch eager + fused opt",
          "torch_eager": "PyTorch eager", "torch_graph_capturable": "PyTorch graph (capturable)",
          "torch_graph_fused": "PyTorch graph (fused)"}
groups = []
for r in rows:
    if (r["model"], r["opt"]) not in groups:
        groups.append((r["model"], r["opt"]))
val = {(r["model"], r["opt"], r["mode"]): float(r["us_per_step"]) for r in rows}
fig, ax = plt.subplots(figsize=(14, 5))
w = 0.8 / len(modes)
for i, m in enumerate(modes):
    xs = [g + i * w for g in range(len(groups))]
    ys = [val.get((a, b, m), 0) for a, b in groups]
    ax.bar(xs, ys, w, label=labels[m])
ax.set_xticks([g + 0.4 - w / 2 for g in range(len(groups))])
ax.set_xticklabels([f"{a}\n{b}" for a, b in groups], fontsize=8)
ax.set_yscale("log")
ax.set_ylabel("µs per training step (log)")
ax.set_title(sys.argv[3] if len(sys.argv) > 3 else "tch-cuda-graphs: training step time")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=120)
