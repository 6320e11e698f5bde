"""The PNGs of benchmarks.matmul and benchmarks.tpu, drawn from their reports' JSON.

matplotlib is only in the ``bench`` extra (:func:`pyplot` says so and
returns None where it is missing): the JSON and the markdown are the measurement, the PNG
only draws them. Each contender keeps one colour (``C0``, ``C1``, ... in the order its
benchmark lists them) in every panel.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.cases import PAIRS, Contender, present


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or None (after printing
    how to install it) where matplotlib is missing: it is only in the ``bench`` extra, and
    the PNG only draws what the JSON and the markdown already hold."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]); no PNG written")
        return None
    return plt


def legend_entries(axes: Iterable[Any]) -> tuple[list[Any], list[str]]:
    """The handles and labels of all ``axes``, each label once, in first-seen order: one
    figure legend for panels that each show some of the contenders."""
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    return handles, labels


def matmul_figure(
    report: dict[str, Any], path: Path, contenders: Sequence[Contender]
) -> Path | None:
    """Ratio to the floor against M, one panel per pair; None if matplotlib is missing."""
    label_of = {c.key: c.label for c in contenders}
    color_of = {c.key: f"C{i}" for i, c in enumerate(contenders)}
    plt = pyplot()
    if plt is None:
        return None
    rows = [r for r in report["results"] if r["status"] == "ok" and r.get("ratio")]
    pairs = [p for p in PAIRS if any(r["pair"] == p for r in rows)]
    if not pairs:
        return None
    cols = min(4, len(pairs))
    nrows = math.ceil(len(pairs) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3.4 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, pairs):
        mine = [r for r in rows if r["pair"] == name]
        for key in present(mine, contenders):
            if key == "floor":
                continue
            pts = sorted((r["M"], r["ratio"]) for r in mine if r["contender"] == key)
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                label=label_of[key],
                color=color_of[key],
                lw=2.5 if key == "fast" else 1.2,
                ls=":" if key == "decode" else "-",
            )
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(1.25, color="grey", ls="--", lw=0.8)
        ax.axhline(1.5, color="grey", ls=":", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(PAIRS[name].title)
        ax.set_xlabel("M")
        ax.set_ylabel("time / (a) bf16 pre-decoded")
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(pairs) :]:
        ax.axis("off")
    handles, labels = legend_entries(list(axes.flat)[: len(pairs)])
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize="small")
    env = report["environment"]
    fig.suptitle(
        f"matmul time / bf16 pre-decoded floor (dashed 1.25x, dotted 1.5x); "
        f"{env['device']}, {env['cpu_count']} cores, {env['time'][:10]}",
        fontsize="medium",
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def tpu_figure(report: dict[str, Any], path: Path, contenders: Sequence[Contender]) -> Path | None:
    """Estimate and bytes of each contender over (a), per generation, one column per pair,
    at the first shape measured; None (and a message) if matplotlib is missing."""
    label_of = {c.key: c.label for c in contenders}
    color_of = {c.key: f"C{i}" for i, c in enumerate(contenders)}
    plt = pyplot()
    if plt is None:
        return None
    rows = [r for r in report["results"] if r["status"] == "ok"]
    if not rows:
        return None
    shape = (rows[0]["M"], rows[0]["K"], rows[0]["N"])
    for s in ((64, 4096, 4096),):
        if any((r["M"], r["K"], r["N"]) == s for r in rows):
            shape = s
    rows = [r for r in rows if (r["M"], r["K"], r["N"]) == shape]
    pairs = [p for p in PAIRS if any(r["pair"] == p for r in rows)]
    gens = list(dict.fromkeys(r["generation"] for r in rows))
    metrics = (("estimate_ratio", "estimate / (a)"), ("bytes_ratio", "bytes accessed / (a)"))
    fig, axes = plt.subplots(
        len(metrics), len(pairs), figsize=(3.2 * len(pairs), 3.0 * len(metrics)), squeeze=False
    )
    for col, name in enumerate(pairs):
        for row_i, (key, ylabel) in enumerate(metrics):
            ax = axes[row_i][col]
            for c in present(rows, contenders):
                if c == "floor":
                    continue
                pts = [
                    (gens.index(r["generation"]), r[key])
                    for r in rows
                    if r["pair"] == name and r["contender"] == c and r.get(key) is not None
                ]
                if pts:
                    ax.plot(
                        [p[0] for p in pts],
                        [p[1] for p in pts],
                        marker="o",
                        label=label_of[c],
                        color=color_of[c],
                        lw=2.5 if c == "fast" else 1.2,
                    )
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_yscale("log")
            ax.set_xticks(range(len(gens)))
            ax.set_xticklabels([g.removeprefix("tpu_") for g in gens], fontsize="small")
            if row_i == 0:
                ax.set_title(PAIRS[name].title)
            if col == 0:
                ax.set_ylabel(ylabel)
    handles, labels = legend_entries(axes.flat)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize="small")
    fig.suptitle(
        f"TPU compiler's view, {shape[0]}x{shape[1]}x{shape[2]}, ratio to (a) bf16 "
        f"pre-decoded (log scale; (f): kernel traffic from block shapes, no estimate); "
        f"libtpu {report['libtpu']}",
        fontsize="medium",
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
