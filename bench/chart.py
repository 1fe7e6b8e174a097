"""PNG charts of the bench reports: latency per row, XLA vs polyblocks (models.py, ops.py), or
the ratio per row on a log scale (programs.py, too many rows for pairs of bars). Where a row
records each round's median, a bar runs to the best round and its whisker to the worst."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _whiskers(best: list[float], rounds: list[list[float]]) -> np.ndarray | None:
    """Error bars from each bar (the best round) up to the row's worst round."""
    if not any(rounds):
        return None
    return np.array([[0.0] * len(best), [max(r) - b if r else 0.0 for b, r in zip(best, rounds)]])


def plot(report: dict, path: Path) -> None:
    rows = report["rows"]
    labels = [r["op"] if "op" in r else f"{r['model']}\nbatch {r['batch']}" for r in rows]
    xla = [r["xla_ms"] for r in rows]
    pbs = [r["pb_ms"] or 0.0 for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(rows)), 4.5))
    ax.bar(x - 0.2, xla, 0.4, label="XLA CPU", yerr=_whiskers(xla, [r.get("xla_ms_rounds") for r in rows]),
           capsize=2)
    ax.bar(x + 0.2, pbs, 0.4, label="polyblocks", yerr=_whiskers(pbs, [r.get("pb_ms_rounds") for r in rows]),
           capsize=2)
    ran = [v for v in xla + pbs if v > 0]
    log = max(ran) >= 10 * min(ran)  # rows of different sizes: a linear axis would flatten the small ones
    for i, r in enumerate(rows):
        ratio = r.get("speedup", r.get("ratio"))  # models.py names it speedup, ops.py ratio
        note = f"{ratio:.2f}x" if ratio else f"failed\n{r.get('failed_op') or 'error'}"
        ax.annotate(note, (x[i] + 0.2, pbs[i] or min(ran)), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels, fontsize=8)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(0.5 * min(ran), 2.5 * max(ran))
    else:
        ax.set_ylim(0, 1.25 * max(ran))
    ax.set_ylabel("median latency (ms)" + (", log scale" if log else ""))
    size = ("small configs" if report["quick"] else "full configs") + (", training steps" if report.get("train") else "")
    ax.set_title(f"{report['machine']} ({report['cpu']}, {report['cores']} cores), {size}; "
                 "label: XLA time / polyblocks time", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_ratios(report: dict, path: Path) -> None:
    rows = sorted(report["rows"], key=lambda r: r.get("ratio") or 0.0)
    ratios = [r.get("ratio") or 0.0 for r in rows]
    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(7.5, max(4.0, 0.22 * len(rows))))
    colors = ["tab:green" if v >= 1 else ("tab:red" if v else "black") for v in ratios]
    spreads = [[x / p for x, p in zip(r.get("xla_ms_rounds") or [], r.get("pb_ms_rounds") or [])] for r in rows]
    whiskers = np.array([[v - min(s) if s and v else 0.0 for v, s in zip(ratios, spreads)],
                         [max(s) - v if s and v else 0.0 for v, s in zip(ratios, spreads)]])
    ax.barh(y, [v or 1e-3 for v in ratios], color=colors, xerr=whiskers if any(spreads) else None, capsize=2)
    ax.axvline(1.0, color="gray", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(y, [r["op"] + ("" if r.get("ratio") else " (failed)") for r in rows], fontsize=7)
    ax.set_xlabel("XLA time / polyblocks time (> 1: polyblocks faster); whiskers: the rounds' lowest and highest")
    ax.set_title(f"{report['machine']} ({report['cpu']}, {report['cores']} cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
