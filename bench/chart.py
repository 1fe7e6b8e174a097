"""PNG chart of a bench/models.py or bench/ops.py report: latency per row, XLA vs polyblocks."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot(report: dict, path: Path) -> None:
    rows = report["rows"]
    labels = [r["op"] if "op" in r else f"{r['model']}\nbatch {r['batch']}" for r in rows]
    xla = [r["xla_ms"] for r in rows]
    pbs = [r["pb_ms"] or 0.0 for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows)), 4.5))
    ax.bar(x - 0.2, xla, 0.4, label="XLA CPU")
    ax.bar(x + 0.2, pbs, 0.4, label="polyblocks")
    top = max(xla + pbs)
    for i, r in enumerate(rows):
        ratio = r.get("speedup", r.get("ratio"))  # models.py names it speedup, ops.py ratio
        note = f"{ratio:.2f}x" if ratio else f"failed\n{r.get('failed_op') or 'error'}"
        ax.annotate(note, (x[i] + 0.2, pbs[i] or 0.0), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("median latency (ms)")
    ax.set_ylim(0, 1.25 * top)
    size = "small configs" if report["quick"] else "full configs"
    ax.set_title(f"{report['machine']} ({report['cpu']}, {report['cores']} cores), {size}; "
                 "label: XLA time / polyblocks time", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
